"""Settings validate once, and round-trip through dicts and URL query parameters."""

import json

import pytest

from memorymark.settings import FIELD_NAMES, Costs, Hardware, Search, Settings, Workload

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)


def test_defaults_are_the_issue_defaults():
    s = Settings()
    assert (
        s.workload.model,
        s.workload.seq_len,
        s.workload.image_size,
        s.search.current_batch,
        s.search.step,
    ) == ("bert", 128, 224, 16, 8)
    assert s.workload.resolved_task == "sequence-classification"
    assert Settings(model="gpt2").workload.resolved_task == "causal-lm"
    assert s.search.depth == "replay"  # a deep simulated model replays its depth (issue 31)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "bret"}, "unknown model 'bret'; did you mean 'bert'"),
        ({"task": "causal-lm"}, "model 'bert' supports tasks sequence-classification"),
        ({"seq_len": 0}, "seq_len must be at least 1"),
        ({"seq_len": 513}, "seq_len 513 exceeds bert's 512 positions"),
        (
            {"optimizer": "adam"},
            "optimizer must be one of adamw, adamw-fused, adamw-forloop, sgd, sgd-forloop, "
            "adafactor, adamw-8bit, paged-adamw-8bit, paged-adamw-32bit, lion-8bit, none",
        ),
        ({"current_batch": 0}, "current_batch must be at least 1"),
        ({"strategy": "binary"}, "strategy must be one of symbolic, fast, linear"),
        ({"depth": "deep"}, "depth must be one of replay, trace"),
    ],
)
def test_bad_values_raise_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        Settings(**kwargs)
    assert "\n" not in str(info.value)


def test_inference_style_protocol_is_eval_logits_mean_no_optimizer():
    s = Settings().with_protocol("inference-style")
    assert (s.workload.mode, s.workload.loss, s.workload.optimizer, s.workload.protocol) == (
        "eval",
        "logits-mean",
        "none",
        "inference-style",
    )
    assert s.with_protocol("full").workload.protocol == "full"


def test_dict_round_trip_and_unknown_keys():
    s = Settings(model="gpt2", seq_len=256, gpu="h100", forward_only=True, depth="trace")
    assert s.to_dict()["depth"] == "trace"
    assert Settings.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    with pytest.raises(ValueError, match="unknown setting 'colour'"):
        Settings.from_dict({"colour": "red"})


def test_query_round_trip_keeps_only_what_differs():
    s = Settings(model="resnet", image_size=160, gpu="T4", gpu_memory_gib=None, max_batch=512)
    query = s.to_query()
    assert query == {"model": "resnet", "image_size": "160", "gpu": "T4", "max_batch": "512"}
    assert Settings.from_query(query) == s
    costs = Costs(usd_per_hour=1.25, runs_per_year=12)
    assert Costs.from_query(costs.to_query()) == costs


def test_bad_query_values_name_the_field():
    with pytest.raises(ValueError, match="bad value for seq_len: 'many'"):
        Settings.from_query({"seq_len": "many"})
    assert Settings.from_query({"forward_only": "true", "ignored": "x"}).workload.forward_only


# Non-default values for every setting, valid together within each dict. A new field must be
# added here, so its CLI flag and URL parameter are proven to round-trip.
EVERY_FIELD_CHANGED = (
    {
        "model": "gpt2",
        "task": "sequence-classification",
        "seq_len": 512,
        "image_size": 160,
        "optimizer": "adamw-fused",
        "mode": "eval",
        "loss": "logits-mean",
        "precision": "bf16-mixed",
        "attention": "eager",
        "checkpointing": "selective-op",
        "lora_rank": 8,
        "lora_targets": "c_attn",
        "quantization": "nf4",
        "double_quant": True,
        "grad_accum": 4,
        "max_grad_norm": 0.5,
        "eval_batch": 64,
        "eval_accumulation": 4,
        "forward_only": True,
        "gpu": "h100",
        "gpu_memory_gib": 12.5,
        "backend": "sim",
        "strategy": "linear",
        "depth": "trace",
        "step": 4,
        "current_batch": 32,
        "max_batch": 512,
        "target_batch": 1024,
        "margin": "1GiB",
        "time_limit_seconds": 600.0,
        "max_probes": 12,
        "ways_out_time_limit_seconds": 120.0,
    },
    {
        "model": "llama-3.1-8b",
        "precision": "bf16-true",
        "attention": "flash_attention_2",
        "kernels": "liger",
        "find": "seq-len",
        "seq_step": 512,
    },
    {"model": "gpt2", "loss_chunks": 4, "tf32": True, "checkpointing": "layers:3"},
    {
        "model": "gpt2",
        "compile": True,
        "activation_memory_budget": 0.5,
        "float8": "rowwise",
        "gpu": "h100",
    },
    {"dist": "hsdp", "gpus": "16", "nodes": 2, "offload": "cpu", "mp_policy": "none"},
    {
        "dist": "fsdp",
        "gpus": "64",
        "tp": 2,
        "cp": 2,
        "pp": 2,
        "microbatches": 8,
        "pp_schedule": "interleaved-1f1b",
        "virtual_stages": 2,
    },
)


