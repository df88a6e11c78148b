"""Hostile numbers in settings, costs and links: refused in one line that names the ceiling."""

import re

import pytest

from memorymark import limits
from memorymark.settings import Costs, Settings, parse_margin


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": "t5-small", "seq_len": 10**9}, r"seq_len must be at most 1,048,576 \(8x"),
        ({"model": "resnet", "image_size": 10**6}, r"image_size must be at most 8,192 \("),
        ({"max_batch": 10**12}, r"max_batch must be at most 1,048,576 \(256x"),
        ({"target_batch": 10**12}, "target_batch must be at most 1,048,576"),
        ({"lora_rank": 10**9}, r"lora_rank must be at most 65,536 \(4x"),
        ({"grad_accum": 10**9}, "grad_accum must be at most 64 .past 2 micro-batches"),
        ({"gpu_memory_gib": float("nan")}, "gpu_memory_gib must be a finite number"),
        ({"gpu_memory_gib": float("inf")}, "gpu_memory_gib must be a finite number"),
        ({"gpu_memory_gib": 1e9}, "gpu_memory_gib must be at most 2,048"),
        ({"seq_len": -(10**400)}, "seq_len must be at least 1 .got a 401-digit number"),
        ({"max_grad_norm": 10**400}, "max_grad_norm must be a positive number"),
        ({"seq_len": "128"}, "seq_len must be a int .got '128'"),
        ({"model": ["bert"]}, "model must be a str"),
        ({"grad_checkpointing": "yes"}, "grad_checkpointing must be a bool"),
        ({"lora_targets": "q," * 5000}, "lora_targets must be at most 4096 characters"),
        ({"margin": "1e400GiB"}, "margin must be a percentage below 50 .* got '1e400GiB'"),
        ({"margin": "1e308GiB"}, "margin must be"),
        ({"margin": "nan%"}, "margin must be"),
        ({"margin": "3000GiB"}, "or a size up to 2048 GiB"),
    ],
)
def test_a_settings_value_past_its_ceiling_is_one_line(fields, message):
    with pytest.raises(ValueError, match=message) as info:
        Settings(**fields)
    assert "\n" not in str(info.value) and len(str(info.value)) < 200


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"usd_per_hour": "nan"}, "usd_per_hour must be a finite number"),
        ({"usd_per_hour": "1e400"}, "usd_per_hour must be a finite number"),
        ({"hours_per_run": "inf"}, "hours_per_run must be a finite number"),
        ({"hours_per_run": "1e308"}, r"hours_per_run must be at most 8,784 \(a leap year\)"),
        ({"runs_per_year": "-1"}, "runs_per_year must be at least 0"),
        ({"runs_per_year": "1e6"}, "runs_per_year must be at most 100,000"),
    ],
)
def test_costs_from_a_link_refuse_nan_inf_and_absurd_sizes(params, message):
    with pytest.raises(ValueError, match=message):
        Costs.from_query(params)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"seq_len": "1e9"}, "bad value for seq_len: '1e9'"),
        ({"seq_len": "9" * 5000}, r"bad value for seq_len: '9999.*\.\.\.$"),
        ({"model": "t5-small", "seq_len": "1000000000"}, "seq_len must be at most"),
        ({"gpu_memory_gib": "nan"}, "gpu_memory_gib must be a finite number"),
        ({"margin": "1e400GiB"}, "margin must be"),
        ({"max_grad_norm": "1e400"}, "max_grad_norm must be a positive number"),
    ],
)
def test_settings_from_a_link_refuse_in_one_short_line(params, message):
    with pytest.raises(ValueError, match=message) as info:
        Settings.from_query(params)
    assert len(str(info.value)) < 200


def test_a_margin_at_its_ceiling_is_accepted_and_past_it_refused():
    assert parse_margin("2048GiB", 10) == 2048 * 2**30
    with pytest.raises(ValueError, match="margin must be"):
        parse_margin("2049GiB", 10)


def test_a_ceiling_itself_is_accepted():
    s = Settings(model="t5-small", seq_len=limits.MAX_SEQ_LEN, max_batch=limits.MAX_BATCH)
    assert (s.workload.seq_len, s.search.max_batch) == (2**20, 2**20)
    assert Costs(usd_per_hour=1000.0, hours_per_run=8784.0).hours_per_run == 8784.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["measure", "bert", "--batch-size", "1e9"], "--batch-size: not a whole number: '1e9'"),
        (
            ["measure", "bert", "--batch-size", "9" * 5000],
            r"not a whole number: '999.*\.\.\. \(see",
        ),
        (
            ["measure", "bert", "--batch-size", str(2**40)],
            "--batch-size: must be at most 1,048,576",
        ),
        (["measure", "bert", "--batch-size", "1", "--seq-len", "1e9"], "not a whole number"),
        (["analyze", "bert", "--price", "abc"], "--price: not a number: 'abc'"),
        (["analyze", "bert", "--price", "nan"], "usd_per_hour must be a finite number"),
        (["analyze", "bert", "--runs-per-year", "1e400"], "runs_per_year must be a finite"),
        (["analyze", "bert", "--grad-accum", "100000"], "grad_accum must be at most 64"),
        (["calibrate", "--batch-sizes", "4", str(10**12)], "must be at most 1,048,576"),
    ],
)
def test_cli_numbers_are_refused_in_one_short_line_with_status_2(argv, message, capsys):
    from memorymark.cli import parser

    try:
        status = parser.main(argv)
    except SystemExit as done:  # argparse's refusals exit from inside main
        status = done.code
    assert status == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and len(err) < 250
    assert re.search(message, err)
