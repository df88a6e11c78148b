"""Sweeps as jobs on an executor: what runs in a worker, what comes back, the submitter's view.

Owns `run_sweep` (the function a worker process runs: one engine `Session`, every measurement
sent back the moment it exists, the report at the end, failures as one line) and the pages'
engine calls (`run_items`), sent back through a channel (memorymark/service/channels.py); the
per-device lock real-GPU sweeps take (a file lock, so CLI runs and every server process take
turns too), and `SweepJob`: the submitter's side of one job (its state, measurements, queue
place, cancel). Everything crossing a process is a plain picklable value (Settings, Measurement,
Report). Must not import Streamlit; imports torch only inside the worker (through `Session`).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memorymark.engine import Session
from memorymark.gpus import GPU
from memorymark.limits import one_line
from memorymark.measurement import DepthReplay, Measurement
from memorymark.report import Report
from memorymark.service.channels import Channel
from memorymark.service.server_config import CEILING_FIELDS
from memorymark.service.worker_pool import lift_memory_limit
from memorymark.settings import Costs, Settings
from memorymark.ways_out import Fix

RUNNING_STATES = ("queued", "starting", "waiting", "running", "fixing", "reporting")
# A worker still in one probe this long after its time limit is killed (a probe cannot be
# interrupted in-process; the sweep itself stops before a probe that would pass the limit).
TIME_LIMIT_GRACE_SECONDS = 5.0
LOCK_POLL_SECONDS = 0.2


@dataclass(frozen=True, slots=True)
class SweepRequest:
    """What a worker runs: a sweep of `settings`, or (with `resume`) only the report of a sweep
    already measured, whose plan may measure a few steps with accumulation."""

    settings: Settings
    """What the user asked for: the report, its links and its commands carry these."""
    resume: tuple[Measurement, ...] | None = None
    resume_seconds: float = 0.0
    resume_depth_replay: DepthReplay | None = None
    """How the resumed sweep's steps were had at the model's depth, as its report said."""
    memory_note: str = ""
    """How the worker's memory is limited, for the one line shown when a job runs out of it."""
    run_as: Settings | None = None
    """`settings` under the server's ceilings (ServerConfig.apply), when they differ: what the
    worker runs. None: `settings` themselves."""

    @property
    def run_settings(self) -> Settings:
        """What the worker runs."""
        return self.run_as or self.settings


@dataclass(frozen=True, slots=True)
class SweepOutcome:
    """What a worker hands back: a report, or why there is none."""

    report: Report | None = None
    error: str | None = None
    cancelled: bool = False


def slim(m: Measurement) -> Measurement:
    """A measurement without its per-operator timeline (kB each; nothing downstream draws it)."""
    return dataclasses.replace(m, timeline=())


def slim_report(report: Report) -> Report:
    """The report with every measurement slimmed."""
    return dataclasses.replace(report, measurements=tuple(slim(m) for m in report.measurements))


# -- in the worker ------------------------------------------------------------------------------
def run_sweep(request: SweepRequest, channel: Channel) -> SweepOutcome:
    """The whole job, in a worker: every failure becomes `error` (one line), never an exception."""
    try:
        return _run(request, channel)
    except MemoryError:
        return SweepOutcome(
            error=f"the sweep ran out of the memory its worker may use{request.memory_note}"
        )
    except Exception as exc:  # noqa: BLE001 - shown as one line with a next step
        return SweepOutcome(error=one_line(exc))


def as_asked(report: Report, asked: Settings) -> Report:
    """`report` with the user's own limits where the server's ceilings ran it: a link, a
    command or an applied way out from it then asks what the user asked, not the server's
    ceilings. Only the limits go back: what the run found (a GPU count `--gpus auto` chose)
    stays."""
    fixes = tuple(fix_as_asked(f, asked) for f in report.fixes)
    return dataclasses.replace(report, settings=_limits_of(report.settings, asked), fixes=fixes)


