"""The measurement every backend shares: one step at one batch size, tracked, OOM-safe.

`Backend.measure(batch_size)` builds the model and optimizer state once (they stay resident between
probes, as in training), runs one step under the memory tracker, catches an OOM, cleans up so the
next probe starts from the same baseline, and returns a `Measurement` judged by the one fit policy
(memorymark/fit.py). A simulated step traces to its end whatever its size: its allocations are
replayed through the caching-allocator model against the capacity (what the GPU would reserve
decides), and, past it, with no limit to say what the step would need; its operators are costed for
an estimated throughput. A real device reports its own peak, reserved bytes and allocation retries,
read right after the first step, and then times further steps. When the settings ask for an
evaluation pass, it runs after the step, inside the same tracked region, logged as an event log of
its own that the allocator replay runs between training steps; its peak is read apart from the
step's (`Measurement.eval_peak_bytes`), and the loop with it decides the verdict. Subclasses say
only where tensors live and how the device reports its own peak and time. This module knows
nothing about which batch sizes are tried.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from memorymark.accounting import allocator, throughput
from memorymark.accounting.symbolic import StepRecord
from memorymark.accounting.throughput import Roofline, WorkCounter
from memorymark.accounting.tracker import CompiledStepTracker, MemoryTracker
from memorymark.backends import user_code
from memorymark.backends.oom import StepError, is_oom
from memorymark.fit import FitPolicy
from memorymark.limits import MAX_ERROR_CHARS, one_line
from memorymark.measurement import Breakdown, Category, DepthReplay, Measurement, ValueRead
from memorymark.step import paging, quantization
from memorymark.step.protocol import EvaluatingStep, Phase, TrainingStep, evaluates
from memorymark.step.user_job import SimulationError
from memorymark.units import size_text

# The category of what each phase of the step allocates (and does not label otherwise:
# gradients are labelled as they accumulate, optimizer state when it is created).
PHASE_CATEGORY: dict[Phase, Category] = {
    Phase.FORWARD: Category.ACTIVATIONS,
    Phase.LOGITS: Category.LOGITS,
    Phase.BACKWARD: Category.TEMPORARY,
    Phase.OPTIMIZER: Category.TEMPORARY,
}


@dataclass(frozen=True, slots=True)
class _EvalPass:
    """What a probe's evaluation pass left, read apart from its training step's figures."""

    log: allocator.EventLog
    """Its allocations and frees, numbered after the step's: what the replay runs between."""
    peak_bytes: int
    """The tracker's live peak during the pass, the training state included."""
    step_breakdown: Breakdown
    """The training step's peak breakdown, taken before the pass could move the tracker's."""
    step_device_peak: tuple[int, int | None] | None
    """The device's (allocated, reserved) peak over the step, read before the pass."""
    device_peak: tuple[int, int | None] | None
    """The device's (allocated, reserved) peak over the pass alone, or None (tracked)."""

    def held_bytes(self) -> int:
        """What the device held for the pass: reserved where it says, else live bytes."""
        if self.device_peak is None:
            return self.peak_bytes
        allocated, reserved = self.device_peak
        return reserved if reserved is not None else allocated


