"""A training loop's first steps at one batch size, step by step: run on a GPU, or replayed.

Owns `Loop` (each step's peaks, and what the loop as a whole says) and the two ways to get one
for the same settings: `measured_loop` runs consecutive steps on a CUDA GPU, reading
`memory_stats()` around each; `simulated_loop` asks a simulated backend's caching-allocator replay
for the same steps. Both start the same way (`allocator.LoopStart`), by default as the loop people
write does and as the replay models it: the model built on the GPU, no cache flush, the
optimizer's state made inside step 1, then step after step with nothing flushed in between, so
step 2 starts from the segments step 1 left cached (where a batch that squeezed through its
first step can die: docs/calibration/README.md). The probe's protocol (state primed, the cache
emptied before step 1), which the rows committed up to 2026-11-23 ran, stays available as
`allocator.PROBE`, so those rows are re-predicted as they ran. Calibration and
benchmarks/steady_state.py put the two side by side.

It composes a backend's parts (its built model and optimizer, its step, its replay) and reaches
the GPU only through the `torch.cuda`-like module it is handed. Must not know which batch sizes
are tried, files, or how anything is shown.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from memorymark.accounting import allocator
from memorymark.backends.base import Backend
from memorymark.backends.oom import is_oom
from memorymark.measurement import Measurement

LOOP_STEPS = 5
"""Consecutive steps a calibration probe runs: as many as a probe ran before each row measured a
loop (its first step, a warm-up and three timed steps), so a measured verdict is no more lenient
than the committed ones. Every loop measured on an H100 settled by its second step
(docs/calibration/steady-state-*.jsonl)."""


@dataclass(frozen=True, slots=True)
class StepPeaks:
    """One step of a loop: its peaks (peak statistics reset before it), retries and outcome."""

    step: int
    """1 for the first step after setting up."""
    allocated_bytes: int | None
    """Peak allocated bytes of the step; for a step that ran out of memory, the peak reached
    before it failed where the GPU says (None where the replay does not)."""
    reserved_bytes: int | None
    """Peak reserved bytes of the step, likewise."""
    retries: int
    """Allocations that succeeded only after the allocator flushed its cache, in this step."""
    oom: bool
    """True when the step ran out of memory (the loop stops there)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: {step, oom, allocated_bytes, reserved_bytes, retries}."""
        return {
            "step": self.step,
            "oom": self.oom,
            "allocated_bytes": self.allocated_bytes,
            "reserved_bytes": self.reserved_bytes,
            "retries": self.retries,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Loop:
    """Up to `asked` consecutive steps at one batch size, and the fit policy's verdict on them."""

    steps: tuple[StepPeaks, ...]
    """Each step run, in order, up to and including the first that ran out of memory."""
    asked: int
    """Steps the loop was to run."""
    runs: bool
    """The fit policy's verdict with no margin: every step completed within the capacity
    (allocation retries allowed). Simulated: the engine's verdict on its whole replay."""
    fits: bool
    """The fit policy's verdict with the backend's margin, no allocation retry at any step."""
    allocated_bytes: int | None
    """Peak allocated bytes over the steps that finished (step 1's survive a later step's OOM);
    None when the first step ran out of memory. Simulated, for a loop that runs out of memory:
    what the replay with no limit says it would need."""
    reserved_bytes: int | None
    """Peak reserved bytes over the same steps, likewise."""
    ooms: int | None = None
    """Change of `num_ooms` over the loop (measured only)."""
    start: str = allocator.TRAINING_LOOP.name
    """How the loop reached step 1 (`allocator.LoopStart.name`): "training loop" or "probe"."""

    @property
    def oom_step(self) -> int | None:
        """The step that ran out of memory, or None when none did."""
        return next((s.step for s in self.steps if s.oom), None)

    @property
    def retries(self) -> int:
        """Allocation retries over every step run."""
        return sum(s.retries for s in self.steps)

    @property
    def finished(self) -> tuple[StepPeaks, ...]:
        """The steps that completed."""
        return tuple(s for s in self.steps if not s.oom)


