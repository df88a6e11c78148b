"""The sweep runner: a worker thread per sweep, cancel, the real-device lock, the result cache."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from memorymark import gpus
from memorymark.measurement import Measurement
from memorymark.report import Report
from memorymark.settings import Costs, Settings
from memorymark.ui import sweep_runner
from memorymark.ui.sweep_runner import ResultCache, SweepJob, sweep_progress

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
    batches = (8, 16, 64, 72)
    fits_below = 72

    def __init__(self, settings: Settings) -> None:
        self.settings, self.gpu, self.measurements = settings, A10, []
        self.backend_name = "sim" if settings.backend == "auto" else settings.backend
        self.measured = self.backend_name != "sim"

    def stream(self) -> Iterator[Measurement]:
        for batch in self.batches:
            type(self).before_probe(batch)
            self.measurements.append(m(batch, fits=batch < type(self).fits_below))
            yield self.measurements[-1]

    def report(self, costs: Costs | None = None) -> Report:
        type(self).on_report()
        return Report(settings=self.settings, costs=costs or Costs(), gpu=A10, backend="sim",
                      measurements=tuple(self.measurements), elapsed_seconds=0.0)  # fmt: skip


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeSession]:
    class Fake(FakeSession):
        pass

    monkeypatch.setattr(sweep_runner, "Session", Fake)
    return Fake


def job(settings: Settings = SIM, lock: threading.Lock | None = None) -> SweepJob:
    return SweepJob(settings=settings, cache=ResultCache(), lock=lock or threading.Lock())


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_job_records_every_probe_caches_the_report_and_ends_done(fake) -> None:
    j = job()
    j.run()
    assert j.state == "done" and not j.running
    assert [x.batch_size for x in j.measurements] == [8, 16, 64, 72]
    assert len(j.probe_seconds) == 4
    assert j.report.optimal.batch_size == 64
    assert j.cache.get(SIM) is j.report
    assert all(x.timeline == () for x in j.report.measurements)  # the cache keeps no timelines


def test_when_nothing_fits_the_job_says_it_is_looking_for_fixes(fake) -> None:
    j = job()
    seen = []
    fake.batches = (8, 4, 2, 1)
    fake.fits_below = 0
    fake.on_report = staticmethod(lambda: seen.append(j.state))
    j.run()
    assert seen == ["fixing"] and j.state == "done"
    assert j.report.optimal is None


def test_a_failure_becomes_one_line_and_the_state_failed(fake) -> None:
    def boom(batch: int) -> None:
        raise RuntimeError("could not build the model\nTraceback (most recent call last): ...")

    fake.before_probe = staticmethod(boom)
    j = job()
    j.run()
    assert (j.state, j.error) == ("failed", "could not build the model")
    assert j.cache.get(SIM) is None


def test_cancel_stops_after_the_probe_in_flight_and_caches_nothing(fake) -> None:
    j = job()
    fake.before_probe = staticmethod(lambda batch: j.cancel() if batch == 16 else None)
    j.run()
    assert j.state == "cancelled"
    assert [x.batch_size for x in j.measurements] == [8, 16]
    assert j.cache.get(SIM) is None


def test_real_device_sweeps_take_turns_on_the_process_wide_lock(fake) -> None:
    lock = threading.Lock()
    lock.acquire()  # another session is measuring
    j = job(REAL, lock)
    j.start()
    wait_for(lambda: j.state == "waiting")
    time.sleep(0.3)
    assert j.measurements == []
    lock.release()
    wait_for(lambda: j.state == "done")
    assert not lock.locked()


def test_cancel_while_waiting_for_the_device_gives_up_the_turn(fake) -> None:
    lock = threading.Lock()
    lock.acquire()
    j = job(REAL, lock)
    j.start()
    wait_for(lambda: j.state == "waiting")
    j.cancel()
    wait_for(lambda: not j.running)
    assert j.state == "cancelled" and j.measurements == []
    lock.release()


def test_simulated_sweeps_run_side_by_side(fake) -> None:
    both = threading.Barrier(2, timeout=5)  # passes only if two sweeps are mid-probe at once
    fake.before_probe = staticmethod(lambda batch: both.wait() if batch == 8 else None)
    lock = threading.Lock()
    jobs = [job(SIM, lock), job(SIM, lock)]
    for j in jobs:
        j.start()
    wait_for(lambda: not any(j.running for j in jobs))
    assert [j.state for j in jobs] == ["done", "done"]


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
    assert sweep_runner.one_line(ValueError("bad\nmore")) == "bad"
    assert sweep_runner.one_line(KeyError()) == "KeyError"