class Backend:
    """Turns a batch size into a Measurement. Subclasses set `name`, `measured`, `device`."""

    name = "base"
    measured = False
    device = "cpu"
    holds_memory = True
    """False when tensors allocate nothing (fake tensors): releasing needs no collection then."""

    def __init__(
        self,
        training_step: TrainingStep,
        *,
        policy: FitPolicy,
        budget_bytes: int | None = None,
        resident_allocations: tuple[int, ...] = (),
        thread_workspace: tuple[int, ...] = (),
    ) -> None:
        self.training_step = training_step
        self.policy = policy
        """Capacity and margin every verdict of this backend is judged against."""
        self.budget_bytes = budget_bytes
        """Live bytes past which the tracker raises an OOM: for real CPU tensors, which must not
        exhaust this machine (None: the step traces to its end, or the device says OOM)."""
        self.resident_allocations = resident_allocations
        """Requests made through the allocator outside tracked storages before the step, kept
        through it: the simulated replay serves them after setting up."""
        self.thread_workspace = thread_workspace
        """What each thread that runs matmuls takes from the allocator at its first cuBLAS call
        (its cuBLAS workspace): the tracker logs it where the step's forward and backward
        first reach cuBLAS (memorymark/gpus/workspaces.py)."""
        self._model: nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._tracker: MemoryTracker | None = None
        self._failed_tracker: MemoryTracker | None = None
        """The tracker of a preparation that ran out of memory: its peak is what was reached."""
        self.roofline: Roofline | None = None
        """Peak rates of the target GPU for an estimated throughput (simulated steps only; set
        by `resolve.simulated_backend`). None: no estimate."""
        self.loop_start = allocator.PROBE if self.measured else loop_start(training_step)
        """How the loop judged reaches its first step. Simulated: the loop the step says it
        runs in (a training loop: no flush, optimizer state made in step 1). Measured: a
        probe's own protocol (state primed, cache emptied before the step), which is what a
        real device's figures are for. Set `allocator.PROBE` to replay as a probe measures."""
        self._timing = False
        self._counters_before: dict[str, int] = {}
        self._quantized_bytes: int | None = None
        self._autocast_seen: dict[str, None] = {}
        """Autocast dtypes a user's step entered since the last measurement (in order)."""

    # -- what subclasses provide -------------------------------------------------------------
    def _step_context(self) -> contextlib.AbstractContextManager[object]:
        """Entered around building and stepping (the simulation's fake mode)."""
        return contextlib.nullcontext()

    def _build_model(self) -> nn.Module:
        with torch.device(self.device), self._user_code(self.device):
            return self.training_step.build_model()

    def _user_code(self, host: str) -> contextlib.AbstractContextManager[object]:
        """Around a user's code on this machine: its `cuda` calls run on `host` (the `cpu` and
        simulated backends; a real GPU runs them as written)."""
        if self.training_step.user_code and not self.measured:
            compiling = self.training_step.settings.workload.compile
            return user_code.on_host(host, self._autocast_seen, compiling=compiling)
        return contextlib.nullcontext()

    @property
    def graph_breaks(self) -> tuple[str, ...]:
        """Where the compiled step's graphs broke ("file:line: reason"); the simulation
        records them (memorymark/step/compiled.py), other backends report none."""
        return ()

    def _autocast_dtypes(self) -> tuple[str, ...] | None:
        """The autocast dtypes a user's step entered since the last call; None where they are
        not observed (the catalog's step, a real GPU)."""
        if not self.training_step.user_code or self.measured:
            return None
        seen = tuple(self._autocast_seen)
        self._autocast_seen.clear()
        return seen

    def _value_reads(self) -> tuple[ValueRead, ...]:
        """The places the step read a tensor's value that had none (fake tensors), since the
        last call."""
        return ()

    def _reset_device_peak(self) -> None:
        """Start the device's own peak counters afresh (CUDA); nothing for tracked backends."""

    def _device_peak(self) -> tuple[int, int | None] | None:
        """(allocated, reserved) peak bytes from the device, or None to use the tracker's."""
        return None

    def _device_stats(self) -> dict[str, int] | None:
        """The device's allocator counters and peaks now (CUDA's `memory_stats()`), or None."""
        return None

    def _synchronize(self) -> None:
        """Wait for queued kernels, so the step's seconds are real."""

    def _time_steps(self, batch_size: int) -> float | None:
        """Seconds of one step as the device runs it (real devices), or None (simulated)."""
        return None

    def _empty_cache(self) -> None:
        """Return cached blocks to the device (before each probe, and after an OOM)."""

    def _run_optimizer(self, optimizer_phase: Callable[[], None]) -> None:
        """Run the step's optimizer phase (the simulation may stand in for it)."""
        optimizer_phase()

    def _distribute(self, model: nn.Module) -> nn.Module:
        """Spread the built model over ranks (distributed backends); one GPU keeps it whole."""
        return model

    def _build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer | None:
        """The optimizer the settings ask for (a distributed backend may shard it)."""
        return self.training_step.build_optimizer(model)

    # -- the shared measurement ----------------------------------------------------------------
    def measure(self, batch_size: int) -> Measurement:
        """Run one step at `batch_size` and report its peak and the policy's verdict."""
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1 (got {batch_size})")
        error = evaluation = None
        seconds = work = device = None
        eval_batch = evaluates(self.training_step)
        evaluating = False
        if self.training_step.user_code and not self.holds_memory:
            # A user's model may build state in its first forward (a positional-encoding table,
            # a cached mask) that a fresh process builds inside step 1, where it changes how
            # the allocator carves its segments: each simulated probe starts from a fresh model,
            # so its step is the first a process runs (benchmarks/fit_window.py).
            self.release()
        try:
            tracker = self._prepare()
            tracker.reset_peak()
            # Cached segments of earlier probes would count in this probe's peak reserved bytes:
            # hand them back first, so a measured probe reports its own (as the simulation's
            # fresh-process prediction does).
            self._empty_cache()
            self._reset_device_peak()
            self._counters_before = self._device_stats() or {}
            work = tracker.work_counter = self._work_counter()
            # A flush the user's step makes (HF Trainer's `torch_empty_cache_steps`) is
            # replayed where it was made.
            flushes = user_code.hearing_flushes(functools.partial(_log_flush, tracker))
            with self._step_context(), tracker, flushes:
                self.training_step.run_step(
                    self._built_model(),
                    self._optimizer,
                    batch_size,
                    self.device,
                    self._on_phase,
                    self._run_optimizer,
                )
                if eval_batch is not None:
                    evaluating = True
                    evaluation = self._evaluate(tracker, eval_batch)
                    evaluating = False
            self._synchronize()
            # The first step's own figures, before timed steps add theirs.
            step_peak = evaluation.step_device_peak if evaluation else self._device_peak()
            device = step_peak, self._device_stats()
            seconds = self._time_steps(batch_size)
        except Exception as exc:  # everything that is not an OOM is re-raised below
            if isinstance(exc, SimulationError):
                raise  # one line naming the user's code already
            if isinstance(exc, ValueError) and self._tracker is None:
                raise  # the settings cannot build this model (LoRA targets, checkpointing...)
            if not is_oom(exc):
                stage = (
                    f"the evaluation pass failed at eval batch {eval_batch}"
                    if evaluating
                    else f"the training step failed at batch {batch_size}"
                )
                raise StepError(
                    f"{stage}: {type(exc).__name__}: {one_line(exc, MAX_ERROR_CHARS)}"
                ) from exc
            error = one_line(exc, MAX_ERROR_CHARS)
            if evaluating:
                error = f"in the evaluation pass (eval batch {eval_batch}): {error}"
        finally:
            if self._tracker is not None:
                self._tracker.work_counter = None
            self._after_step(failed=error is not None)
        if device is None:
            device = self._device_peak(), self._device_stats()
        return self._result(batch_size, error, seconds, work, *device, evaluation)

    def measurement_of(self, batch_size: int, record: StepRecord) -> Measurement:
        """The Measurement of the step `record` describes, at `batch_size`, judged as a traced
        one is (`replayed` says it was read off traced steps)."""
        work = None
        if record.work is not None and self.roofline is not None:
            work = WorkCounter(self.roofline)
            work.add_all(record.work)  # the same parts in the same order: the same sums
        return self._result(batch_size, None, None, work, None, None, tracked=record)

    def _built_model(self) -> nn.Module:
        """The model `_build` made (the step runs on it); an error before the first build."""
        if self._model is None:
            raise RuntimeError("no model built yet: measure() builds it first")
        return self._model

    def _evaluate(self, tracker: MemoryTracker, eval_batch: int) -> _EvalPass:
        """Run the step's evaluation pass right after its training step, as a loop that
        evaluates between steps does, logged as an event log of its own (numbered after the
        step's, what `allocator.replay` runs `between` steps). Its peak is read apart: the
        tracker's timeline, peak and event log are the step's again afterwards."""
        self._synchronize()
        step_device_peak = self._device_peak()
        breakdown = tracker.peak_breakdown()
        with tracker.pass_apart() as apart:
            self._reset_device_peak()
            # `evaluates` found the step's run_eval (a catalog step asked for an eval batch).
            step = cast(EvaluatingStep, self.training_step)
            step.run_eval(self._built_model(), eval_batch, self.device, self._on_phase)
            if self.training_step.settings.workload.eval_accumulation is not None:
                # Trainer empties the cache each time it moves the kept predictions to the
                # CPU (transformers/trainer.py `evaluation_loop`), and only then.
                tracker.events.append(allocator.EMPTY_CACHE)
                self._empty_cache()
            self._synchronize()
        return _EvalPass(
            apart.log, apart.peak_bytes, breakdown, step_device_peak, self._device_peak()
        )

    @property
    def depth_replay(self) -> DepthReplay | None:
        """How the full-depth steps were had, where a simulation replayed the model's depth
        (memorymark/backends/sim.py); None here: every step runs the whole model."""
        return None

    def resident_bytes(self) -> dict[str, int]:
        """Bytes by category held before the first step: the model (spread over ranks when
        the settings say so) and the optimizer's primed state; gradients are None by then."""
        tracker = self._prepare()
        return {c.value: n for c, n in tracker.live_by_category.items()}

    def fresh_loop(self) -> tuple[nn.Module, torch.optim.Optimizer | None]:
        """The model and optimizer as a training script's process holds them before its first
        step: what this backend held released first (its cache emptied), then both built as
        a probe builds them, untracked, the optimizer with no state yet (it makes it at its
        first step). For a training loop run on the device (memorymark/calibration/loop.py);
        probes go on priming their own."""
        self.release()
        model = self._build_model()
        with self._step_context():
            model = self._distribute(model)
        return model, self._build_optimizer(model)

    def release(self) -> None:
        """Free the model, optimizer state and cached memory (the sweep calls this at the end)."""
        self._model = self._optimizer = self._tracker = None
        if self.holds_memory:
            gc.collect()
            self._empty_cache()

    def _prepare(self) -> MemoryTracker:
        if self._tracker is not None:
            return self._tracker
        model = self._build_model()
        compiled = self.training_step.settings.workload.compile
        tracker_type = CompiledStepTracker if compiled else MemoryTracker
        tracker = self._failed_tracker = tracker_type(self.budget_bytes)
        tracker.thread_workspace = self.thread_workspace
        # What spreading the model over ranks allocates besides parameter shards is DDP's
        # gradient buckets. The whole model is counted only as it is once spread: a sharded
        # run builds it on the meta device and materialises shards (torchtitan), so the
        # unsharded weights never take device memory.
        tracker.phase_category = Category.GRADIENTS
        with self._step_context(), tracker:
            model = self._distribute(model)
        # Weights and optimizer state alone may exceed the budget: that is an OOM at any batch.
        # With what the model function made besides the model (EMA weights): weights held
        # from before the first step to the end, as the model's are.
        alongside = getattr(self.training_step, "alongside", ())
        tracker.track_all([*model.parameters(), *model.buffers(), *alongside], Category.PARAMETERS)
        optimizer = self._build_optimizer(model)
        tracker.phase_category = Category.OPTIMIZER_STATE
        tracker.mark_state()  # a training loop makes what follows in its first step
        with self._step_context(), tracker:
            self._prime(model, optimizer, tracker)
        self._failed_tracker = None
        if optimizer is not None:
            tracker.track_all(list(optimizer.state.values()), Category.OPTIMIZER_STATE)
        tracker.mark_baseline()  # what a fresh process allocates before its first step
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._label_gradient)
        self._model, self._optimizer, self._tracker = model, optimizer, tracker
        if self.training_step.settings.workload.quantization != "none":
            self._quantized_bytes = quantization.quantized_bytes(model)
        return tracker

    def _prime(
        self, model: nn.Module, optimizer: torch.optim.Optimizer | None, tracker: MemoryTracker
    ) -> None:
        """Create the optimizer's state before the first probe, as a first step would."""
        self.training_step.prime_optimizer(model, optimizer)

    def _label_gradient(self, param: torch.Tensor) -> None:
        if self._tracker is not None and param.grad is not None and not self._timing:
            self._tracker.track(param.grad, Category.GRADIENTS)

    def _on_phase(self, phase: Phase) -> None:
        if self._tracker is not None:
            self._tracker.phase_category = PHASE_CATEGORY[phase]
            if phase is Phase.OPTIMIZER:
                self._tracker.mark_optimizer()
            # On CUDA, autograd runs the backward pass on a device thread of its own.
            self._tracker.backward_thread = phase is Phase.BACKWARD

    def _after_step(self, *, failed: bool) -> None:
        if self._model is not None:
            self._model.zero_grad(set_to_none=True)
        if failed:
            # A failed step's traceback held its activations; by now it is gone, so collect the
            # cycles it left and hand cached blocks back, as accelerate's release_memory does.
            # After a step that fit, reference counting has already freed everything, and a
            # full collection would cost a quarter of a simulated BERT step.
            gc.collect()
            self._empty_cache()

    def _work_counter(self) -> WorkCounter | None:
        # Only a simulated step needs its work counted; a real device times its own.
        if self.measured or self.roofline is None:
            return None
        return WorkCounter(self.roofline)

    def _result(
        self,
        batch_size: int,
        error: str | None,
        seconds: float | None,
        work: WorkCounter | None,
        device_peak: tuple[int, int | None] | None,
        stats: dict[str, int] | None,
        evaluation: _EvalPass | None = None,
        tracked: StepRecord | None = None,
    ) -> Measurement:
        """The Measurement of the step the tracker saw, or of `tracked`, a step the symbolic
        sweep read off traced ones (memorymark/accounting/symbolic.py) instead."""
        tracker: MemoryTracker | StepRecord | None = (
            tracked or self._tracker or self._failed_tracker
        )
        traced = error is None and (tracked is not None or self._tracker is not None)
        tracked_peak = tracker.peak_bytes if tracker is not None else 0
        peak, reserved = device_peak if device_peak is not None else (tracked_peak, None)
        if evaluation is not None and evaluation.device_peak is not None and reserved is not None:
            reserved = max(reserved, evaluation.held_bytes())  # the loop's, as CUDA reports it
        prediction = retries = required = demand = loop = None
        if traced and not self.measured and tracker is not None:
            between = evaluation.log if evaluation is not None else None
            loop, prediction, demand = self._predict(tracker, between)
            required, retries = prediction.reserved_bytes, loop.alloc_retries
            if loop.out_of_memory:
                error = self._allocator_oom(required)
        elif error is None:
            # Measured: what the device held (reserved where it says, else live tensor bytes).
            required = reserved if reserved is not None else peak
            if evaluation is not None and reserved is None:
                required = max(required, evaluation.held_bytes())
            retries = self._counter_delta(stats, "num_alloc_retries")
        verdict = self.policy.judge(
            oom=error is not None, alloc_retries=retries, reserved_bytes=required
        )
        if error is None and not verdict.runs:
            error = self._past_capacity(required)
        note = self._retry_note(retries) if verdict.runs and retries else None
        ran = verdict.runs
        samples = batch_size * self.training_step.settings.workload.grad_accum
        sps, source = self._throughput(samples, seconds, work) if ran else (None, None)
        paged = self._paged_bytes(tracker)
        return Measurement(
            quantized_weight_bytes=self._quantized_bytes
            if tracked is None
            else tracked.quantized_weight_bytes,
            paged_bytes=paged,
            pages_to_host=None
            if paged is None
            else ran and paging.pages_to_host(required, paged, self.policy.capacity_bytes),
            batch_size=batch_size,
            fits=verdict.fits,
            runs=verdict.runs,
            peak_bytes=peak,
            reserved_bytes=reserved,
            required_bytes=required,
            demand_bytes=demand,
            alloc_retries=retries,
            memory_stats=stats,
            predicted_allocated_bytes=prediction.allocated_bytes if prediction else None,
            predicted_reserved_bytes=_first_step_reserved(prediction),
            loop_reserved_bytes=prediction.reserved_bytes if prediction else None,
            predicted_retries=loop.retries_per_step if loop else None,
            loop_steps=loop.steps if loop else None,
            loop_start=self.loop_start.name,
            breakdown=self._breakdown(tracker, evaluation) if traced else None,
            eval_peak_bytes=self._eval_peak(evaluation),
            step_seconds=seconds if ran and self.measured else None,
            samples_per_second=sps,
            throughput_source=source,
            step_flops=work.flops if ran and work is not None else None,
            backend=self.name,
            measured=self.measured,
            error=error or note,
            timeline=tuple(tracker.timeline) if traced and tracker is not None else (),
            value_reads=self._value_reads() if tracked is None else (),
            autocast_dtypes=self._autocast_dtypes() if tracked is None else None,
            graph_breaks=self.graph_breaks,
            replayed=tracked is not None,
        )

    @staticmethod
    def _breakdown(
        tracker: MemoryTracker | StepRecord | None, evaluation: _EvalPass | None
    ) -> Breakdown | None:
        """The training step's peak breakdown (taken before an evaluation pass, if any)."""
        if evaluation is not None:
            return evaluation.step_breakdown
        return tracker.peak_breakdown() if tracker is not None else None

    @staticmethod
    def _eval_peak(evaluation: _EvalPass | None) -> int | None:
        """The evaluation pass's allocated peak, training state included: the device's where
        it reports one, else the tracker's live bytes."""
        if evaluation is None:
            return None
        return evaluation.device_peak[0] if evaluation.device_peak else evaluation.peak_bytes

    def _paged_bytes(self, tracker: MemoryTracker | StepRecord | None) -> int | None:
        """Optimizer state in CUDA unified memory, or None when the optimizer is not paged."""
        if not self.training_step.settings.workload.paged_optimizer:
            return None
        counted = tracker.unified_bytes if tracker is not None else 0
        state = self._optimizer.state.values() if self._optimizer is not None else ()
        return counted or paging.paged_state_bytes(state)

    def _counter_delta(self, stats: dict[str, int] | None, name: str) -> int | None:
        if stats is None or name not in stats:
            return None
        return stats[name] - self._counters_before.get(name, 0)

    def _predict(
        self, tracker: MemoryTracker | StepRecord, between: allocator.EventLog | None = None
    ) -> tuple[allocator.Prediction, allocator.Prediction, int]:
        """Replay a fresh process's training loop of this step, started as `loop_start` says,
        until its segments stop changing (`allocator.replay`): (the replay against the
        capacity, whose out-of-memory and retries at any step decide; what the loop needs,
        replayed with no limit when the capacity could not hold it; its demand). The demand is
        the loop's reserved peak with no limit (a replayed step costs about 1% of a probe):
        what the search interpolates on, since a step that ran only after a flush held less
        than it asked for. `between`: the evaluation pass's log, run after every step."""
        step = (tracker.events_first_seq, tracker.events)
        setup, resident = tracker.baseline_events, self.resident_allocations
        loop = functools.partial(
            allocator.replay,
            setup,
            step,
            resident=resident,
            steps=None,
            between=between,
            start=self.loop_start,
            state_from=tracker.state_from,
            optimizer_at=tracker.optimizer_at,
        )
        bounded = loop(self.policy.capacity_bytes)
        if not bounded.out_of_memory and not bounded.alloc_retries:
            return bounded, bounded, bounded.reserved_bytes
        unlimited = loop(None)
        needed = unlimited if bounded.out_of_memory else bounded
        return bounded, needed, unlimited.reserved_bytes

    def _allocator_oom(self, required_bytes: int) -> str:
        return (
            f"simulated out of memory: needs {size_text(required_bytes)} of "
            f"{size_text(self.policy.capacity_bytes)}"
        )

    def _past_capacity(self, required: int | None) -> str:
        return (
            f"reserved {size_text(required or 0)}, past the capacity of "
            f"{size_text(self.policy.capacity_bytes)}"
        )

    @staticmethod
    def _retry_note(retries: int) -> str:
        return (
            f"runs only after the allocator flushed its cache and retried {retries} "
            "allocation(s): not recommended, one fragmentation pattern from an out-of-memory"
        )

    @staticmethod
    def _throughput(
        batch_size: int, seconds: float | None, work: WorkCounter | None
    ) -> tuple[float | None, str | None]:
        """(samples/s, 'measured' or 'estimated') of a step that fit."""
        if seconds is not None:
            return throughput.samples_per_second(batch_size, seconds), "measured"
        if work is not None:
            return throughput.samples_per_second(batch_size, work.step_seconds), "estimated"
        return None, None

    @contextlib.contextmanager
    def session(self) -> Iterator[Backend]:
        """Use the backend and release it on the way out, however the block ends."""
        try:
            yield self
        finally:
            self.release()


def _log_flush(tracker: MemoryTracker) -> None:
    """A `torch.cuda.empty_cache()` the step made, into its event log."""
    tracker.events.append(allocator.EMPTY_CACHE)


def loop_start(training_step: TrainingStep) -> allocator.LoopStart:
    """The loop `training_step` runs in: Lightning's when it says its loop empties the cache
    after setting up (`flushes_before_first_step`), else a plain training loop's."""
    if getattr(training_step, "flushes_before_first_step", False):
        return allocator.LIGHTNING_LOOP
    return allocator.TRAINING_LOOP


def _first_step_reserved(prediction: allocator.Prediction | None) -> int | None:
    """Step 1's predicted reserved peak (what a first-step measurement reports)."""
    if prediction is None:
        return None
    first = prediction.first_reserved_bytes
    return first if first is not None else prediction.reserved_bytes
