"""Where sweeps run: a `concurrent.futures.Executor` and the channel its workers answer through.

Owns `SweepService`: one executor (a local `WorkerPool` of processes by default, or a Dask
`distributed` cluster's executor given a scheduler address) with the matching channel, and
`submit`, which turns a `SweepRequest` into a `SweepJob` the page can watch; and the small
questions only torch answers (`local_gpus`, `parameter_count`: memorymark/service/questions.py),
on workers of their own, never behind a sweep. Both executors are
used only through the `Executor` interface (`submit`, `Future.cancel`); what differs is how
messages come back and how a cancel lands (local: the process is killed; Dask: the task stops
after its probe, as a Dask task cannot be killed). Knows nothing of Streamlit; never imports
torch (the workers do).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from collections.abc import Callable
from typing import Any

from memorymark.backends.selection import LocalGPUs
from memorymark.service import questions
from memorymark.service.channels import DaskChannel, PipeChannel, ThreadChannel
from memorymark.service.jobs import SweepJob, SweepRequest, run_items, run_sweep
from memorymark.service.server_config import ServerConfig
from memorymark.service.worker_pool import WorkerPool
from memorymark.settings import Settings
from memorymark.units import in_gib

# Imported once by the forkserver so each worker starts with torch, transformers and the engine
# loaded and warmed up (see memorymark/service/warmup.py).
PRELOAD = ("memorymark.service.jobs", "memorymark.service.warmup")
PROBE_TIMEOUT_SECONDS = 120.0
"""Importing torch in a fresh process takes 3-15 s on a loaded 2-core machine (measured here)."""


class SweepService:
    """Sweeps on one executor; `submit` returns a job to poll. `probe_executor` (the GPU probe)
    and `question_executor` (parameter counts) default to the same executor."""

    def __init__(
        self,
        executor: cf.Executor,
        new_channel: Callable[[], Any],
        *,
        position: Callable[[cf.Future], int | None] | None = None,
        memory_note: str = "",
        close: Callable[[], None] | None = None,
        probe_executor: cf.Executor | None = None,
        question_executor: cf.Executor | None = None,
    ) -> None:
        self.executor = executor
        self._new_channel = new_channel
        self._position = position or (lambda _: None)
        self._memory_note = memory_note
        self._close = close
        self._probe_executor = probe_executor or executor
        self._question_executor = question_executor or executor

    def submit(self, request: SweepRequest) -> SweepJob:
        """Queue a sweep; its job reports the measurements as they arrive (call `poll`)."""
        request = dataclasses.replace(request, memory_note=self._memory_note)
        channel = self._new_channel()
        future = self.executor.submit(run_sweep, request, channel)
        job = SweepJob(
            settings=request.settings,
            future=future,
            channel=channel,
            run_as=request.run_as,
            position_of=self._position,
        )
        job.poll()
        return job

    def submit_items(
        self, call: Callable[..., Any], settings: Settings, args: tuple[Any, ...]
    ) -> tuple[cf.Future, Any]:
        """Queue a page's engine call (`jobs.run_items`); returns its future and the channel
        its items arrive on."""
        channel = self._new_channel()
        return self.executor.submit(run_items, call, settings, args, channel), channel

    def local_gpus(self) -> LocalGPUs:
        """The GPUs of the machine the sweeps run on, as torch in a worker sees them (waits for
        the answer; the worker's failure, or TimeoutError, is raised here)."""
        future = self._probe_executor.submit(questions.local_gpus)
        return future.result(timeout=PROBE_TIMEOUT_SECONDS)

    def parameter_count(self, model: str, task: str) -> cf.Future:
        """A future of `model`'s parameter count for `task` (counted in a worker)."""
        return self._question_executor.submit(questions.parameter_count, model, task)

    def position(self, future: cf.Future) -> int | None:
        """The job's place in the queue (0: running), where the executor can tell."""
        return self._position(future)

    def shutdown(self) -> None:
        """Cancel every job and let the executor go."""
        try:
            self.executor.shutdown(wait=False, cancel_futures=True)
        except TypeError:  # Dask's ClientExecutor takes only `wait`
            self.executor.shutdown(wait=False)
        for extra in {self._probe_executor, self._question_executor} - {self.executor}:
            extra.shutdown(wait=False)
        if self._close is not None:
            self._close()


def local_service(
    workers: int | None = None, memory_limit_bytes: int | None = None, *, preload: bool = True
) -> SweepService:
    """A pool of worker processes on this machine (one per core by default)."""
    pool = WorkerPool(
        workers,
        memory_limit_bytes=memory_limit_bytes,
        preload=PRELOAD if preload else (),
        ready_check=questions.autograd_runs,
    )
    note = ""
    if memory_limit_bytes is not None:
        note = f" ({in_gib(memory_limit_bytes):g} GiB beyond its libraries)"
    # The GPU probe gets a spawned process: the first page waits for its answer, and a forked
    # worker would first wait for the forkserver's warm-up (17-26 s on 2 cores, against 3-15 s
    # to import torch). Parameter counts (well under a second, forked warm) get a slot of their
    # own, so they never queue behind a sweep.
    return SweepService(
        pool,
        PipeChannel,
        position=pool.position,
        memory_note=note,
        probe_executor=WorkerPool(1, start_method="spawn"),
        question_executor=WorkerPool(
            1,
            memory_limit_bytes=memory_limit_bytes,
            preload=PRELOAD if preload else (),
            ready_check=questions.autograd_runs,
        ),
    )


class InlineExecutor(cf.Executor):
    """Runs each call in `submit` itself, in the caller's thread (AppTest, which cannot poll)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        """Call `fn` now; its future is done when this returns."""
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed back through the future
            future.set_exception(exc)
        return future


def thread_service(workers: int | None = None, *, inline: bool = False) -> SweepService:
    """Sweeps on threads of this process (or inline): no isolation, for tests and scripts that
    patch the engine. A cancel lands after the probe in flight."""
    executor = InlineExecutor() if inline else cf.ThreadPoolExecutor(workers or 4)
    return SweepService(executor, ThreadChannel)


def dask_service(address: Any) -> SweepService:
    """Sweeps on the Dask cluster whose scheduler is at `address` (or a `LocalCluster`)."""
    import distributed

    client = distributed.Client(address)
    return SweepService(
        client.get_executor(),
        lambda: DaskChannel(client),
        memory_note=" (the Dask worker's memory limit)",
        close=client.close,
    )


def service_for(config: ServerConfig) -> SweepService:
    """The service a server configured so runs its sweeps on."""
    if config.dask_scheduler:
        return dask_service(config.dask_scheduler)
    return local_service(config.workers, config.worker_memory_bytes)
