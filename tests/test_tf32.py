"""TF32: PyTorch leaves it off for fp32 matmuls, so fp32 ranks GPUs by their plain FP32 rate;
`tf32=True` (the CLI's --tf32, the sidebar's TF32 matmuls) estimates a script that turns it on,
in the engine, the Compare GPUs page and `memorymark compare`."""

from __future__ import annotations

import json

import pytest

from memorymark import Session, Settings, gpus
from memorymark.cli.parser import build_parser, main, settings_from_args
from memorymark.ui import compare_view

A10, A100 = gpus.find_gpu("A10"), gpus.find_gpu("A100 80GB")
TINY = {"model": "tiny-gpt2", "seq_len": 64, "max_batch": 64, "gpu": "a10"}


def speeds(**settings: object) -> dict[str, float]:
    rows, _ = Session(Settings(**TINY, **settings)).compare(catalog=(A10, A100))
    return {r.gpu.name: r.relative_speed for r in rows}


def test_tf32_speeds_up_fp32_matmuls_where_the_gpu_has_tf32() -> None:
    # fp32 by default: the A100's 19.5 TFLOP/s FP32 against the A10's 31.2. With TF32 on, its
    # 156 against the A10's 62.5: the A100 gains more than the A10 does.
    off, on = speeds(), speeds(tf32=True)
    assert on["A100 80GB"] > off["A100 80GB"]
    assert on["A100 80GB"] / off["A100 80GB"] > on["A10"] / off["A10"]


def test_the_page_table_names_the_matmul_rate_and_the_note_cites_pytorchs_default() -> None:
    rows, _ = Session(Settings(**TINY)).compare(catalog=(A10, A100))
    table = compare_view.table(rows, Settings(**TINY))
    assert [r["TFLOP/s"] for r in table] == [31.2, 19.5]
    assert set(table[0]) == set(compare_view.COLUMN_HELP)
    tf32 = Settings(**TINY, tf32=True)
    assert [r["TFLOP/s"] for r in compare_view.table(rows, tf32)] == [62.5, 156.0]
    note = compare_view.tf32_note(Settings(**TINY))
    assert note is not None and "allow_tf32 = False" in note and "since 1.12" in note
    assert "TF32 matmuls are on" in (compare_view.tf32_note(tf32) or "")
    assert compare_view.tf32_note(Settings(**TINY, precision="bf16-mixed")) is None


def test_compare_on_the_command_line_takes_tf32(monkeypatch, capsys) -> None:
    args = build_parser().parse_args(["compare", "bert", "--tf32", "--hours-per-run", "3"])
    assert settings_from_args(args).workload.tf32 and args.hours_per_run == 3
    monkeypatch.setattr(gpus, "CATALOG", (A10, A100))
    argv = ["compare", "tiny-gpt2", "--seq-len", "64", "--max-batch", "64", "--tf32"]
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["gpu"], r["peak_tflops"]) for r in rows] == [("A10", 62.5), ("A100 80GB", 156.0)]
    assert rows[1]["max_batch"] == 64 and rows[1]["relative_speed"] > 0
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "A100 80GB" in out and "TFLOP/s: TF32" in out


@pytest.mark.parametrize("flag", [[], ["--tf32"]])
def test_analyze_takes_tf32_too(flag: list[str]) -> None:
    args = build_parser().parse_args(["analyze", "bert", *flag])
    assert settings_from_args(args).workload.tf32 is bool(flag)
