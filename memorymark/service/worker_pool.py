"""A bounded pool of worker processes behind `concurrent.futures.Executor`, one process per job.

Owns the slots (at most `max_workers` jobs run at once; the rest wait in order, and `position`
says where), starting each job in a fresh process with a memory ceiling, and cancelling: a
cancelled job that waits leaves the queue, one that runs has its process killed at once.

Why not `ProcessPoolExecutor`: it cannot cancel a job that has started (`Future.cancel` returns
False once running), and killing one of its workers breaks the whole pool (BrokenProcessPool)
for every other user. A process per job, started by a forkserver that has already imported torch
and transformers (`preload`), starts in a fraction of a second, can be killed alone, and gives
every memory back to the system when it ends. Jobs are plain picklable functions and values.
Knows nothing of sweeps, settings or Streamlit.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkServerContext, SpawnContext
from typing import Any, cast

from memorymark.backends.depth_worker import spawn_without_main

WORKER_NAME = "memorymark-worker"
"""Every process this pool starts carries this name (how `spawn_without_main` knows its own)."""


class WorkerDied(RuntimeError):
    """A worker process that ended without an answer (killed, crashed, out of memory)."""


FORKED_AUTOGRAD = "autograd's threading in combination with fork-based multiprocessing"
"""What a forked process's first backward raises when its parent had started autograd's device
threads (torch/csrc/autograd/engine.cpp, `in_bad_autograd_fork`). The warm-up never runs a
backward (memorymark/service/warmup.py); should a preloaded module ever start those threads
anyway, every forked worker is dead on arrival, so the pool moves to spawned workers."""


def default_workers() -> int:
    """One job per core: a simulated step is single-threaded Python (fake tensors do no
    arithmetic), and the server itself mostly sleeps between polls, so holding a core back for
    it left one idle while a second user's sweep waited in line."""
    return max(1, os.cpu_count() or 1)


def limit_memory(limit_bytes: int | None) -> None:
    """Cap this process's heap and anonymous mappings (RLIMIT_DATA, Linux 4.7+) at what it holds
    now plus `limit_bytes`: past it an allocation fails (MemoryError) in this process only.

    RLIMIT_DATA rather than RLIMIT_AS: torch and its libraries reserve gigabytes of address space
    they never touch, so an address-space cap would either be meaningless or fail at once."""
    if limit_bytes is None:
        return
    try:
        import resource
    except ImportError:  # Windows: no rlimits; the job runs without a ceiling
        return

    held = _data_bytes()
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    soft = held + limit_bytes
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def lift_memory_limit() -> None:
    """Lift `limit_memory`'s ceiling back to the hard limit, for a job on a real device: that is
    the machine's own GPU, not a hosted simulation, and CUDA's driver maps host memory (pinned
    buffers, its own heaps) that RLIMIT_DATA would count against the job."""
    try:
        import resource
    except ImportError:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))