def fix_as_asked(fix: Fix, asked: Settings) -> Fix:
    """One way out with the user's own limits (as `as_asked`), so its button asks for them."""
    return dataclasses.replace(fix, settings=_limits_of(fix.settings, asked))


def _limits_of(s: Settings, asked: Settings) -> Settings:
    return s.replace(**{name: getattr(asked.search, name) for name in CEILING_FIELDS})


def _run(request: SweepRequest, channel: Channel) -> SweepOutcome:
    report = _sweep(request, channel)
    if isinstance(report, SweepOutcome):
        return report
    return SweepOutcome(report=slim_report(as_asked(report, request.settings)))


def _sweep(request: SweepRequest, channel: Channel) -> Report | SweepOutcome:
    session = Session(request.run_settings)  # torch loads here, in the worker
    if session.runs_for_real:
        lift_memory_limit()  # the ceiling is for simulations; a real GPU is the machine's own
    channel.put(("resolved", (session.backend_name, session.gpu)))
    with device_turn(session.backend_name if session.runs_for_real else None, channel) as ours:
        if not ours:
            return SweepOutcome(cancelled=True)
        channel.put(("state", "running"))
        if session.settings.hardware.gpu_count is None:
            # --gpus auto: find the fewest GPUs that train, then sweep on that count.
            session = session.with_min_gpus()
            channel.put(("resolved", (session.backend_name, session.gpu)))
        if request.resume is not None:
            session.resume(
                request.resume, request.resume_seconds, depth_replay=request.resume_depth_replay
            )
        else:
            start = time.perf_counter()
            with contextlib.closing(session.stream()) as probes:
                for m in probes:
                    channel.put(("probe", (slim(m), time.perf_counter() - start)))
                    if channel.stop_requested():
                        return SweepOutcome(cancelled=True)
        if session.needs_ways_out and not _stream_ways_out(session, request.settings, channel):
            return SweepOutcome(cancelled=True)
        # After the last probe the report may build the model again and run steps (the plan's
        # accumulation, the eval batch): each says what it does, or the page would sit silent.
        return session.report(on_stage=lambda text: channel.put(("stage", text)))


def _stream_ways_out(session: Session, asked: Settings, channel: Channel) -> bool:
    """Nothing fit: send each way out the moment it is found, as ("way_out", (fix or None,
    the stages not finished yet)), after one message with none found and every stage ahead,
    so the page names what is left even if the worker is killed mid-step. The report then
    takes them from the session without searching again. False when a stop was asked for."""
    search = session.ways_out()
    channel.put(("state", "fixing"))
    channel.put(("way_out", (None, search.not_finished)))
    for _label, fix in search.stages():
        found = None if fix is None else fix_as_asked(fix, asked)
        channel.put(("way_out", (found, search.not_finished)))
        if channel.stop_requested():
            return False
    return True


def run_items(
    call: Callable[..., Iterable[Any]], settings: Settings, args: tuple[Any, ...], channel: Channel
) -> list[Any]:
    """A page's engine call in a worker: `call(Session(settings), *args)` yields items, each
    sent back as ("item", it) the moment it exists; all of them are the result. Real devices
    take their lock, as sweeps do."""
    session = Session(settings)
    if session.runs_for_real:
        lift_memory_limit()  # as run_sweep: the ceiling is for simulations
    items: list[Any] = []
    with device_turn(session.backend_name if session.runs_for_real else None, channel) as ours:
        if not ours:
            return items
        for item in call(session, *args):
            channel.put(("item", item))
            items.append(item)
            if channel.stop_requested():
                break
    return items


def compare_gpus(session: Session, costs: Costs) -> Iterator[Any]:
    """Every catalog GPU's answer (one item: the comparison and its measurements)."""
    yield session.compare(costs)


def backward_proof(session: Session, batch_size: int) -> Iterator[Any]:
    """The four protocols at `batch_size`, each with its own max batch, as each lands."""
    yield from session.proof(batch_size, sweeps=True)


