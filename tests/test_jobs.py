"""Sweeps in worker processes: the bounded pool, streaming, cancel, queue places, memory, Dask."""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Callable

import pytest

from memorymark.service import jobs
from memorymark.service.channels import ThreadChannel
from memorymark.service.executors import dask_service, local_service
from memorymark.service.jobs import SweepJob, SweepRequest
from memorymark.service.worker_pool import WorkerDied, WorkerPool, default_workers
from memorymark.settings import Settings

TINY = Settings(model="tiny-bert", seq_len=16, gpu="a10", strategy="linear", step=8, max_batch=32)


def square(x: int) -> int:
    return x * x


def sleep_then(seconds: float, value: int = 0) -> int:
    time.sleep(seconds)
    return value


def allocate(n_bytes: int) -> int:
    return len(bytearray(n_bytes))


def pool(workers: int = 1, **kwargs) -> WorkerPool:
    # spawn: a bare interpreter per job, so these tests do not wait for a forkserver's preload.
    return WorkerPool(workers, start_method="spawn", **kwargs)


def until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_default_pool_leaves_one_core_to_the_server() -> None:
    assert default_workers() == max(1, os.cpu_count() or 1)


def test_a_job_runs_in_another_process_behind_the_executor_interface() -> None:
    p = pool()
    try:
        assert p.submit(square, 7).result(30) == 49
        assert p.submit(os.getpid).result(30) != os.getpid()
    finally:
        p.shutdown()


def test_queued_jobs_know_their_place_and_move_up() -> None:
    p = pool(1)
    try:
        first, second, third = (p.submit(sleep_then, 30) for _ in range(3))
        until(lambda: p.position(first) == 0)
        assert [p.position(f) for f in (first, second, third)] == [0, 1, 2]
        first.cancel()
        until(lambda: p.position(second) == 0)
        assert p.position(third) == 1 and p.position(first) is None
        third.cancel()
        assert p.position(third) is None  # a waiting job just leaves the queue
    finally:
        p.shutdown(wait=False, cancel_futures=True)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_worker_never_reruns_the_main_script(tmp_path, monkeypatch, method) -> None:
    # Under Streamlit, __main__ is the page script: a child that re-ran it would run the page.
    script = tmp_path / "page.py"
    script.write_text("raise SystemExit('the page ran again in the worker')\n")
    page = types.ModuleType("__main__")
    page.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", page)
    p = WorkerPool(1, start_method=method)
    try:
        assert p.submit(os.getpid).result(timeout=60) != os.getpid()
    finally:
        p.shutdown()


def test_submit_returns_at_once_while_a_worker_is_slow_to_start() -> None:
    # A page's script thread submits: it must draw (a "Starting" bar) while the process starts.
    p = pool(1)
    start = p._start

    def slow_start(job) -> None:  # as a forkserver's start waits for its preload (warm-up)
        time.sleep(2.0)
        start(job)

    p._start = slow_start
    try:
        began = time.monotonic()
        future = p.submit(square, 4)
        assert time.monotonic() - began < 1.0
        assert p.position(future) == 0  # its slot is taken: it is starting, not queued
        assert future.result(timeout=60) == 16
    finally:
        p.shutdown()


def test_cancel_kills_the_running_worker_at_once_and_the_pool_goes_on() -> None:
    p = pool(1)
    try:
        stuck = p.submit(sleep_then, 60)
        after = p.submit(square, 3)
        until(lambda: p.pid(stuck) is not None)
        pid = p.pid(stuck)
        began = time.monotonic()
        assert stuck.cancel()
        # Well under the 60 s the job would sleep, with room for a loaded machine.
        until(lambda: not alive(pid), timeout=30)
        assert time.monotonic() - began < 30
        assert after.result(30) == 9  # the freed slot runs the next job
    finally:
        p.shutdown()


def test_a_worker_past_its_memory_ceiling_fails_alone() -> None:
    p = pool(1, memory_limit_bytes=256 * 2**20)
    try:
        with pytest.raises(MemoryError):
            p.submit(allocate, 2 * 2**30).result(30)
        assert p.submit(allocate, 2**20).result(30) == 2**20  # the next job is fine
    finally:
        p.shutdown()
    assert jobs._worker_error(MemoryError()) == "the job ran out of the memory its worker may use"


def allocate_after_lifting(n_bytes: int) -> int:
    from memorymark.service.worker_pool import lift_memory_limit

    lift_memory_limit()  # what a job on a real GPU does once its Session says so
    return allocate(n_bytes)


def test_a_real_device_job_lifts_the_ceiling_meant_for_simulations() -> None:
    p = pool(1, memory_limit_bytes=256 * 2**20)
    try:
        assert p.submit(allocate_after_lifting, 2**30).result(60) == 2**30
    finally:
        p.shutdown()


def test_a_worker_that_dies_is_one_line() -> None:
    p = pool(1)
    try:
        with pytest.raises(WorkerDied, match=r"ended \(exit status 3\)"):
            p.submit(os._exit, 3).result(30)
    finally:
        p.shutdown()