def run_loop(
    backend: Backend,
    batch_size: int,
    steps: int,
    cuda: Any,
    start: allocator.LoopStart = allocator.TRAINING_LOOP,
) -> Loop:
    """The loop on `backend`, started as `start` says: measured on a CUDA backend, else (the
    simulation, or real CPU kernels standing in for a GPU) replayed from its tracked step."""
    if backend.measured:
        return measured_loop(backend, batch_size, steps, cuda, start)
    return simulated_loop(backend, batch_size, steps, start)


def measured_loop(
    backend: Backend,
    batch_size: int,
    steps: int,
    cuda: Any,
    start: allocator.LoopStart = allocator.TRAINING_LOOP,
) -> Loop:
    """Run `steps` consecutive training steps at `batch_size` on the GPU behind `cuda`
    (torch.cuda, a fake in tests), stopping at the first out-of-memory error.

    A training loop (`start`'s default) begins as a training script's process does: whatever
    the backend held is freed and the cache emptied (each thread's cuBLAS workspace too, as a
    fresh process has none), the model is built on the GPU and the optimizer made with no
    state, and step 1 runs with no flush, making the state at its optimizer step. A probe
    (`allocator.PROBE`) keeps the backend's model and primed optimizer state between loops,
    as calibration did up to 2026-11-23, and empties the cache before step 1. Around each
    step: `reset_peak_memory_stats()`, then `memory_stats()` for its peaks
    (`allocated_bytes.all.peak`, `reserved_bytes.all.peak`) and the change of
    `num_alloc_retries` (names as torch.cuda.memory_stats documents them). After an OOM the
    failed step's cycles are collected and the cache emptied, as accelerate's
    `release_memory` does, so the next loop starts from the same baseline.
    """
    ooms = _counter(cuda, "num_ooms")
    out: list[StepPeaks] = []
    built: list[tuple[Any, Any]] = []
    if start.lazy_state:
        fresh = _ran_out(_fresh, backend, cuda, built)  # the weights alone may not fit
    else:
        fresh = _ran_out(backend.resident_bytes)  # model and primed state, as a probe's
    if fresh:
        out.append(StepPeaks(1, None, None, 0, True))
    else:
        model, optimizer = built[0] if built else (backend._model, backend._optimizer)
        built.clear()
        if start.flush:
            cuda.empty_cache()
        for step in range(1, steps + 1):
            cuda.reset_peak_memory_stats()
            retries_before = _counter(cuda, "num_alloc_retries")
            failed = _ran_out(_one_step, backend, model, optimizer, batch_size, cuda)
            out.append(_step_peaks(cuda, step, retries_before, failed))
            if failed:
                break
        del model, optimizer  # a training loop's own: freed with the loop
    failed = out[-1].oom
    if failed:
        gc.collect()
        cuda.empty_cache()
    finished = [s for s in out if not s.oom]
    allocated = max((s.allocated_bytes or 0 for s in finished), default=None)
    reserved = max((s.reserved_bytes or 0 for s in finished), default=None)
    verdict = backend.policy.judge(
        oom=failed, alloc_retries=sum(s.retries for s in out), reserved_bytes=reserved
    )
    return Loop(
        steps=tuple(out),
        asked=steps,
        runs=verdict.runs,
        fits=verdict.fits,
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        ooms=_counter(cuda, "num_ooms") - ooms,
        start=start.name,
    )


def _fresh(backend: Backend, cuda: Any, built: list[tuple[Any, Any]]) -> None:
    """A training script's process before its first step, into `built`: the backend's model
    and state released, the cache and each thread's cuBLAS workspace handed back, then the
    model built on the GPU and its optimizer, with no state."""
    clear_workspaces = getattr(cuda, "clear_cublas_workspaces", None)
    if clear_workspaces is None and cuda is torch.cuda:
        # torch keeps them per (handle, stream) until told (Lightning's teardown does too).
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_workspaces is not None:
        clear_workspaces()
    built.append(backend.fresh_loop())  # releases what it held and empties the cache first


def _ran_out(function: Callable[..., object], *args: Any) -> bool:
    """Call `function`; True when it ran out of memory (the traceback, and the step's tensors
    it holds, are gone on return). Anything that is not an OOM is raised."""
    try:
        function(*args)
    except Exception as exc:
        if not is_oom(exc):
            raise
        return True
    return False


