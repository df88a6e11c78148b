"""Starts this session's sweeps on the server's worker processes and keeps what the page draws.

Owns the process-wide pieces every browser session shares (Streamlit resources): the server's
configuration (environment or .streamlit/secrets.toml) and the ceilings it puts on every sweep,
the `SweepService` sweeps run on (a local pool of worker processes, or a Dask cluster) and the
GPUs of the machine they run on (asked of a worker), the poller thread that takes in what each
worker sends, cancels the job of a session that ended, and files finished reports in the
process-wide result cache. Sweeps never run in the server process, nor does torch load there.
Must not know how anything is drawn.

A finished analysis is filed in `_finished`, in the result cache that was current when it
started (the page saves it to the history: `history_views.save_finished`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import replace
from typing import Any

import streamlit as st

from memorymark.backends.selection import LocalGPUs
from memorymark.measurement import Measurement
from memorymark.report import Report
from memorymark.service.executors import SweepService, service_for, thread_service
from memorymark.service.jobs import RUNNING_STATES, SweepJob, SweepRequest
from memorymark.service.server_config import ServerConfig
from memorymark.settings import Settings

__all__ = ["RUNNING_STATES", "SweepJob"]
JOB_KEY = "mm_job"
SYNC_KEY = "mm_sync_sweeps"
"""Session flag: run sweeps inline in the script thread (AppTest has no browser to poll)."""
POLL_SECONDS = 0.25
SESSION_GRACE_SECONDS = 10.0
"""A session gone this long (tab closed; a reconnect within it keeps the sweep) loses its job."""


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
def result_cache() -> ResultCache:
    """Finished reports (and page results) of every session, by configuration."""
    return ResultCache()


def _secrets() -> dict[str, Any]:
    try:
        return dict(st.secrets)
    except Exception:  # noqa: BLE001 - no secrets.toml (or an unreadable one): environment only
        return {}


@st.cache_resource(show_spinner=False)
def server_config() -> ServerConfig:
    """The server's ceilings and executor, read once from the environment and secrets."""
    return ServerConfig.from_sources(secrets=_secrets())


@st.cache_resource(show_spinner=False)
def sweep_service() -> SweepService:
    """The executor every session's sweeps run on (worker processes, or a Dask cluster)."""
    return service_for(server_config())


def page_service() -> SweepService:
    """Where the pages' engine calls run: the server's workers; inline where there is no server
    (AppTest and bare scripts, with nothing to keep responsive)."""
    return sweep_service() if _served() else thread_service(inline=True)


FIRST_START_SPINNER = (
    "Starting MemoryMark's workers: the first page after a server start waits for one to load "
    "PyTorch and look for a GPU (about half a minute on a small machine; once per server)..."
)


@st.cache_resource(show_spinner=FIRST_START_SPINNER)
def local_gpus() -> LocalGPUs:
    """The GPUs of the machine the sweeps run on, asked of a worker once per server process:
    the server itself never loads torch. The first call waits for that worker (the spinner says
    why the first page is slow); every later one is the cached answer."""
    return page_service().local_gpus()


_A_SWEEP_STARTED = threading.Event()
"""Set once a sweep of this server process got past starting: its worker pool is warm from then
(a plain module value, not a Streamlit resource: the poller thread, which has no script run
context, sets it)."""


def workers_warm() -> bool:
    """True once a sweep on this server has started in a worker: the pool's one-time warm-up
    (PyTorch and the model code loaded for every later worker) is behind it, and a job's
    start takes a fraction of a second. Before that, the page says what the first one waits
    for."""
    return _A_SWEEP_STARTED.is_set()


def _note_started(job: SweepJob) -> None:
    if job.gpu is not None or job.state not in ("queued", "starting"):
        _A_SWEEP_STARTED.set()


def start_workers() -> None:
    """Start the worker pool (and its forkserver's warm-up) as a page opens, not at the first
    Analyze; only in a served app (AppTest and bare scripts have no runtime)."""
    if _served():
        sweep_service()


def within_server_limits(settings: Settings) -> tuple[Settings, list[str]]:
    """`settings` under the server's ceilings (what a link asked above them is brought down),
    with a sentence per change; ValueError for a backend the server does not allow."""
    return server_config().apply(settings)


def sweep_key(settings: Settings) -> Settings:
    """What decides a sweep's measurements: every setting but the global batch to plan for."""
    return settings.replace(target_batch=None)


