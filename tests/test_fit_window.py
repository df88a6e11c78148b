"""A fragmentation window: batches that fit with the margin free above batches that do not.

The Lightning demo Transformer on an A10 (issue 29, 4.8) replayed 1104-1120 over the margin and
1128-1416 within it. The answer stays below the window (the one fit rule's `best_fit`), and
every form of the report says the window is there. A fake backend whose needs are a known
function of the batch drives the linear strategy, as the strategies' own tests do.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

import memorymark as mm
from memorymark import gpus
from memorymark.cli import render
from memorymark.fit import FitPolicy
from memorymark.measurement import Measurement
from memorymark.report import Report
from memorymark.reporting.exports import markdown
from memorymark.reporting.json_form import report_to_dict
from memorymark.search.strategies import LinearStrategy
from memorymark.search.sweep import sweep
from memorymark.settings import Costs, Settings

A10 = gpus.find_gpu("a10")
POLICY = FitPolicy.on(Settings(gpu="a10"), A10)  # the A10's usable memory, a 2% margin
PER_SAMPLE = POLICY.limit_bytes // 190  # batch 190 needs the whole limit


class WindowBackend:
    """Needs PER_SAMPLE bytes a sample, except 104-120, which need just past the margin's limit
    (112 only after a cache flush): the pattern the Lightning demo's replays showed."""

    def __init__(self) -> None:
        self.tried: list[int] = []

    def measure(self, batch_size: int) -> Measurement:
        self.tried.append(batch_size)
        need, retries = PER_SAMPLE * batch_size, 0
        if 104 <= batch_size <= 120:
            need = POLICY.limit_bytes + 1
            retries = 1 if batch_size == 112 else 0
        verdict = POLICY.judge(oom=False, alloc_retries=retries, reserved_bytes=need)
        return Measurement(
            batch_size=batch_size,
            fits=verdict.fits,
            runs=verdict.runs,
            peak_bytes=need,
            required_bytes=need,
            alloc_retries=retries,
            backend="fake",
            measured=False,
        )

    def release(self) -> None:
        pass


def window_report() -> tuple[Report, list[int]]:
    backend = WindowBackend()
    strategy = LinearStrategy(
        step=8,
        max_batch=4096,
        capacity_bytes=POLICY.capacity_bytes,
        limit_bytes=POLICY.limit_bytes,
    )
    measurements = tuple(sweep(backend, strategy))
    report = Report(
        settings=Settings(gpu="a10", strategy="linear"),
        costs=Costs(),
        gpu=A10,
        backend="sim",
        measurements=measurements,
        elapsed_seconds=1.0,
    )
    return report, backend.tried


def test_the_linear_sweep_walks_through_the_window_and_the_answer_stays_below_it():
    report, tried = window_report()
    # Linear stops at the first batch that does not run: the window's batches run.
    last_running = POLICY.capacity_bytes // PER_SAMPLE // 8 * 8
    assert tried == list(range(8, last_running + 9, 8))
    assert report.optimal.batch_size == 96  # below the first batch that does not fit
    window = report.fit_window
    assert (window.first_failing, window.last_failing) == (104, 120)
    assert (window.fits_from, window.fits_to) == (128, 184)
    assert window.why == (
        "needs a cache flush (an allocation retry) or leaves less than the margin free"
    )


def test_every_form_of_the_report_states_the_window(capsys):
    report, _ = window_report()
    sentence = (
        "Batches 128-184 also fit with the margin free, above a window (batches 104-120) that "
        "needs a cache flush (an allocation retry) or leaves less than the margin free; the "
        "answer stays below the window"
    )
    assert sentence in report.verdict()
    assert report.verdict().startswith("Batch 16 uses")
    data = report_to_dict(report)
    assert sentence in data["verdict"]
    assert data["fit_window"] == {
        "window": [104, 120],
        "fits_above": [128, 184],
        "why": "needs a cache flush (an allocation retry) or leaves less than the margin free",
    }
    assert sentence in markdown(report)
    render.print_report(report, data)
    assert sentence in capsys.readouterr().out


def test_monotone_verdicts_have_no_window():
    def m(batch: int, fits: bool) -> Measurement:
        return Measurement(batch_size=batch, fits=fits, runs=True, peak_bytes=batch,
                           backend="fake", measured=False)  # fmt: skip

    report = Report(
        settings=Settings(gpu="a10"),
        costs=Costs(),
        gpu=A10,
        backend="sim",
        measurements=(m(8, True), m(16, True), m(24, False), m(32, False)),
        elapsed_seconds=1.0,
    )
    assert report.fit_window is None and report_to_dict(report)["fit_window"] is None
    assert "window" not in report.verdict()


@pytest.mark.usefixtures("fresh_caches")
def test_the_apps_verdict_states_the_window(fake):
    from app_helpers import app

    fake.batches = (8, 16, 96, 104, 128, 184, 200)
    probe = fake._probe

    def windowed(self, batch: int) -> Measurement:
        found = probe(self, batch)
        if batch != 104:
            return found
        return replace(found, fits=False, runs=True, error="leaves less than the margin free")

    fake._probe = windowed
    at = app(model="tiny-bert")
    at.button(key="analyze").click().run()
    assert not at.exception
    (verdict,) = [box.value for box in at.success]
    assert verdict.startswith("Batch 16 uses")
    assert "batch 96 trains" in verdict
    assert (
        "Batches 128-184 also fit with the margin free, above a window (batch 104) that leaves "
        "less than the margin free; the answer stays below the window" in verdict
    )


class LazyTable(nn.Module):
    """Builds a 4 MB table in its first forward and keeps it, as the Lightning demo's
    PositionalEncoding does (`_init_pos_encoding`)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(16, 16)
        self.table: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.table is None:
            self.table = torch.zeros(1000, 1000, device=x.device)  # 4,000,000 bytes
        return self.body(x) + self.table[0, :16]


def test_every_simulated_probe_of_user_code_runs_a_fresh_processs_first_step():
    def step(model, batch, optimizer):
        model(batch).square().mean().backward()
        optimizer.step()

    job = mm.Training(model=LazyTable, batch=lambda n: torch.randn(n, 16), step=step,
                      optimizer=lambda p: torch.optim.SGD(p, lr=0.1))  # fmt: skip
    session = mm.Session(mm.Settings(gpu="a10"), training=job)
    first = session.measure(64)  # a backend of its own: its first probe
    with session.open_backend().session() as backend:
        backend.measure(8)
        later = backend.measure(64)
    # The table is built inside each probe's step, as in a fresh process: its 20 MiB segment
    # (a 4 MB request is served from a 20 MiB one) is in every probe's reserved bytes.
    assert later.required_bytes == first.required_bytes >= 20 * 2**20
    assert later.peak_bytes == first.peak_bytes
