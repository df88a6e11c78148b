"""The depth replay: a deep model's step read off the same model built with a few blocks equals
the step traced in full, event for event and byte for byte (memorymark/accounting/depth.py,
memorymark/backends/depth_replay.py, memorymark/models/depth.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memorymark import Session, Settings
from memorymark.accounting.depth import difference, numbered_afresh
from memorymark.backends import depth_replay
from memorymark.models import CONFIG_DIR
from memorymark.models.depth import LayerPlan, layer_plan, with_layers

# Config files from tmp_path: the app, once a test imported it, limits them to its uploads.
pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.usefixtures("any_config_path"),
]

# The figures a report reads off a step: a replay must give every one as the trace does.
COMPARED = ("peak_bytes", "required_bytes", "demand_bytes", "predicted_allocated_bytes",
            "predicted_reserved_bytes", "loop_reserved_bytes", "predicted_retries", "breakdown",
            "timeline", "step_flops", "samples_per_second", "fits", "runs", "error",
            "quantized_weight_bytes")  # fmt: skip

TINY_T5 = {"model_type": "t5", "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 8,
           "num_decoder_layers": 8, "num_heads": 4, "vocab_size": 512,
           "relative_attention_num_buckets": 8, "decoder_start_token_id": 0,
           "pad_token_id": 0, "eos_token_id": 1}  # fmt: skip
TINY_GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 32, "intermediate_size": 64,
               "num_hidden_layers": 13, "num_attention_heads": 2, "num_key_value_heads": 1,
               "head_dim": 16, "vocab_size": 512, "sliding_window": 16,
               "sliding_window_pattern": 2, "max_position_embeddings": 512}  # fmt: skip
TINY_QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 64,
                  "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2,
                  "decoder_sparse_step": 1, "mlp_only_layers": [0], "num_hidden_layers": 10,
                  "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                  "vocab_size": 512, "max_position_embeddings": 512}  # fmt: skip


@pytest.fixture
def any_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replay models shallower than a replay pays for (it does past 14 blocks), so a full
    trace to compare with stays quick."""
    monkeypatch.setattr(LayerPlan, "worth_replaying", lambda self: self.layers > self.depths()[-1])


def _config(tmp_path: Path, name: str | dict[str, Any], **changes: Any) -> str:
    """A `file:` model: a shipped tiny config, or a dict, with `changes`."""
    data = json.loads((CONFIG_DIR / name).read_text()) if isinstance(name, str) else dict(name)
    data = {k: v for k, v in data.items() if not k.startswith("_")} | changes
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return f"file:{path}"


def _both(model: str, batches: tuple[int, ...] = (2,), **settings: Any) -> list[tuple[Any, ...]]:
    """For each batch: (replayed measurement, its record, traced measurement, its record, the
    replayed backend's summary), each backend measuring the batches in order."""
    runs = {}
    for depth in ("replay", "trace"):
        s = Settings(model=model, gpu="a10", backend="sim", seq_len=32, depth=depth, **settings)
        backend = Session(s).open_backend()
        backend.keep_records()
        with backend.session():
            runs[depth] = [(backend.measure(b), backend.last_record) for b in batches]
            summary = backend.depth_replay
        runs[depth + " summary"] = summary
    return [
        (*replayed, *traced, runs["replay summary"])
        for replayed, traced in zip(runs["replay"], runs["trace"], strict=True)
    ]


def _assert_same(model: str, batches: tuple[int, ...] = (2,), **settings: Any) -> None:
    for replayed, record, traced, traced_record, summary in _both(model, batches, **settings):
        assert summary.fallback is None, summary.fallback
        assert summary.traced_depths and summary.replayed_steps == len(batches)
        assert difference(record, traced_record) is None
        for name in COMPARED:
            assert getattr(replayed, name) == getattr(traced, name), name


