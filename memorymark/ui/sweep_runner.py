"""Runs a sweep on a worker thread and keeps what the page draws from it.

Owns `SweepJob` (one engine `Session` on one thread, cancellable through a `threading.Event`), the
process-wide lock that lets one real-device sweep run at a time across every browser session,
and the process-wide cache of finished reports. The worker thread never calls Streamlit: it
appends measurements and sets its state, and a fragment on the page reads them. Must not know
how anything is drawn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from memorymark.engine import Session
from memorymark.gpus import GPU
from memorymark.measurement import Measurement
from memorymark.report import Report
from memorymark.settings import Settings

JOB_KEY = "mm_job"
SYNC_KEY = "mm_sync_sweeps"
"""Session flag: run sweeps in the script thread (AppTest has no browser to poll a fragment)."""
RUNNING_STATES = ("starting", "waiting", "running", "fixing")


class ResultCache:
    """Finished results by key (most recently used last, at most `size`); thread-safe."""

    def __init__(self, size: int = 32) -> None:
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.size = size

    def get(self, key: Hashable) -> Any | None:
        """The value stored under `key`, or None."""
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key]

    def put(self, key: Hashable, value: Any) -> None:
        """Store `value`, dropping the least recently used entry past `size`."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


@st.cache_resource(show_spinner=False)
def device_lock() -> threading.Lock:
    """The one lock every session shares: held while a sweep runs on real hardware."""
    return threading.Lock()


@st.cache_resource(show_spinner=False)
def result_cache() -> ResultCache:
    """Finished reports (and page results) of every session, by configuration."""
    return ResultCache()


def needs_device(settings: Settings) -> bool:
    """True when the step runs for real (cuda, mps, cpu) and must take turns on the machine."""
    return Session(settings).measured


def one_line(exc: BaseException) -> str:
    """An exception as one line a person can read (its type only when the message is empty)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def slim(report: Report) -> Report:
    """The report without each probe's per-operator timeline (kB each; nothing here draws it)."""
    return dataclasses.replace(
        report, measurements=tuple(dataclasses.replace(m, timeline=()) for m in report.measurements)
    )


@contextlib.contextmanager
def device_turn(lock: threading.Lock, cancel: threading.Event | None = None) -> Iterator[bool]:
    """Hold `lock` for the block; yields False (without it) if `cancel` is set while waiting."""
    while not lock.acquire(timeout=0.2):
        if cancel is not None and cancel.is_set():
            yield False
            return
    try:
        yield True
    finally:
        lock.release()


@dataclass(eq=False)
class SweepJob:
    """One sweep for one `Settings`, run by `run()` on a thread (or inline in tests)."""

    settings: Settings
    cache: ResultCache
    lock: threading.Lock
    measurements: list[Measurement] = field(default_factory=list)
    probe_seconds: list[float] = field(default_factory=list)
    state: str = "starting"
    """starting, waiting (for the device lock), running, fixing (nothing fit: simulating what
    would), done, cancelled or failed."""
    error: str | None = None
    gpu: GPU | None = None
    backend_name: str | None = None
    report: Report | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event)
    changed_while_running: bool = False
    """Set by the page when the sidebar changed during the sweep: its result is then shown
    for the settings before the change, not dropped."""
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None
    thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """True until the sweep is done, cancelled or failed."""
        return self.state in RUNNING_STATES

    @property
    def elapsed_seconds(self) -> float:
        """Seconds since the job started (frozen once it ends)."""
        return (self.finished or time.perf_counter()) - self.started

    def start(self) -> None:
        """Run the sweep on a daemon thread."""
        self.thread = threading.Thread(target=self.run, name="memorymark-sweep", daemon=True)
        self.thread.start()

    def cancel(self) -> None:
        """Ask the sweep to stop after the probe in flight."""
        self.cancel_event.set()

    def run(self) -> None:
        """The whole sweep; every failure becomes `error`, never an exception."""
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - shown as st.error with a next step
            self.error = one_line(exc)
            self.state = "failed"
        finally:
            self.finished = time.perf_counter()

    def _run(self) -> None:
        session = Session(self.settings)  # the GPU and backend, resolved once
        self.backend_name, self.gpu = session.backend_name, session.gpu
        real = session.measured
        if real and self.lock.locked():
            self.state = "waiting"
        turn = device_turn(self.lock, self.cancel_event) if real else contextlib.nullcontext(True)
        with turn as ours:
            if not ours:
                self.state = "cancelled"
                return
            self.state = "running"
            if self.settings.gpu_count is None:
                # --gpus auto: find the fewest GPUs that train, then sweep on that count.
                session = session.with_min_gpus()
                self.gpu = session.gpu
            with contextlib.closing(session.stream()) as probes:
                for m in probes:
                    self.probe_seconds.append(time.perf_counter() - self.started)
                    self.measurements.append(m)
                    if self.cancel_event.is_set():
                        break
        if self.cancel_event.is_set():
            self.state = "cancelled"
            return
        if not any(m.fits for m in self.measurements):
            self.state = "fixing"  # the report simulates each way out: a few more steps
        self.report = slim(session.report())
        self.cache.put(self.settings, self.report)
        self.state = "done"


def current_job() -> SweepJob | None:
    """This session's latest sweep, running or not."""
    return st.session_state.get(JOB_KEY)


def cached_report(settings: Settings) -> Report | None:
    """The finished report of an identical configuration, from any session."""
    return result_cache().get(settings)


def start_sweep(settings: Settings) -> SweepJob | None:
    """Start a sweep for `settings` unless one is running here (a second click starts nothing).

    A configuration already analysed returns at once from the cache (None: nothing to run).
    """
    job = current_job()
    if job is not None and job.running:
        return job
    if cached_report(settings) is not None:
        st.session_state.pop(JOB_KEY, None)
        return None
    job = SweepJob(settings=settings, cache=result_cache(), lock=device_lock())
    st.session_state[JOB_KEY] = job
    if st.session_state.get(SYNC_KEY):
        job.run()
    else:
        job.start()
    return job


def sweep_progress(measurements: list[Measurement], step: int) -> float:
    """A rough 0-1 progress: how narrow the bracket between the largest fit and first OOM is."""
    fits = [m.batch_size for m in measurements if m.fits]
    fails = [m.batch_size for m in measurements if not m.fits]
    if not measurements:
        return 0.0
    if not fails or not fits:
        return min(0.6, 0.2 * len(measurements))
    gap = max(min(fails) - max(fits), step)
    return max(0.6, min(0.95, 1.0 - 0.1 * (gap / step) ** 0.5))