def _finished(job: SweepJob, cache: ResultCache | None = None) -> None:
    """A sweep that ended with a full report: put it in `cache` (the server's by default) for
    every session (a partial one, which a limit stopped, is not kept: the next click measures
    again; nor is one whose search for ways out a limit stopped)."""
    report = job.report
    if job.state != "done" or report is None or report.stopped_by is not None:
        return
    if report.fixes_stopped_by is not None:
        return
    cache = cache if cache is not None else result_cache()
    cache.put(job.settings, report)
    cache.put(("sweep", sweep_key(job.settings)), report)


class Poller:
    """One thread for the whole server: polls every job, cancels those of ended sessions."""

    def __init__(self) -> None:
        # Each job with its session and the cache it was started beside: it is filed there,
        # whatever cache is current when it ends.
        self._jobs: dict[SweepJob, tuple[str | None, ResultCache]] = {}
        self._gone_since: dict[SweepJob, float] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._loop, name="memorymark-poller", daemon=True).start()

    def add(self, job: SweepJob, session_id: str | None) -> None:
        """Watch `job`, which belongs to the browser session `session_id`."""
        with self._lock:
            self._jobs[job] = (session_id, result_cache())

    def _loop(self) -> None:
        while True:
            time.sleep(POLL_SECONDS)
            with self._lock:
                watched = list(self._jobs.items())
            for job, (session_id, cache) in watched:
                with contextlib.suppress(Exception):  # one bad job must not stop the others
                    self._check(job, session_id, cache)

    def _check(self, job: SweepJob, session_id: str | None, cache: ResultCache) -> None:
        job.poll()
        _note_started(job)
        if job.running and not _session_alive(session_id):
            gone = self._gone_since.setdefault(job, time.monotonic())
            if time.monotonic() - gone > SESSION_GRACE_SECONDS:
                job.cancel()
        else:
            self._gone_since.pop(job, None)
        if not job.running:
            _finished(job, cache)
            with self._lock:
                self._jobs.pop(job, None)
                self._gone_since.pop(job, None)


def _served() -> bool:
    """True in a running Streamlit server; False in AppTest (whose Runtime is a mock) and in
    bare scripts (no Runtime)."""
    from streamlit.runtime import Runtime

    return Runtime.exists() and type(Runtime.instance()) is Runtime


def _session_alive(session_id: str | None) -> bool:
    from streamlit.runtime import Runtime

    if session_id is None or not _served():
        return True  # AppTest and bare scripts have no sessions to ask about
    return Runtime.instance().is_active_session(session_id)


@st.cache_resource(show_spinner=False)
def poller() -> Poller:
    """The server's one poller thread."""
    return Poller()


def current_job() -> SweepJob | None:
    """This session's latest sweep, running or not, with what its worker sent so far."""
    job: SweepJob | None = st.session_state.get(JOB_KEY)
    if job is not None:
        job.poll()
        _note_started(job)
    return job


def cached_report(settings: Settings) -> Report | None:
    """The finished report of an identical configuration, from any session."""
    return result_cache().get(settings)


def can_replan(settings: Settings) -> bool:
    """True when a sweep of these settings (but another global batch) is cached: its report
    for this one needs at most the plan's few steps, not a sweep."""
    return result_cache().get(("sweep", sweep_key(settings))) is not None


def start_sweep(settings: Settings) -> SweepJob | None:
    """Start a sweep for `settings` unless one is running here (a second click starts nothing).

    A configuration already analysed returns at once from the cache (None: nothing to run);
    one analysed for another global batch only re-plans from those measurements.
    """
    job = current_job()
    if job is not None and job.running:
        return job
    if cached_report(settings) is not None:
        st.session_state.pop(JOB_KEY, None)
        return None
    swept: Report | None = result_cache().get(("sweep", sweep_key(settings)))
    run_as, _ = within_server_limits(settings)  # the ceilings run, the user's settings show
    request = SweepRequest(settings, run_as=None if run_as == settings else run_as)
    if swept is not None:
        request = replace(
            request,
            resume=swept.measurements,
            resume_seconds=swept.elapsed_seconds,
            resume_depth_replay=swept.depth_replay,
        )
    sync = bool(st.session_state.get(SYNC_KEY))
    service = thread_service(inline=True) if sync else sweep_service()
    job = service.submit(request)
    if swept is not None:
        job.measurements = list(swept.measurements)  # drawn while the plan is checked
    st.session_state[JOB_KEY] = job
    if sync:
        job.poll()
        _finished(job)
    else:
        from streamlit.runtime.scriptrunner import get_script_run_ctx

        ctx = get_script_run_ctx()
        poller().add(job, ctx.session_id if ctx is not None else None)
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