def longest_sequence(session: Session) -> Iterator[Any]:
    """Each (sequence length, measurement) as the search tries it, then the `SeqLenAnswer`."""
    for seq_len, m in session.stream_seq_len():
        yield seq_len, slim(m)
    yield session.seq_len_answer()


def scale_out(
    session: Session, counts: tuple[int, ...], costs: Costs, samples_per_run: float
) -> Iterator[Any]:
    """One row per GPU count (a sweep each), as each count's sweep ends."""
    yield from session.scale_out(counts, costs, samples_per_run)


def layouts(session: Session, costs: Costs, samples_per_run: float) -> Iterator[Any]:
    """The layout search of the session's GPU count (or the fewest GPUs): one answer."""
    yield session.layouts(costs, samples_per_run)


def lock_path(backend_name: str) -> Path:
    """The lock file of one real device (the first of its kind: the one Session measures on)."""
    return Path(tempfile.gettempdir()) / f"memorymark-{backend_name}-0.lock"


@contextlib.contextmanager
def device_turn(backend_name: str | None, channel: Channel) -> Iterator[bool]:
    """Hold the device's file lock for the block (nothing for a simulation); yields False if a
    stop is asked for while waiting. The kernel frees it when a killed worker dies."""
    try:
        import fcntl
    except ImportError:  # Windows: no per-device lock, one job at a time is the pool's to keep
        backend_name = None
    if backend_name is None:
        yield True
        return
    with open(lock_path(backend_name), "a+b") as f:
        told = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    channel.put(("state", "waiting"))
                    told = True
                if channel.stop_requested():
                    yield False
                    return
                time.sleep(LOCK_POLL_SECONDS)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -- the submitter's side -----------------------------------------------------------------------