def test_a_memory_error_in_the_sweep_becomes_one_line(monkeypatch) -> None:
    class Hungry:
        def __init__(self, settings: Settings) -> None:
            raise MemoryError

    monkeypatch.setattr(jobs, "Session", Hungry)
    outcome = jobs.run_sweep(SweepRequest(TINY, memory_note=" (1 GiB)"), ThreadChannel())
    assert outcome.error == "the sweep ran out of the memory its worker may use (1 GiB)"


def poll_until_done(job: SweepJob, timeout: float = 120) -> list[int]:
    """Poll as the server's poller does; the probe counts seen while the worker still ran."""
    seen = []
    deadline = time.monotonic() + timeout
    while job.running:
        assert time.monotonic() < deadline, "the sweep did not finish"
        job.poll()
        if job.running and not job.future.done():
            seen.append(len(job.measurements))
        time.sleep(0.05)
    return seen


def test_a_real_sweep_streams_each_measurement_from_a_worker_process() -> None:
    service = local_service(1, preload=False)
    try:
        job = service.submit(SweepRequest(TINY))
        seen = poll_until_done(job)
        assert job.state == "done", job.error
        sizes = [m.batch_size for m in job.measurements]
        assert sizes == [m.batch_size for m in job.report.measurements] == [8, 16, 24, 32]
        assert any(0 < n < len(sizes) for n in seen)  # some arrived while the sweep went on
        assert job.probe_seconds == sorted(job.probe_seconds)
    finally:
        service.shutdown()


class SlowFake:
    """An engine Session whose probes take `seconds` each (Dask's in-process workers see it)."""

    seconds = 0.05
    stopped_by = None
    needs_ways_out = False

    def __init__(self, settings: Settings) -> None:
        from memorymark import gpus

        self.settings, self.gpu, self.measurements = settings, gpus.find_gpu("A10"), []
        self.backend_name, self.runs_for_real = "sim", False

    def stream(self):
        from memorymark.measurement import Measurement

        for batch in (8, 16, 24, 32, 40, 48):
            time.sleep(type(self).seconds)
            self.measurements.append(Measurement(batch_size=batch, fits=True,
                                                 peak_bytes=batch * 2**20, backend="sim",
                                                 measured=False))  # fmt: skip
            yield self.measurements[-1]

    def report(self, on_stage=None):
        from memorymark.report import Report
        from memorymark.settings import Costs

        return Report(settings=self.settings, costs=Costs(), gpu=self.gpu, backend="sim",
                      measurements=tuple(self.measurements), elapsed_seconds=0.1)  # fmt: skip


@pytest.fixture
def dask_cluster():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    )
    yield cluster
    cluster.close()


def test_sweeps_run_on_a_dask_cluster_through_the_same_interface(dask_cluster, monkeypatch) -> None:
    monkeypatch.setattr(jobs, "Session", SlowFake)
    service = dask_service(dask_cluster)
    try:
        job = service.submit(SweepRequest(TINY))
        poll_until_done(job, timeout=30)
        assert job.state == "done", job.error
        assert [m.batch_size for m in job.measurements] == [8, 16, 24, 32, 40, 48]
        assert job.report.optimal.batch_size == TINY.search.max_batch  # 40 and 48 lie past it
    finally:
        service.shutdown()


def test_a_dask_sweep_stops_between_probes_when_cancelled(dask_cluster, monkeypatch) -> None:
    monkeypatch.setattr(jobs, "Session", SlowFake)
    monkeypatch.setattr(SlowFake, "seconds", 0.3)
    service = dask_service(dask_cluster)
    try:
        job = service.submit(SweepRequest(TINY))
        until(lambda: (job.poll(), len(job.measurements) >= 1)[1])
        job.cancel()
        assert job.state == "cancelled"
        assert job.channel.stop_requested()  # the worker stops after the probe in flight
    finally:
        service.shutdown()


def test_each_traced_probe_is_sent_before_the_next_trace_starts(monkeypatch) -> None:
    # Reported: the page showed the traced probes late, "all points at once". The worker sends
    # each one the moment it is traced; only the symbolic search's replays come together.
    from memorymark.backends.base import Backend

    events: list[str] = []
    measure = Backend.measure

    def traced(self, batch_size: int):
        events.append(f"trace {batch_size}")
        return measure(self, batch_size)

    class Recording(ThreadChannel):
        def put(self, message) -> None:
            if message[0] == "probe":
                m = message[1][0]
                events.append(f"{'replay' if m.replayed else 'sent'} {m.batch_size}")
            super().put(message)

    monkeypatch.setattr(Backend, "measure", traced)
    settings = Settings(model="tiny-bert", seq_len=16, gpu="a10", max_batch=64, current_batch=8)
    outcome = jobs.run_sweep(SweepRequest(settings), Recording())
    assert outcome.report is not None, outcome.error
    traces = [e for e in events if e.startswith("trace")]
    assert len(traces) >= 2
    for event in traces:
        batch = event.split()[1]
        # sent right after its own trace, before anything else is traced
        assert events[events.index(event) + 1] == f"sent {batch}"
