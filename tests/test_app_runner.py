"""The sweep jobs the app runs: probes streamed back, cancel, the device lock, the result cache.

These run each job on a thread of the test process (`thread_service`) with a fake engine
Session, so every step is deterministic; tests/test_jobs.py runs real worker processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from app_helpers import GATE_SECONDS, FakeWaysOut

from memorymark import gpus, limits
from memorymark.measurement import Measurement
from memorymark.report import Report
from memorymark.service import jobs
from memorymark.service.executors import thread_service
from memorymark.service.jobs import SweepJob, SweepRequest
from memorymark.settings import Costs, Settings
from memorymark.ui import sweep_runner
from memorymark.ui.sweep_runner import ResultCache, sweep_progress
from memorymark.ways_out import Fix

A10 = gpus.find_gpu("A10")
SIM = Settings(model="tiny-bert", gpu="A10", backend="sim")
REAL = Settings(model="tiny-bert", gpu="A10", backend="cpu")  # real kernels: takes the lock


def m(batch: int, fits: bool = True) -> Measurement:
    return Measurement(batch_size=batch, fits=fits, peak_bytes=batch * 2**20, backend="sim",
                       measured=False, timeline=(1, batch))  # fmt: skip


class FakeSession:
    """Stands in for memorymark.engine.Session; `before_probe(batch)` runs before each yield."""

    before_probe: Callable[[int], None] = staticmethod(lambda batch: None)
    on_report: Callable[[], None] = staticmethod(lambda: None)
    stages: tuple[str, ...] = ()
    """What the report says it checks after the last probe (Session.report's on_stage)."""
    batches = (8, 16, 64, 72)
    fits_below = 72
    stopped_by = None
    fixes: tuple[Fix, ...] = ()
    """The ways out found when nothing fits, one stage each (FakeWaysOut)."""
    fixes_gate: threading.Event | None = None

    def __init__(self, settings: Settings) -> None:
        self.settings, self.gpu, self.measurements = settings, A10, []
        self.backend_name = (
            "sim" if settings.hardware.backend == "auto" else settings.hardware.backend
        )
        self.runs_for_real = self.backend_name != "sim"

    def stream(self) -> Iterator[Measurement]:
        for batch in self.batches:
            type(self).before_probe(batch)
            self.measurements.append(m(batch, fits=batch < type(self).fits_below))
            yield self.measurements[-1]

    @property
    def needs_ways_out(self) -> bool:
        return self.stopped_by is None and not any(x.fits for x in self.measurements)

    def ways_out(self) -> FakeWaysOut:
        if not hasattr(self, "_ways_out"):
            self._ways_out = FakeWaysOut(type(self).fixes, type(self).fixes_gate)
        return self._ways_out

    def report(self, costs: Costs | None = None, *, on_stage=None) -> Report:
        for text in type(self).stages:
            on_stage(text)
        type(self).on_report()
        return Report(settings=self.settings, costs=costs or Costs(), gpu=A10, backend="sim",
                      measurements=tuple(self.measurements), elapsed_seconds=0.0)  # fmt: skip


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> type[FakeSession]:
    class Fake(FakeSession):
        pass

    monkeypatch.setattr(jobs, "Session", Fake)
    monkeypatch.setattr(jobs, "lock_path", lambda backend: tmp_path / f"{backend}.lock")
    return Fake


def run(settings: Settings = SIM, *, inline: bool = True) -> SweepJob:
    job = thread_service(inline=inline).submit(SweepRequest(settings))
    if inline:
        job.poll()
    return job


def wait_for(job: SweepJob, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
        job.poll()


def test_a_job_records_every_probe_and_ends_done_with_a_slim_report(fake) -> None:
    j = run()
    assert j.state == "done" and not j.running
    assert [x.batch_size for x in j.measurements] == [8, 16, 64, 72]
    assert len(j.probe_seconds) == 4
    assert j.report.optimal.batch_size == 64
    assert all(x.timeline == () for x in j.report.measurements)  # the cache keeps no timelines
    assert all(x.timeline == () for x in j.measurements)  # nor does what crosses processes


def test_the_worker_says_fixing_before_the_report_simulates_the_ways_out(fake, gate) -> None:
    fake.batches, fake.fits_below = (8, 4, 2, 1), 0
    seen: list[str] = []
    fake.on_report = staticmethod(lambda: gate.wait(GATE_SECONDS))
    j = run(inline=False)
    wait_for(j, lambda: j.state == "fixing")
    seen.append(j.state)
    gate.set()
    wait_for(j, lambda: not j.running)
    assert seen == ["fixing"] and j.state == "done"


def test_the_worker_says_what_the_report_checks_after_the_last_probe(fake, gate) -> None:
    # A plan with accumulation or an eval batch search builds the model again after the last
    # probe: ~28 s of a Llama-3.1-8B QLoRA analysis that the page showed as nothing.
    fake.stages = ("checking the plan for a global batch of 64",)
    fake.on_report = staticmethod(lambda: gate.wait(GATE_SECONDS))
    j = run(inline=False)
    wait_for(j, lambda: j.state == "reporting")
    assert j.running and j.stage == "checking the plan for a global batch of 64"
    assert len(j.measurements) == 4  # every probe is in: only the report is left
    gate.set()
    wait_for(j, lambda: not j.running)
    assert j.state == "done"


def test_a_failure_becomes_one_line_and_the_state_failed(fake) -> None:
    def boom(batch: int) -> None:
        raise RuntimeError("could not build the model\nTraceback (most recent call last): ...")

    fake.before_probe = staticmethod(boom)
    j = run()
    assert (j.state, j.error) == ("failed", "could not build the model")
    assert j.report is None


def test_cancel_shows_at_once_and_keeps_what_was_measured(fake, gate) -> None:
    fake.before_probe = staticmethod(lambda batch: gate.wait(GATE_SECONDS) if batch == 64 else None)
    j = run(inline=False)
    wait_for(j, lambda: len(j.measurements) == 2)
    j.cancel()
    assert j.state == "cancelled" and not j.running  # no wait for the probe in flight
    assert [x.batch_size for x in j.measurements] == [8, 16]
    gate.set()
    j.future.result(30)  # the thread stops at its next probe
    j.poll()
    assert j.state == "cancelled" and j.report is None


def test_real_device_sweeps_wait_for_the_device_lock(fake, tmp_path: Path) -> None:
    import fcntl

    with open(tmp_path / "cpu.lock", "a+b") as held:  # another job measures on the device
        fcntl.flock(held, fcntl.LOCK_EX)
        j = run(REAL, inline=False)
        wait_for(j, lambda: j.state == "waiting")
        time.sleep(0.3)
        j.poll()
        assert j.measurements == [] and j.state == "waiting"
    wait_for(j, lambda: j.state == "done")


def test_cancel_while_waiting_for_the_device_gives_up_the_turn(fake, tmp_path: Path) -> None:
    import fcntl

    with open(tmp_path / "cpu.lock", "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        j = run(REAL, inline=False)
        wait_for(j, lambda: j.state == "waiting")
        j.cancel()
        assert j.future.result(30).cancelled  # the worker left the queue for the lock
    assert j.state == "cancelled" and j.measurements == []


def test_simulated_sweeps_run_side_by_side(fake) -> None:
    both = threading.Barrier(2, timeout=30)  # passes only if two sweeps are mid-probe at once
    fake.before_probe = staticmethod(lambda batch: both.wait() if batch == 8 else None)
    service = thread_service()
    pair = [service.submit(SweepRequest(SIM)) for _ in range(2)]
    for j in pair:
        wait_for(j, lambda j=j: not j.running)
    assert [j.state for j in pair] == ["done", "done"]


def test_result_cache_keeps_the_most_recently_used() -> None:
    cache = ResultCache(size=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)


def test_progress_grows_as_the_bracket_narrows() -> None:
    assert sweep_progress([], 8) == 0.0
    assert sweep_progress([m(8), m(16)], 8) == pytest.approx(0.4)
    wide = sweep_progress([m(8), m(16), m(64), m(128, False)], 8)
    narrow = sweep_progress([m(8), m(16), m(64), m(128, False), m(96), m(104, False)], 8)
    assert 0.6 <= wide < narrow <= 0.95


def test_one_line_keeps_the_first_line_of_a_message() -> None:
    assert limits.one_line(ValueError("bad\nmore")) == "bad"
    assert limits.one_line(KeyError()) == "KeyError"
    long = ValueError("x" * 300)
    assert limits.one_line(long) == "x" * 300  # our own refusals end naming the choices
    assert limits.one_line(long, limits.MAX_ERROR_CHARS) == "x" * 199 + "…"


def test_a_job_whose_session_ended_is_cancelled_and_a_finished_one_cached(
    fake, monkeypatch, gate
) -> None:
    cache = ResultCache()
    monkeypatch.setattr(sweep_runner, "result_cache", lambda: cache)
    monkeypatch.setattr(sweep_runner, "SESSION_GRACE_SECONDS", 0.0)
    monkeypatch.setattr(sweep_runner, "_session_alive", lambda session_id: session_id != "gone")
    fake.before_probe = staticmethod(lambda batch: gate.wait(GATE_SECONDS) if batch == 16 else None)
    poller = sweep_runner.Poller()
    orphan, kept = run(inline=False), run(inline=False)
    poller.add(orphan, "gone")  # its tab was closed
    poller.add(kept, "open")
    wait_for(orphan, lambda: orphan.state == "cancelled")
    assert kept.running
    gate.set()
    wait_for(kept, lambda: kept.state == "done")
    deadline = time.monotonic() + 5
    while cache.get(SIM) is None and time.monotonic() < deadline:  # the poller files it
        time.sleep(0.05)
    assert cache.get(SIM) is kept.report
    assert cache.get(("sweep", sweep_runner.sweep_key(SIM))) is kept.report


def test_the_poller_files_a_job_in_the_cache_it_started_beside(fake, monkeypatch, gate) -> None:
    started_beside, current = ResultCache(), ResultCache()
    monkeypatch.setattr(sweep_runner, "result_cache", lambda: started_beside)
    fake.before_probe = staticmethod(lambda batch: gate.wait(GATE_SECONDS) if batch == 16 else None)
    poller, job = sweep_runner.Poller(), run(inline=False)
    poller.add(job, None)
    monkeypatch.setattr(sweep_runner, "result_cache", lambda: current)  # e.g. the next test's
    gate.set()
    wait_for(job, lambda: started_beside.get(SIM) is not None)
    assert started_beside.get(SIM) is job.report and current.get(SIM) is None


def test_a_probe_that_outruns_the_time_limit_ends_the_job_with_what_it_measured(
    fake, monkeypatch, gate
) -> None:
    monkeypatch.setattr(jobs, "TIME_LIMIT_GRACE_SECONDS", 0.0)
    fake.before_probe = staticmethod(lambda batch: gate.wait(GATE_SECONDS) if batch == 64 else None)
    settings = Settings(model="tiny-bert", gpu="A10", backend="sim", time_limit_seconds=1)
    j = run(settings, inline=False)
    wait_for(j, lambda: not j.running)
    gate.set()
    assert j.state == "done" and [x.batch_size for x in j.measurements] == [8, 16]
    assert j.report.stopped_by == "the time limit (1 s), in the middle of a probe"
    assert "batch 16 fits" in j.report.partial_note


def _ways_out(settings: Settings) -> tuple[Fix, ...]:
    """Three ways out on the A10, the first two too big, the last (checkpointing) fitting."""
    limit = A10.usable_bytes // 2
    return tuple(
        Fix(
            label=label,
            settings=settings,
            gpu=A10,
            peak_bytes=need,
            required_bytes=need,
            limit_bytes=limit,
        )  # fmt: skip
        for label, need in (
            ("LoRA rank 16", 2 * limit),
            ("8-bit AdamW", 3 * limit),
            ("gradient checkpointing", limit // 2),
        )  # fmt: skip
    )


def test_each_way_out_arrives_the_moment_it_is_found(fake, gate) -> None:
    fake.batches, fake.fits_below = (8, 4, 2, 1), 0
    fake.fixes, fake.fixes_gate = _ways_out(SIM), gate
    j = run(inline=False)
    wait_for(j, lambda: len(j.fixes) == 1)
    # The first is on the page while the others are still searched, and what is left is named.
    assert j.state == "fixing" and j.running
    assert [f.label for f in j.fixes] == ["LoRA rank 16"]
    assert j.fixes_not_finished == ("8-bit AdamW", "gradient checkpointing")
    gate.set()
    wait_for(j, lambda: not j.running)
    assert [f.label for f in j.fixes] == ["LoRA rank 16", "8-bit AdamW", "gradient checkpointing"]
    assert j.state == "done" and j.report.stopped_by is None


def test_the_sweep_s_time_limit_does_not_cut_the_ways_out_short(fake, monkeypatch, gate) -> None:
    # Llama-3.1-70B on an A10: its probes took a minute of a 300 s limit, then the ways out ran
    # into it and the page said the sweep stopped "in the middle of a probe".
    monkeypatch.setattr(jobs, "TIME_LIMIT_GRACE_SECONDS", 0.0)
    fake.batches, fake.fits_below = (8, 4, 2, 1), 0
    fake.fixes, fake.fixes_gate = _ways_out(SIM), gate
    settings = Settings(model="tiny-bert", gpu="A10", backend="sim", time_limit_seconds=1,
                        ways_out_time_limit_seconds=60)  # fmt: skip
    j = run(settings, inline=False)
    wait_for(j, lambda: len(j.fixes) == 1)
    time.sleep(1.5)  # past the sweep's limit, within the ways out's own
    j.poll()
    assert j.running and j.state == "fixing"
    gate.set()
    wait_for(j, lambda: not j.running)
    assert j.state == "done" and len(j.report.fixes) == 0  # the fake report's own (none)
    assert len(j.fixes) == 3 and j.report.stopped_by is None


def test_a_way_out_stuck_past_its_own_limit_ends_the_job_with_those_found(
    fake, monkeypatch, gate
) -> None:
    monkeypatch.setattr(jobs, "TIME_LIMIT_GRACE_SECONDS", 0.0)
    fake.batches, fake.fits_below = (8, 4, 2, 1), 0
    fake.fixes, fake.fixes_gate = _ways_out(SIM), gate
    settings = Settings(model="tiny-bert", gpu="A10", backend="sim",
                        ways_out_time_limit_seconds=1)  # fmt: skip
    j = run(settings, inline=False)
    wait_for(j, lambda: not j.running)
    gate.set()
    report = j.report
    assert j.state == "done" and [x.batch_size for x in report.measurements] == [8, 4, 2, 1]
    # The sweep finished: nothing says it stopped; the ways out say what they found and not.
    assert report.stopped_by is None and report.partial_note is None
    assert [f.label for f in report.fixes] == ["LoRA rank 16"]
    assert report.fixes_stopped_by == "the time limit (1 s), in the middle of a step"
    assert report.fixes_not_finished == ("8-bit AdamW", "gradient checkpointing")
    assert report.ways_out_note == (
        "The sweep finished (no batch fits); the search for ways out then stopped at the time "
        "limit (1 s), in the middle of a step, after finding 1 way out (listed). Not finished: "
        "8-bit AdamW, gradient checkpointing."
    )
    assert "probe" not in report.ways_out_note
