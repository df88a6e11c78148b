"""The measurement every backend shares: one step at one batch size, tracked, OOM-safe.

`Backend.measure(batch_size)` builds the model and optimizer state once (they stay resident
between probes, as in training), runs one step under the memory tracker, catches an OOM, cleans
up so the next probe starts from the same baseline, and returns a `Measurement`. A simulated
step's allocations are replayed through the caching-allocator model (what the GPU would reserve
decides whether it fits) and its operators are costed for an estimated throughput; a real device
reports its own peak and times its steps. Subclasses say only where tensors live and how the
device reports its own peak and time. This module knows nothing about which batch sizes are tried.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import torch
from torch import nn

from memorymark import allocator, throughput
from memorymark.measurement import Measurement
from memorymark.oom import StepError, is_oom, one_line
from memorymark.throughput import Roofline, WorkCounter
from memorymark.tracker import MemoryTracker
from memorymark.workload import Workload


class Backend:
    """Turns a batch size into a Measurement. Subclasses set `name`, `measured`, `device`."""

    name = "base"
    measured = False
    device = "cpu"
    holds_memory = True
    """False when tensors allocate nothing (fake tensors): releasing needs no collection then."""

    def __init__(
        self, workload: Workload, *, capacity_bytes: int, budget_bytes: int | None = None
    ) -> None:
        self.workload = workload
        self.capacity_bytes = capacity_bytes
        """Bytes the step may use on the target GPU: what the fast strategy predicts against."""
        self.budget_bytes = budget_bytes
        """Live bytes past which the tracker raises an OOM (None: only the device's own limit)."""
        self._model: nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._tracker: MemoryTracker | None = None
        self._failed_tracker: MemoryTracker | None = None
        """The tracker of a preparation that ran out of memory: its peak is what was reached."""
        self.roofline: Roofline | None = None
        """Peak rates of the target GPU for an estimated throughput (simulated steps only; set
        by `devices.open_backend`). None: no estimate."""
        self._timing = False

    # -- what subclasses provide -------------------------------------------------------------
    def _step_context(self) -> contextlib.AbstractContextManager[object]:
        """Entered around building and stepping (the simulation's fake mode)."""
        return contextlib.nullcontext()

    def _build_model(self) -> nn.Module:
        with torch.device(self.device):
            return self.workload.build_model()

    def _reset_device_peak(self) -> None:
        """Start the device's own peak counters afresh (CUDA); nothing for tracked backends."""

    def _device_peak(self) -> tuple[int, int | None] | None:
        """(allocated, reserved) peak bytes from the device, or None to use the tracker's."""
        return None

    def _synchronize(self) -> None:
        """Wait for queued kernels, so the step's seconds are real."""

    def _time_steps(self, batch_size: int) -> float | None:
        """Seconds of one step as the device runs it (real devices), or None (simulated)."""
        return None

    def _empty_cache(self) -> None:
        """Return cached blocks to the device (before each probe, and after an OOM)."""

    # -- the shared measurement ----------------------------------------------------------------
    def measure(self, batch_size: int) -> Measurement:
        """Run one step at `batch_size` and report its peak, or the OOM it hit."""
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1 (got {batch_size})")
        error = None
        seconds = work = None
        try:
            tracker = self._prepare()
            tracker.reset_peak()
            # Cached segments of earlier probes would count in this probe's peak reserved bytes:
            # hand them back first, so a measured probe reports its own (as the simulation's
            # fresh-process prediction does).
            self._empty_cache()
            self._reset_device_peak()
            work = tracker.work_counter = self._work_counter()
            with self._step_context(), tracker:
                self.workload.run_step(
                    self._model, self._optimizer, batch_size, self.device, self._on_phase
                )
            self._synchronize()
            seconds = self._time_steps(batch_size)
        except Exception as exc:  # noqa: BLE001 - everything that is not an OOM is re-raised
            if isinstance(exc, ValueError) and self._tracker is None:
                raise  # the settings cannot build this model (LoRA targets, checkpointing...)
            if not is_oom(exc):
                raise StepError(
                    f"the training step failed at batch {batch_size}: "
                    f"{type(exc).__name__}: {one_line(exc)}"
                ) from exc
            error = one_line(exc)
        finally:
            if self._tracker is not None:
                self._tracker.work_counter = None
            self._after_step(failed=error is not None)
        return self._result(batch_size, error, seconds, work)

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
        optimizer = self.workload.build_optimizer(model)
        tracker = self._failed_tracker = MemoryTracker(self.budget_bytes)
        # Weights and optimizer state alone may exceed the budget: that is an OOM at any batch.
        tracker.track_all([*model.parameters(), *model.buffers()], "parameters")
        tracker.phase_category = "optimizer_state"
        with self._step_context(), tracker:
            self.workload.prime_optimizer(model, optimizer)
        self._failed_tracker = None
        if optimizer is not None:
            tracker.track_all(list(optimizer.state.values()), "optimizer_state")
        tracker.mark_baseline()  # what a fresh process allocates before its first step
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._label_gradient)
        self._model, self._optimizer, self._tracker = model, optimizer, tracker
        return tracker

    def _label_gradient(self, param: torch.Tensor) -> None:
        if self._tracker is not None and param.grad is not None and not self._timing:
            self._tracker.track(param.grad, "gradients")

    def _on_phase(self, category: str) -> None:
        if self._tracker is not None:
            self._tracker.phase_category = category

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
        self, batch_size: int, error: str | None, seconds: float | None, work: WorkCounter | None
    ) -> Measurement:
        tracker = self._tracker or self._failed_tracker
        tracked_peak = tracker.peak_bytes if tracker is not None else 0
        device_peak = self._device_peak()
        peak, reserved = device_peak if device_peak is not None else (tracked_peak, None)
        prediction = None
        if error is None and not self.measured and self._tracker is not None:
            prediction = self._predict(self._tracker)
            if prediction.out_of_memory:
                error = self._allocator_oom(prediction)
        fits = error is None
        sps, source = self._throughput(batch_size, seconds, work) if fits else (None, None)
        return Measurement(
            batch_size=batch_size,
            fits=fits,
            peak_bytes=peak,
            reserved_bytes=reserved,
            predicted_allocated_bytes=prediction.allocated_bytes if prediction else None,
            predicted_reserved_bytes=prediction.reserved_bytes if prediction else None,
            breakdown=tracker.peak_breakdown() if fits and tracker is not None else None,
            step_seconds=seconds if fits and self.measured else None,
            samples_per_second=sps,
            throughput_source=source,
            step_flops=work.flops if fits and work is not None else None,
            backend=self.name,
            measured=self.measured,
            error=error,
            timeline=tuple(tracker.timeline) if fits and tracker is not None else (),
        )

    def _predict(self, tracker: MemoryTracker) -> allocator.Prediction:
        """The caching allocator's view of a fresh process running this step, on the budget."""
        step = (tracker.events_first_seq, tracker.events)
        return allocator.replay(tracker.baseline_events, step, self.budget_bytes)

    def _allocator_oom(self, prediction: allocator.Prediction) -> str:
        return (
            f"simulated out of memory: the CUDA caching allocator would need another "
            f"{_size(prediction.requested_bytes)} segment past a budget of "
            f"{_size(self.budget_bytes or 0)}"
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


def _size(n_bytes: int) -> str:
    """Bytes for a message: GiB from 1 GiB up, else MiB."""
    return f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.1f} MiB"
