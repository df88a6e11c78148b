"""After the sweep's last probe the report may run more steps (the plan's micro-batches with
accumulation, the eval batch search, the ways out): each says what it does first, so neither
the page's progress bar nor the terminal sits silent (a Llama-3.1-8B QLoRA analysis with a
global batch waited ~28 s after its last probe with nothing shown)."""

from __future__ import annotations

import pytest

from memorymark import Session, Settings
from memorymark.cli.parser import main

# Tiny BERT on a 1 GiB GPU: the optimal batch (1152) is below 4096, so a global batch of 4096
# is planned with accumulation, which measures steps after the sweep.
TINY = Settings(
    model="tiny-bert", seq_len=128, gpu_memory_gib=1.0, max_batch=4096, target_batch=4096
)


def test_the_report_says_it_checks_the_plan_before_measuring_it() -> None:
    session = Session(TINY)
    for _ in session.stream():
        pass
    heard: list[str] = []
    report = session.report(on_stage=heard.append)
    assert report.plan_probes, "the plan measured steps with accumulation"
    assert heard == [
        "checking the plan for a global batch of 4096: micro-batches with gradient "
        "accumulation, a training step each"
    ]
    heard.clear()
    session.report(on_stage=heard.append)  # the plan is known now: nothing runs, nothing said
    assert heard == []


def test_the_report_says_it_searches_the_eval_batch() -> None:
    session = Session(Settings(model="tiny-bert", seq_len=32, gpu="a10", max_batch=16,
                               eval_batch=8))  # fmt: skip
    for _ in session.stream():
        pass
    heard: list[str] = []
    session.report(on_stage=heard.append)
    assert heard == ["searching the largest eval batch beside training batch 16"]


def test_the_cli_prints_each_stage_between_the_probes_and_the_report(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["analyze", *TINY.to_command_line().split()[2:], "--no-save"]) == 0
    out = capsys.readouterr().out.splitlines()
    stage = next(i for i, line in enumerate(out) if line.startswith("  ... checking the plan"))
    assert "batch" in out[stage - 1]  # right after the last probe line
    assert any("for a global batch of 4096" in line for line in out[stage + 1 :])