CASES = {
    "bert": ("tiny-bert.json", {"num_hidden_layers": 8}, {}),
    "gpt2": ("tiny-gpt2.json", {"n_layer": 8}, {}),
    "llama-lora-checkpointing": (
        "tiny-llama.json",
        {"num_hidden_layers": 8},
        {"lora_rank": 8, "grad_checkpointing": True, "precision": "bf16-mixed"},
    ),
    "llama-selective-op": (
        "tiny-llama.json",
        {"num_hidden_layers": 8},
        {"checkpointing": "selective-op"},
    ),
    # Every second block checkpointed: a period of 2 blocks.
    "llama-layers-2": ("tiny-llama.json", {"num_hidden_layers": 10}, {"checkpointing": "layers:2"}),
    # Every third, blocks 2, 5, 8, ...: the shallower builds keep that phase (4, 7, 10, 13 blocks).
    "llama-layers-3": ("tiny-llama.json", {"num_hidden_layers": 16}, {"checkpointing": "layers:3"}),
    "llama-qlora": (
        "tiny-llama.json",
        {"num_hidden_layers": 8},
        {"quantization": "nf4", "lora_rank": 8, "precision": "bf16-mixed"},
    ),
    "gemma3-pattern": (TINY_GEMMA3, {}, {}),
    "qwen3-moe-dense-first": (TINY_QWEN3_MOE, {}, {"precision": "bf16-true"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.usefixtures("any_depth")
def test_a_replayed_depth_is_the_traced_one(tmp_path: Path, case: str) -> None:
    name, changes, settings = CASES[case]
    _assert_same(_config(tmp_path, name, **changes), **settings)


@pytest.mark.usefixtures("any_depth")
def test_t5_is_traced_in_full_saying_where_its_replay_breaks(tmp_path: Path) -> None:
    # T5's two stacks replay but for one free of the backward's last copy, which lands one
    # allocation further than an affine rule puts it: the check at 5 blocks catches it, and
    # the answer is the full trace's.
    model = _config(tmp_path, "t5-small.json", num_layers=8, num_decoder_layers=8)
    ((replayed, _, traced, _, summary),) = _both(model)
    assert summary.fallback.startswith("the step at 5 blocks differs from its replay")
    for name in COMPARED:
        assert getattr(replayed, name) == getattr(traced, name), name


@pytest.mark.usefixtures("any_depth")
def test_fsdp_replays_its_first_step_and_a_later_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FSDP's first step runs operators no later one does: each has its structure. The second
    # step's search for one starts from the two steps its fit was tried on.
    model = _config(tmp_path, "tiny-llama.json", num_hidden_layers=8)
    _assert_same(model, (2, 4, 3), dist="fsdp", gpus="4", precision="bf16-mixed")
    monkeypatch.setattr(depth_replay, "_STRUCTURES", {})  # none found yet in this process
    runs = _both(model, (1, 2), dist="fsdp", gpus="4", precision="bf16-mixed")
    for replayed, record, traced, traced_record, _ in runs:
        assert difference(record, traced_record) is None
        assert replayed.required_bytes == traced.required_bytes
    summary = runs[-1][-1]
    # Batch 1 at 2, 3, 4 and 5 blocks (first steps); batch 2, a second step, at 3 and 4 (the
    # first step's structure does not hold there), then at 2 and 5 only: the steps at 3 and 4
    # are not traced again, nor are 2 and 5 stepped more than the others.
    assert summary.fallback is None and summary.traced_steps == 4 + 2 + 2


def test_layer_patterns_are_read_from_the_config() -> None:
    assert layer_plan(TINY_GEMMA3) == LayerPlan(("num_hidden_layers",), 13, period=2)
    assert layer_plan(TINY_QWEN3_MOE) == LayerPlan(("num_hidden_layers",), 10, prefix=1)
    assert layer_plan(TINY_T5).keys == ("num_layers", "num_decoder_layers")
    assert LayerPlan(("n",), 13, period=2).depths() == (3, 5, 7, 9)
    assert LayerPlan(("n",), 80).depths() == (2, 3, 4, 5)
    shallower = with_layers(TINY_QWEN3_MOE, layer_plan(TINY_QWEN3_MOE), 4)
    assert shallower["num_hidden_layers"] == 4 and shallower["mlp_only_layers"] == [0]
    assert "no layer count" in layer_plan({"model_type": "resnet"})
    assert "differ in depth" in layer_plan(dict(TINY_T5, num_decoder_layers=6))


def test_checkpointing_every_k_blocks_sets_the_period_and_its_phase() -> None:
    from memorymark.step.checkpointing import checkpointed_block

    llama = {"num_hidden_layers": 16}
    assert layer_plan(llama, checkpoint_every=2) == LayerPlan(("num_hidden_layers",), 16, period=2)
    assert layer_plan(llama, checkpoint_every=3).depths() == (4, 7, 10, 13)
    # With Gemma 3's pattern of 2, layers:3 repeats every 6 blocks.
    assert layer_plan(TINY_GEMMA3, checkpoint_every=3).period == 6
    assert layer_plan(llama, checkpoint_every=1) == layer_plan(llama)  # full: every block
    # The plan's phase is the step's: blocks 2, 5, 8, ... under layers:3, as torchtitan counts.
    assert [i for i in range(9) if checkpointed_block(i, 3)] == [2, 5, 8]


def test_a_shallow_model_is_traced_in_full(tmp_path: Path) -> None:
    s = Settings(model="tiny-gpt2", gpu="a10", backend="sim", seq_len=32)
    backend = Session(s).open_backend()
    with backend.session():
        backend.measure(2)
    assert backend.depth_replay is None and "too few to gain" in backend.depth_why
    resnet = Session(s.replace(model="tiny-resnet", seq_len=128)).open_backend()
    assert resnet.depth_replay is None and "no layer count" in resnet.depth_why
    assert not LayerPlan(("n",), 12).worth_replaying() and LayerPlan(("n",), 14).worth_replaying()
    assert Session(s.replace(depth="trace")).open_backend().depth_replay is None


@pytest.mark.usefixtures("any_depth")
def test_a_replay_that_disagrees_falls_back_to_the_full_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memorymark.backends import depth_replay

    # A fourth depth whose step is not what the first three say: the check must catch it.
    monkeypatch.setattr(
        depth_replay.DepthStep, "disagreement", lambda self, depth, traced: "forced"
    )
    model = _config(tmp_path, "tiny-llama.json", num_hidden_layers=8)
    ((replayed, _, traced, _, summary),) = _both(model)
    assert summary.fallback == "the step at 5 blocks differs from its replay: forced"
    assert summary.traced_depths == () and summary.replayed_steps == 0
    assert replayed.required_bytes == traced.required_bytes
    assert "the full model traced (8 blocks, simulated): the step at 5" in summary.says()


def test_numbered_afresh_drops_what_steps_before_took() -> None:
    from memorymark.accounting.symbolic import StepRecord
    from memorymark.measurement import Category

    record = StepRecord(
        events_first_seq=50,
        events=[8, ~50, ~1, ~20, 4],
        baseline_events=(0, [16, 16, 32]),
        timeline=[8],
        categories=[(8,) + (0,) * (len(Category) - 1)],
        start_categories=(0,) * len(Category),
        work=None,
    )
    fresh = numbered_afresh(record)
    assert fresh.events_first_seq == 4  # after setting up's 3, and the one number for others
    assert fresh.events == [8, ~4, ~1, ~3, 4]
    assert fresh.baseline_events == record.baseline_events


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.usefixtures("any_depth")
def test_states_counted_at_two_depths_are_the_whole_model_s(tmp_path: Path, case: str) -> None:
    from memorymark.backends import states

    name, changes, extra = CASES[case]
    settings = Settings(model=_config(tmp_path, name, **changes), gpu="a10", **extra)
    assert states._layer_plan(settings) is not None
    assert states.counted_states(settings) == states._counted(settings, None)
