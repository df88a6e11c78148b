"""The committed real-GPU evidence re-simulated with today's engine, like for like.

Owns re-simulating a row as it ran (`repredict`: the GPU's own kernels at the capacity it was
capped at, its torch's cuBLAS workspaces, the same steps started the same way (a probe's for
the rows of 2026-11-23, a training loop's for rows that say so), the measured bytes compared
over the steps they are the peak of) and sorting the results (`near_capacity`,
`recommended_with_retries`, `error_stats`). The rows come from memorymark/calibration/evidence.py.
Must not know where the files are or how anything is shown: benchmarks/calibration_table.py
reads the files and prints.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from memorymark import gpus
from memorymark.accounting import allocator
from memorymark.backends.base import Backend
from memorymark.backends.oom import StepError
from memorymark.calibration.evidence import Evidence
from memorymark.calibration.loop import Loop, simulated_loop
from memorymark.calibration.run import as_run
from memorymark.cuda_rules import versions
from memorymark.engine import Session

NEAR_CAPACITY = 0.85
"""A row is near the capacity (a boundary row) from this fraction of it up."""
BOUNDARY_DEFINITION = (
    "boundary rows: marked by calibrate (recommended, max fits, max+step OOM), out of memory "
    "on the GPU or in the re-prediction, or reserving at least "
    f"{NEAR_CAPACITY:.0%} of the capacity (measured, or re-predicted); every other row is far "
    "below capacity"
)


@dataclass(frozen=True, slots=True)
class Reprediction:
    """One row of evidence and what the current engine says of it."""

    evidence: Evidence
    loop: Loop | None
    """The replay of the same steps (None when the engine could not simulate it: `error`)."""
    allocated_bytes: int | None = None
    """Predicted peak allocated bytes over the evidence's `byte_steps` (what the loop would
    need when the replay runs out of memory in them)."""
    reserved_bytes: int | None = None
    seconds: float = 0.0
    error: str | None = None
    """Why the engine could not simulate the row any more (its settings refused, the step
    failing); None when it did."""

    @property
    def runs(self) -> bool:
        return self.loop is not None and self.loop.runs

    @property
    def recommended(self) -> bool:
        """The re-prediction recommends this batch: it runs with no retry inside the margin."""
        return self.loop is not None and self.loop.fits

    @property
    def agrees(self) -> bool:
        return self.loop is not None and self.runs == self.evidence.measured_runs

    @property
    def allocated_error(self) -> float | None:
        return _relative(self.allocated_bytes, self.evidence.measured_allocated_bytes)

    @property
    def reserved_error(self) -> float | None:
        return _relative(self.reserved_bytes, self.evidence.measured_reserved_bytes)

    @property
    def near_capacity(self) -> bool:
        """A boundary row (`BOUNDARY_DEFINITION`)."""
        ev = self.evidence
        if ev.boundary_check or not ev.measured_runs or (self.loop and not self.loop.runs):
            return True
        need = max(ev.measured_reserved_bytes or 0, self.reserved_bytes or 0)
        return need >= NEAR_CAPACITY * ev.capacity_bytes


def _relative(predicted: int | None, measured: int | None) -> float | None:
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


def repredict(
    evidence: Iterable[Evidence],
    on_done: Callable[[Reprediction], None] | None = None,
    start: allocator.LoopStart | None = None,
) -> Iterator[Reprediction]:
    """Re-simulate each row as it ran: a simulated backend of its GPU's kernels at its capacity
    (one per run of consecutive rows sharing settings and GPU, as calibrate keeps one per
    combination), its loop replayed over the steps its verdict covers, started as the row's
    was (or as `start` says, to see how far another start is from what the GPU measured). A
    row the engine cannot simulate any more (its settings refused, the step failing) is
    yielded with the error."""
    backend: Backend | None = None
    key: tuple[Any, ...] | None = None
    try:
        for ev in evidence:
            began = time.perf_counter()
            try:
                if _runs_as(ev) != key or backend is None:
                    if backend is not None:
                        backend.release()
                    backend, key = None, _runs_as(ev)
                    backend = _backend(ev)
                as_ran = start or allocator.loop_start_named(ev.loop_start)
                loop = simulated_loop(backend, ev.batch_size, max(ev.verdict_steps, 1), as_ran)
                result = _compared(ev, loop, time.perf_counter() - began)
            except (ValueError, StepError) as exc:
                result = Reprediction(ev, None, error=str(exc), seconds=time.perf_counter() - began)
            if on_done is not None:
                on_done(result)
            yield result
    finally:
        if backend is not None:
            backend.release()


def _runs_as(ev: Evidence) -> tuple[Any, ...]:
    """What decides a row's backend: rows alike share one, as calibrate's batches did."""
    return ev.settings, ev.device_gpu, ev.capacity_bytes, ev.torch_version


def _backend(ev: Evidence) -> Backend:
    """A simulated backend of the GPU that ran, at the capacity it was capped at, replaying the
    cuBLAS workspaces of the torch it ran (the rest of the step is this machine's torch and
    transformers: `memorymark/cuda_rules/versions.py`)."""
    gpu = as_run(ev.device_gpu, ev.capacity_bytes, ev.capped_as)
    backend = Session(ev.settings, gpu=gpu).open_backend()
    if ev.torch_version:
        release = versions.release(ev.torch_version)
        backend.thread_workspace = gpus.thread_workspace(gpu.compute_capability, release)
    return backend


def _compared(ev: Evidence, loop: Loop, seconds: float) -> Reprediction:
    """The replay's peaks over the steps the measured bytes cover."""
    first = loop.steps[: ev.byte_steps]
    allocated: int | None
    reserved: int | None
    if first and not any(s.oom for s in first):
        allocated = max(s.allocated_bytes or 0 for s in first)
        reserved = max(s.reserved_bytes or 0 for s in first)
    else:  # out of memory within them: what the loop would need
        allocated, reserved = loop.allocated_bytes, loop.reserved_bytes
    return Reprediction(ev, loop, allocated, reserved, seconds)


def near_capacity(results: Iterable[Reprediction]) -> tuple[list[Reprediction], list[Reprediction]]:
    """(boundary rows, rows far below capacity), each in the order given."""
    boundary: list[Reprediction] = []
    far: list[Reprediction] = []
    for r in results:
        (boundary if r.near_capacity else far).append(r)
    return boundary, far


def recommended_with_retries(results: Iterable[Reprediction]) -> list[Reprediction]:
    """Rows whose steps needed an allocation retry on the GPU, at a batch the re-prediction
    recommends (a recommendation must not need one)."""
    return [r for r in results if (r.evidence.measured_retries or 0) > 0 and r.recommended]


def error_stats(errors: Iterable[float | None]) -> tuple[float, float] | None:
    """(median |error|, worst error) of the errors known, or None."""
    known = [e for e in errors if e is not None]
    if not known:
        return None
    return statistics.median(map(abs, known)), max(known, key=abs)