@dataclass(eq=False)
class SweepJob:
    """One submitted sweep as its submitter sees it; `poll()` takes in what the worker sent."""

    settings: Settings
    """What the user asked for (the key its report is filed under)."""
    future: cf.Future
    channel: Any
    run_as: Settings | None = None
    """What the worker runs, when the server's ceilings changed it (SweepRequest.run_as)."""
    position_of: Callable[[cf.Future], int | None] = lambda _: None
    measurements: list[Measurement] = field(default_factory=list)
    probe_seconds: list[float] = field(default_factory=list)
    state: str = "queued"
    """queued (its place: `queue_position`), starting, waiting (for the device lock), running,
    fixing (nothing fit: searching the ways out, `fixes` those found so far), reporting (after
    the last probe: `stage` says what the report checks), done, cancelled or failed."""
    fixes: list[Fix] = field(default_factory=list)
    """The ways out found so far, when nothing fit, each the moment the worker found it."""
    fixes_not_finished: tuple[str, ...] = ()
    """The ways out the search has not finished looking at yet (all that are left)."""
    fixing_since: float | None = None
    """When the search for ways out began: its own time limit counts from here."""
    error: str | None = None
    stage: str | None = None
    """What the report is doing after the sweep's last probe (the engine's words), while the
    state is reporting."""
    gpu: GPU | None = None
    backend_name: str | None = None
    report: Report | None = None
    queue_position: int | None = None
    """1 when next in line; None once it runs (or where the executor cannot tell: Dask)."""
    changed_while_running: bool = False
    """Set by the page when the settings changed during the sweep."""
    started: float = field(default_factory=time.perf_counter)
    running_since: float | None = None
    finished: float | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    """poll and cancel come from the server's poller thread and the page's script thread."""

    @property
    def running(self) -> bool:
        """True until the sweep is done, cancelled or failed."""
        return self.state in RUNNING_STATES

    @property
    def elapsed_seconds(self) -> float:
        """Seconds since the job was submitted (frozen once it ends)."""
        return (self.finished or time.perf_counter()) - self.started

    def cancel(self, why: str | None = None) -> None:
        """End the job now: a waiting one leaves the queue, a running one's worker is killed
        (a Dask one stops after its probe). What it measured stays readable."""
        with self._lock:
            if not self.running:
                return
            self.channel.request_stop()
            self.future.cancel()
            for kind, payload in self.channel.drain():  # what arrived before the kill
                self._take(kind, payload)
            self.state, self.error = ("failed", why) if why else ("cancelled", None)
            self._end()

    def poll(self) -> None:
        """Take in every message the worker sent, and the outcome once there is one."""
        with self._lock:
            if not self.running:
                return
            for kind, payload in self.channel.drain():
                self._take(kind, payload)
            if self.state in ("queued", "starting"):
                place = self.position_of(self.future)
                self.queue_position = place if place else None
                self.state = "queued" if place else "starting"
            if self.future.done():
                self._settle()
            else:
                self._check_time_limit()

    def _take(self, kind: str, payload: Any) -> None:
        if kind == "resolved":
            self.backend_name, self.gpu = payload
            self.state, self.queue_position = "starting", None
        elif kind == "state":
            self.state = payload
            if payload == "running":
                self.running_since = time.perf_counter()
            elif payload == "fixing":
                self.fixing_since = time.perf_counter()
        elif kind == "way_out":
            fix, self.fixes_not_finished = payload
            if fix is not None:
                self.fixes.append(fix)
        elif kind == "stage":
            self.state, self.stage = "reporting", payload
        elif kind == "probe":
            m, seconds = payload
            self.measurements.append(m)
            self.probe_seconds.append(seconds)

    def _settle(self) -> None:
        for kind, payload in self.channel.drain():  # sent just before the end
            self._take(kind, payload)
        if self.future.cancelled():
            self.state = "cancelled"
        elif (exc := self.future.exception()) is not None:
            self.state, self.error = "failed", _worker_error(exc)
        else:
            outcome: SweepOutcome = self.future.result()
            if outcome.cancelled:
                self.state = "cancelled"
            elif outcome.error is not None or outcome.report is None:
                self.state, self.error = "failed", outcome.error or "no report came back"
            else:
                self.report, self.state = outcome.report, "done"
        self._end()

    def _check_time_limit(self) -> None:
        """Kill a worker stuck in one piece of work past its time limit: a probe past the
        sweep's, or a step of the ways out past theirs (counted from when they began); keep
        what it measured and found, and say which limit it was."""
        run = self.run_as or self.settings
        fixing = self.fixing_since is not None
        limit = run.search.ways_out_time_limit_seconds if fixing else run.search.time_limit_seconds
        since = self.fixing_since if fixing else self.running_since
        if limit is None or since is None or self.gpu is None:
            return
        if time.perf_counter() - since < limit + TIME_LIMIT_GRACE_SECONDS:
            return
        self.channel.request_stop()
        self.future.cancel()
        for kind, payload in self.channel.drain():
            self._take(kind, payload)
        self.report = self._report_so_far(limit, fixing, self.gpu)
        self.state = "done"
        self._end()

    def _report_so_far(self, limit: float, fixing: bool, gpu: GPU) -> Report:
        """The report of a worker killed at `limit`: in the sweep, a partial one; in the search
        for ways out, the whole sweep (it finished: no batch fits) with the ways out found."""
        started = self.running_since or self.started
        report = Report(
            settings=self.settings,
            costs=Costs(),
            gpu=gpu,
            backend=self.backend_name or "sim",
            measurements=tuple(self.measurements),
            elapsed_seconds=(self.fixing_since or time.perf_counter()) - started,
        )
        where = f"the time limit ({limit:g} s), in the middle of a"
        if not fixing:
            return dataclasses.replace(report, stopped_by=f"{where} probe")
        batch_1 = next((m for m in self.measurements if m.batch_size == 1), None)
        return dataclasses.replace(
            report,
            fixes=tuple(self.fixes),
            batch_1_required_bytes=None if batch_1 is None else batch_1.required_bytes,
            fixes_stopped_by=f"{where} step",
            fixes_not_finished=self.fixes_not_finished,
        )

    def _end(self) -> None:
        self.finished = self.finished or time.perf_counter()
        self.queue_position = None
        self.channel.close()


def _worker_error(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "the job ran out of the memory its worker may use"
    return one_line(exc)
