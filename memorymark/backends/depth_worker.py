"""A second process for the depth replay's shallower steps, so two cores trace two at once.

The depth replay (memorymark/backends/depth_replay.py) traces the model built at two depths for
every batch, GPU count and way out it is asked (four where it looks for a step's structure),
one after another, on one core. Those steps share nothing: each is its own model, optimizer
and, under FSDP, fake process group. So this process traces some depths and a worker process
traces the others, and the replay waits for the slower.

The worker is spawned once per process, on the first replay (importing torch and transformers
takes it a few seconds, while this process traces its own share), and serves requests in order
over a pipe: build a shallower backend from its `Recipe`, step it, point it at other settings,
release it. Each step's answer is its Measurement and StepRecord, plain values, or one line
saying why it failed. Where no worker can start (one core, a process that may have no
children, a hosted server, `MEMORYMARK_DEPTH_WORKER=0`) or one dies, the replay traces every
depth here, as it did before. Knows nothing of searches, reports or the UI.
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import multiprocessing
import multiprocessing.spawn
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from memorymark.limits import one_line
from memorymark.measurement import Measurement
from memorymark.settings import Settings

if TYPE_CHECKING:  # torch-free to import: the service's worker pool starts its jobs with it
    from memorymark.accounting.symbolic import StepRecord
    from memorymark.step.catalog import CatalogStep

PROCESS_NAME = "memorymark-depth-worker"
ENV_SWITCH = "MEMORYMARK_DEPTH_WORKER"
"""Set to 0 to trace every depth in this process."""
START_SECONDS = 60.0
"""How long the worker may take to import torch and transformers before the replay gives up
on it (a few seconds on a quiet 2-core machine)."""

_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Recipe:
    """What builds a shallower backend in the worker as `SimBackend.shallower` builds it here:
    the backend's class, the step, and what the full backend hands down."""

    kind: type
    step: CatalogStep
    arguments: dict[str, Any]
    """The constructor's keywords (policy, resident allocations, workspaces, CUDA rules)."""
    compute_capability: tuple[int, int]
    roofline: Any