def _data_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _child_main(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    conn: Connection,
    limit_bytes: int | None,
    ready_check: Callable[[], None] | None = None,
) -> None:
    """Run one job in the worker process and send back ("ok", value) or ("error", exception).
    `ready_check` runs first: what it raises goes back as the job's error."""
    try:
        if ready_check is not None:
            ready_check()
        limit_memory(limit_bytes)
        message: tuple[str, Any] = ("ok", fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the submitter
        message = ("error", exc)
    try:
        conn.send(message)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result or exception
        conn.send(("error", WorkerDied(f"{type(exc).__name__}: {exc}")))
    conn.close()


@dataclass(eq=False)
class _Job:
    future: cf.Future
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    respawned: bool = False
    process: Any = None
    conn: Connection | None = None
    watcher: threading.Thread | None = field(default=None, repr=False)


class WorkerPool(cf.Executor):
    """At most `max_workers` jobs at once, each in its own process; see the module docstring.

    `memory_limit_bytes` caps what each job may allocate beyond the preloaded libraries;
    `preload` names modules the forkserver imports once, so each job starts with them loaded;
    `ready_check` (picklable) runs in each worker before its job, and a worker it finds forked
    after autograd started threads (`FORKED_AUTOGRAD`) moves the pool to spawned workers.
    A job's future stays pending while it runs (so `cancel()` works until it ends)."""

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        memory_limit_bytes: int | None = None,
        preload: Sequence[str] = (),
        start_method: str | None = None,
        ready_check: Callable[[], None] | None = None,
    ) -> None:
        self.max_workers = max_workers or default_workers()
        if self.max_workers < 1:
            raise ValueError("a worker pool needs at least one worker")
        self.memory_limit_bytes = memory_limit_bytes
        self._ready_check = ready_check
        spawn_without_main(WORKER_NAME)
        methods = multiprocessing.get_all_start_methods()
        method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
        # (get_context types a name it cannot see as the base class, which starts no process)
        self._ctx = cast("SpawnContext | ForkServerContext", multiprocessing.get_context(method))
        if method == "forkserver":
            if preload:
                self._ctx.set_forkserver_preload(list(preload))
            # Started now, in the background, so the first job does not wait for the preload.
            from multiprocessing import forkserver

            threading.Thread(target=forkserver.ensure_running, daemon=True).start()
        self._lock = threading.Lock()
        self._waiting: deque[_Job] = deque()
        self._running: dict[cf.Future, _Job] = {}
        self._shutdown = False

    # -- the Executor interface ------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        """Queue `fn(*args, **kwargs)` for a worker process; returns its future."""
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit to a worker pool that was shut down")
            job = _Job(cf.Future(), fn, args, kwargs)
            self._waiting.append(job)
        job.future.add_done_callback(self._on_done)
        self._dispatch()
        return job.future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking jobs; with `cancel_futures`, cancel waiting and running ones."""
        with self._lock:
            self._shutdown = True
            jobs = list(self._waiting) + list(self._running.values())
        if cancel_futures:
            for job in jobs:
                job.future.cancel()
        if wait:
            for job in jobs:
                if job.watcher is not None:
                    job.watcher.join()

    # -- what the page shows ---------------------------------------------------------------------
    def position(self, future: cf.Future) -> int | None:
        """0 while the job runs, n when n-1 jobs wait ahead of it, None once it ended."""
        with self._lock:
            if future in self._running:
                return 0
            for place, job in enumerate(self._waiting, start=1):
                if job.future is future:
                    return place
        return None

    def pid(self, future: cf.Future) -> int | None:
        """The process id of a running job (tests watch it end)."""
        with self._lock:
            job = self._running.get(future)
            return None if job is None or job.process is None else job.process.pid

    # -- inside ----------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        starting = []
        with self._lock:  # slots are taken here; processes start outside the lock
            while self._waiting and len(self._running) < self.max_workers:
                job = self._waiting.popleft()
                if not job.future.done():
                    self._running[job.future] = job
                    starting.append(job)
        for job in starting:
            # Off the submitter's thread: a forkserver start waits until the forkserver has
            # imported its preload (the warm-up, 17-26 s on 2 cores after a server start), and
            # the submitter is a page's script thread, which would draw nothing meanwhile.
            threading.Thread(
                target=self._start, args=(job,), name="memorymark-start", daemon=True
            ).start()

    def _start(self, job: _Job) -> None:
        reader, writer = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=_child_main,
            args=(
                job.fn,
                job.args,
                job.kwargs,
                writer,
                self.memory_limit_bytes,
                self._ready_check,
            ),
            name=WORKER_NAME,
            daemon=True,
        )
        try:
            process.start()
        except Exception as exc:  # noqa: BLE001 - no process: the job fails, the slot frees
            writer.close()
            reader.close()
            with self._lock:
                self._running.pop(job.future, None)
            if not job.future.done():
                job.future.set_exception(WorkerDied(f"no worker process could start: {exc}"))
            return
        writer.close()
        with self._lock:
            job.process, job.conn = process, reader
        if job.future.cancelled():  # cancelled while its process started
            process.kill()
        job.watcher = threading.Thread(target=self._watch, args=(job,), daemon=True)
        job.watcher.start()

    def _watch(self, job: _Job) -> None:
        assert job.conn is not None
        wait([job.conn, job.process.sentinel])
        message: tuple[str, Any] | None = None
        try:
            if job.conn.poll():
                message = job.conn.recv()
        except (EOFError, OSError):  # killed half-way through sending
            message = None
        job.process.join()
        job.conn.close()
        if self._forked_autograd(job, message):
            threading.Thread(target=self._start, args=(job,), daemon=True).start()
            return
        with self._lock:
            self._running.pop(job.future, None)
        if not job.future.done():
            self._settle(job, message)
        self._dispatch()

    def _forked_autograd(self, job: _Job, message: tuple[str, Any] | None) -> bool:
        """True when `job` failed only because its process was forked after autograd started
        threads (`FORKED_AUTOGRAD`): the pool then starts every later job, this one included
        (once, in the slot it holds), by spawning a fresh interpreter instead."""
        failed_on_fork = (
            message is not None and message[0] == "error" and FORKED_AUTOGRAD in str(message[1])
        )
        if not failed_on_fork or job.respawned or job.future.done():
            return False
        with self._lock:
            self._ctx = multiprocessing.get_context("spawn")
        job.respawned = True
        return True

    def _settle(self, job: _Job, message: tuple[str, Any] | None) -> None:
        try:
            if message is None:
                code = job.process.exitcode
                how = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
                job.future.set_exception(WorkerDied(f"the worker process ended ({how})"))
            elif message[0] == "ok":
                job.future.set_result(message[1])
            else:
                job.future.set_exception(message[1])
        except cf.InvalidStateError:  # cancelled in the meantime
            pass

    def _on_done(self, future: cf.Future) -> None:
        if not future.cancelled():
            return
        with self._lock:
            self._waiting = deque(j for j in self._waiting if j.future is not future)
            job = self._running.get(future)
        if job is not None and job.process is not None:
            job.process.kill()  # the watcher reaps it and starts the next job