@pytest.mark.parametrize("changed", EVERY_FIELD_CHANGED)
def test_every_field_round_trips_through_the_url_and_the_command_line(changed):
    import shlex

    from memorymark.cli import parser

    assert set().union(*EVERY_FIELD_CHANGED) == set(FIELD_NAMES)
    s = Settings(**changed)
    assert s.to_query().keys() == changed.keys()
    assert Settings.from_query(s.to_query()) == s
    argv = shlex.split(s.to_command_line())[1:]
    assert parser.settings_from_args(parser.build_parser().parse_args(argv)) == s


def test_settings_are_sections_that_validate_themselves():
    s = Settings(model="gpt2", gpu="a10", step=4)
    assert s.workload == Workload(model="gpt2")
    assert (s.hardware, s.search) == (Hardware(gpu="a10"), Search(step=4))
    assert Settings(workload=Workload(model="gpt2"), hardware=Hardware(gpu="a10"), step=4) == s
    # Flat names override the sections they belong to, and read back from them.
    assert Settings(search=Search(step=4), step=2).search.step == 2 == Settings(step=2).search.step
    assert s.replace(precision="bf16-true").workload.precision == "bf16-true"
    with pytest.raises(ValueError, match="step must be at least 1"):
        Search(step=0)
    with pytest.raises(ValueError, match="backend must be one of auto, cuda"):
        Hardware(backend="tpu")
    with pytest.raises(ValueError, match="hardware must be a Hardware"):
        Settings(hardware=Search())
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        Settings(colour="red")


def test_settings_survive_pickling_for_worker_processes():
    import pickle

    s = Settings(model="gpt2", gpu="a10", margin="1GiB")
    assert pickle.loads(pickle.dumps(s)) == s
    assert hash(pickle.loads(pickle.dumps(s))) == hash(s)


def test_a_setting_has_one_spelling_in_code_its_sections() -> None:
    s = Settings(model="gpt2", precision="bf16-mixed", gpus="1", margin="1GiB")
    assert (s.workload.model, s.workload.precision, s.hardware.gpus, s.search.margin) == (
        "gpt2",
        "bf16-mixed",
        "1",
        "1GiB",
    )
    # The flat names are the form of the flat interfaces (flags, links, JSON), not attributes.
    assert [name for name in FIELD_NAMES if hasattr(s, name)] == []
    assert s.to_dict()["precision"] == "bf16-mixed"


def test_replace_changes_what_it_names_by_flat_name_or_section() -> None:
    s = Settings(model="gpt2", gpu="a10", max_batch=64)
    changed = s.replace(precision="bf16-mixed", gpus="2", dist="ddp")
    assert (changed.workload.precision, changed.hardware.gpu_count, changed.hardware.gpu) == (
        "bf16-mixed",
        2,
        "a10",
    )
    assert changed.search == s.search and s.workload.precision == "32-true"  # s is unchanged
    assert s.replace(search=Search(max_batch=8)).search.max_batch == 8
    with pytest.raises(TypeError, match="unexpected keyword argument 'precison'"):
        s.replace(precison="bf16-mixed")
    with pytest.raises(ValueError, match="precision must be one of"):
        s.replace(precision="fp8")