def _one_step(backend: Backend, model: Any, optimizer: Any, batch_size: int, cuda: Any) -> None:
    """One step of the backend's training step on `model`, waited for. The step zeroes
    gradients itself (set to None), as a training loop does."""
    # Its steps run untracked, as the backend's timed steps do (no gradient labelled for the
    # tracker).
    backend._timing = True
    try:
        backend.training_step.run_step(model, optimizer, batch_size, backend.device)
        cuda.synchronize()
    finally:
        backend._timing = False


def _step_peaks(cuda: Any, step: int, retries_before: int, oom: bool) -> StepPeaks:
    stats = cuda.memory_stats()
    return StepPeaks(
        step,
        int(stats.get("allocated_bytes.all.peak", 0)),
        int(stats.get("reserved_bytes.all.peak", 0)),
        int(stats.get("num_alloc_retries", 0)) - retries_before,
        oom,
    )


def _counter(cuda: Any, name: str) -> int:
    return int(cuda.memory_stats().get(name, 0))


def simulated_loop(
    backend: Backend,
    batch_size: int,
    steps: int,
    start: allocator.LoopStart = allocator.TRAINING_LOOP,
) -> Loop:
    """What the simulation predicts for `measured_loop`'s steps started as `start` says: the
    backend's probe at `batch_size` (its verdict, over the whole replay the engine runs), and
    per step the replay of a fresh process against the capacity (`Backend._predict`, the one
    the verdict reads), the backend replaying as `start` says for the call.

    The engine replays until the allocator's segments stop changing; a steady loop's later
    steps repeat its last, so the steps are filled in to `steps` with it. A replay that runs
    out of memory stops there: that step has no peaks. The steps are training steps alone, as
    `measured_loop` runs them: settings with an evaluation pass between steps are not
    calibrated here."""
    kept, backend.loop_start = backend.loop_start, start
    try:
        measurement = backend.measure(batch_size)
        tracker = backend._tracker  # the probe's tracked step, still held by the backend
        if measurement.predicted_allocated_bytes is None or tracker is None:
            # Not traced to its end (real CPU kernels past their budget): OOM at step 1.
            return _untraced(measurement, steps, start)
        bounded = backend._predict(tracker)[0]
    finally:
        backend.loop_start = kept
    per_step = replayed_steps(bounded, steps)
    finished = [s for s in per_step if not s.oom]
    if bounded.out_of_memory:
        # What the loop would need, replayed with no limit (what the search reads too).
        allocated, reserved = measurement.predicted_allocated_bytes, measurement.cuda_reserved_bytes
    else:
        allocated = max(s.allocated_bytes or 0 for s in finished)
        reserved = max(s.reserved_bytes or 0 for s in finished)
    return Loop(
        steps=per_step,
        asked=steps,
        runs=bool(measurement.runs),
        fits=measurement.fits,
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        start=start.name,
    )


def replayed_steps(bounded: allocator.Prediction, steps: int) -> tuple[StepPeaks, ...]:
    """The first `steps` steps of a replay against the capacity, one `StepPeaks` each: a
    steady replay's last step repeated to `steps`, a replay that ran out of memory up to the
    step that did (no peaks: the replay has none for it)."""
    finished = len(bounded.reserved_per_step)
    out = [
        StepPeaks(
            i + 1,
            bounded.allocated_per_step[i] if i < finished else None,
            bounded.reserved_per_step[i] if i < finished else None,
            bounded.retries_per_step[i] if i < len(bounded.retries_per_step) else 0,
            i >= finished,
        )
        for i in range(min(bounded.steps, steps))
    ]
    steady = not bounded.out_of_memory and bounded.steps < allocator.MAX_LOOP_STEPS
    while steady and out and len(out) < steps:
        last = out[-1]
        out.append(StepPeaks(len(out) + 1, last.allocated_bytes, last.reserved_bytes, 0, False))
    return tuple(out)


def _untraced(measurement: Measurement, steps: int, start: allocator.LoopStart) -> Loop:
    return Loop(
        steps=(StepPeaks(1, None, None, measurement.alloc_retries or 0, True),),
        asked=steps,
        runs=False,
        fits=False,
        allocated_bytes=None,
        reserved_bytes=None,
        start=start.name,
    )
