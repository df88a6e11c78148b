"""Settings validate once, and round-trip through dicts and URL query parameters."""

import pytest

from memorymark.settings import Costs, Settings


def test_defaults_are_the_issue_defaults():
    s = Settings()
    assert (s.model, s.seq_len, s.image_size, s.current_batch, s.step) == ("bert", 128, 224, 16, 8)
    assert s.resolved_task == "sequence-classification"
    assert Settings(model="gpt2").resolved_task == "causal-lm"


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
        ({"strategy": "binary"}, "strategy must be one of fast, linear"),
    ],
)
def test_bad_values_raise_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        Settings(**kwargs)
    assert "\n" not in str(info.value)


def test_inference_style_protocol_is_eval_logits_mean_no_optimizer():
    s = Settings().with_protocol("inference-style")
    assert (s.mode, s.loss, s.optimizer, s.protocol) == (
        "eval",
        "logits-mean",
        "none",
        "inference-style",
    )
    assert s.with_protocol("full").protocol == "full"


def test_dict_round_trip_and_unknown_keys():
    s = Settings(model="gpt2", seq_len=256, gpu="h100", forward_only=True)
    assert Settings.from_dict(s.to_dict()) == s
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
    assert Settings.from_query({"forward_only": "true", "ignored": "x"}).forward_only