class Worker:
    """The worker process and the pipe to it; requests are answered in the order sent."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        self._conn: Connection = ours
        spawn_without_main(PROCESS_NAME)
        self._process = context.Process(
            target=_serve, args=(theirs,), name=PROCESS_NAME, daemon=True
        )
        self._process.start()
        theirs.close()
        self._waiting: deque[int] = deque()
        """Keys of the steps asked for and not yet answered, in order."""
        self._answers: dict[int, list[Any]] = {}
        self._ready = False
        self.dead: str | None = None
        """Why the worker is no use any more; None while it serves."""

    def send(self, message: tuple[Any, ...]) -> None:
        """Send a request (a dead worker's are dropped: its steps answer with why)."""
        if self.dead is not None:
            return
        try:
            self._conn.send(message)
        except (OSError, ValueError) as exc:
            self._die(f"the depth worker is gone ({one_line(exc, 120)})")

    def ask_step(self, key: int, batch_size: int) -> None:
        """Ask backend `key` for a step at `batch_size`; `answer(key)` waits for it."""
        self._waiting.append(key)
        self.send(("step", key, batch_size))

    def answer(self, key: int) -> tuple[Measurement, StepRecord | None]:
        """The next step `key` was asked for: its measurement and record. Raises RuntimeError,
        in one line, where it failed or the worker died."""
        while not self._answers.get(key):
            if self.dead is not None:
                raise RuntimeError(self.dead)
            if not self._ready and not self._conn.poll(START_SECONDS):
                self._die("the depth worker did not start")
                continue
            try:
                reply = self._conn.recv()
            except (EOFError, OSError) as exc:
                self._die(f"the depth worker died ({type(exc).__name__})")
                continue
            self._ready = True
            answered = self._waiting.popleft()
            self._answers.setdefault(answered, []).append(reply)
        status, *rest = self._answers[key].pop(0)
        if status != "ok":
            raise RuntimeError(f"in the depth worker: {rest[0]}")
        measurement, record, names = rest
        if record is not None and record.operators is not None:
            from memorymark.accounting.tracker import renumbered

            # Operators are numbered per process in the order first seen: read as this one's.
            record = dataclasses.replace(record, operators=renumbered(record.operators, names))
        return measurement, record

    def stop(self) -> None:
        """Ask the worker to end, and make sure it does."""
        self.send(("stop",))
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.kill()
        self._conn.close()

    def _die(self, why: str) -> None:
        self.dead = why
        for key in self._waiting:
            self._answers.setdefault(key, []).append(("error", why))
        self._waiting.clear()


_WORKER: Worker | None = None
_LOCK = threading.Lock()
_PATCH_LOCK = threading.Lock()
_MAIN_FREE: set[str] = set()
"""Names of the processes started without this process's `__main__` (`spawn_without_main`)."""


def spawn_without_main(name: str) -> None:
    """Start processes named `name` (spawned, or from a forkserver) without running this
    process's `__main__` again. A child re-runs its parent's `__main__` to find functions
    defined there (`multiprocessing.spawn.prepare`); these children run functions of
    memorymark only, and `__main__` may be a script that does the whole work again (a benchmark,
    `python -c`) or, under Streamlit, the page script of the thread that started them.
    Installed once per process: popen_spawn_posix and popen_forkserver look
    `spawn.get_preparation_data` up at each start."""
    with _PATCH_LOCK:
        _MAIN_FREE.add(name)
        current = multiprocessing.spawn.get_preparation_data
        if not getattr(current, "memorymark_without_main", False):
            multiprocessing.spawn.get_preparation_data = _without_main(current)


def _without_main(prepare: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
    def preparation_data(name: str | None) -> dict[str, Any]:
        data = prepare(name)
        if name in _MAIN_FREE:
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
        return data

    preparation_data.memorymark_without_main = True  # type: ignore[attr-defined]
    return preparation_data


def switched_on() -> bool:
    """`MEMORYMARK_DEPTH_WORKER`: 0 off, 1 on; unset, on but on a hosted server
    (`MEMORYMARK_HOSTED`), whose container is sized for one job's libraries, not two
    processes' (torch and transformers alone are most of a gigabyte each)."""
    asked = os.environ.get(ENV_SWITCH, "").strip()
    if asked:
        return asked != "0"
    hosted = os.environ.get("MEMORYMARK_HOSTED", "").strip().lower()
    return hosted not in ("1", "true", "yes", "on")


def worker() -> Worker | None:
    """This process's worker, started on first use; None where none can serve."""
    global _WORKER
    if not switched_on():
        return None
    with _LOCK:
        if _WORKER is not None:
            return _WORKER if _WORKER.dead is None else None
        if not _worth_starting():
            return None
        try:
            _WORKER = Worker()
        except Exception:  # noqa: BLE001 - traced here instead, as before the worker existed
            return None
        atexit.register(_WORKER.stop)
        return _WORKER


def _worth_starting() -> bool:
    """A second core to run on, and a process allowed children."""
    if len(os.sched_getaffinity(0)) < 2:
        return False
    return not multiprocessing.current_process().daemon


_WARMED: set[str] = set()
"""The models `warm` has looked at: each config is read, and a worker warmed, once."""


def warm(settings: Settings) -> None:
    """Start the worker now, and have it build `settings`' model once on the meta device,
    where the depth replay will want it: its first build imports the model's code (4-6 s for
    Llama-3.1-70B here), which then overlaps this process's own start instead of the first
    depths it traces. Nothing where the replay would not use the worker."""
    from memorymark import models
    from memorymark.models import depth
    from memorymark.step.catalog import CatalogStep

    if settings.workload.model in _WARMED or not switched_on():
        return
    _WARMED.add(settings.workload.model)  # asked once per model: every session resolves here
    try:
        config = models.config_of(models.find_model(settings.workload.model))
    except ValueError:
        return  # an unknown model: the session says so in one line
    plan = None if config is None else depth.replayed_plan(config)
    if plan is None or not plan.worth_replaying():
        return
    pool = worker()
    if pool is not None:
        pool.send(("warm", 0, CatalogStep(settings, layers=plan.depths()[1])))


class RemoteShallower:
    """A shallower backend that lives in the worker: what the depth replay asks of one here
    (`depth_replay.ShallowerBackend`), with `begin` and `finish` to step it while this process
    steps another."""

    def __init__(self, pool: Worker, recipe: Recipe, owner: RemoteShallower | None) -> None:
        self._pool = pool
        self.key = next(_ids)
        self._step = recipe.step
        self.last_record: StepRecord | None = None
        pool.send(("open", self.key, recipe, owner.key if owner is not None else None))

    @property
    def training_step(self) -> CatalogStep:
        return self._step

    @training_step.setter
    def training_step(self, step: CatalogStep) -> None:
        self._step = step
        self._pool.send(("retarget", self.key, step))

    def begin(self, batch_size: int) -> None:
        """Ask for a step at `batch_size`, not waiting for it."""
        self._pool.ask_step(self.key, batch_size)

    def finish(self) -> Measurement:
        """The step asked for first and not yet finished; its record is `last_record`."""
        measurement, self.last_record = self._pool.answer(self.key)
        return measurement

    def measure(self, batch_size: int) -> Measurement:
        self.begin(batch_size)
        return self.finish()

    def keep_records(self) -> None:
        """The worker's backend keeps them from the start."""

    def release(self) -> None:
        self._pool.send(("release", self.key))


# -- the worker's side ---------------------------------------------------------------------------
def _serve(conn: Connection) -> None:
    """The worker's loop: one request at a time, until told to stop or the pipe closes."""
    from memorymark.accounting.tracker import operator_names

    backends: dict[int, Any] = {}
    failed: dict[int, str] = {}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        kind, *rest = message
        if kind == "stop":
            break
        key = rest[0]
        try:
            if kind == "warm":
                import torch

                with torch.device("meta"):
                    rest[1].build_model()
            elif kind == "open":
                backends[key] = _built(rest[1], backends.get(rest[2]))
            elif kind == "retarget":
                if key in backends:
                    backends[key].training_step = rest[1]
            elif kind == "release":
                failed.pop(key, None)
                backend = backends.pop(key, None)
                if backend is not None:
                    backend.release()
            elif kind == "step":
                if key in failed:
                    raise RuntimeError(failed[key])
                backend = backends[key]
                measurement = backend.measure(rest[1])
                conn.send(("ok", measurement, backend.last_record, operator_names()))
        except Exception as exc:  # noqa: BLE001 - sent back in one line; the worker goes on
            why = one_line(exc, 300)
            if kind == "step":
                conn.send(("error", why))
            elif kind != "warm":  # a warm-up that failed costs nothing: the step will say
                failed[key] = why
    for backend in backends.values():
        backend.release()


def _built(recipe: Recipe, owner: Any) -> Any:
    """The shallower backend `recipe` describes, sharing `owner`'s process group (FSDP)."""
    backend = recipe.kind(recipe.step, **recipe.arguments)
    backend.compute_capability = recipe.compute_capability
    backend.roofline = recipe.roofline
    if owner is not None and hasattr(backend, "_group_owner"):
        backend._group_owner = owner
    backend.keep_records()
    return backend
