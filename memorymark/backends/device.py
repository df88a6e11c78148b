"""The real-device backends: a CUDA or MPS GPU, and real CPU kernels under the tracker.

Thin on purpose: they reach the device through its torch module (`torch.cuda`, `torch.mps`),
which tests replace with a fake one, so all their logic outside the kernels runs in the CPU test
suite (memorymark/backends/base.py holds what every backend shares). Must not know which backend
a setting resolves to (memorymark/backends/resolve.py), which batch sizes are tried, or how
anything is shown.
"""

from __future__ import annotations

import contextlib
from typing import Any

from memorymark.accounting import throughput
from memorymark.backends.base import Backend
from memorymark.fit import FitPolicy
from memorymark.step.protocol import TrainingStep

# The `torch.cuda.memory_stats()` entries a measurement keeps (names as documented there): the
# step's peaks, and the counters the fit policy reads (an allocation retried after flushing the
# cache, an OOM).
MEMORY_STATS = (
    "allocated_bytes.all.peak",
    "reserved_bytes.all.peak",
    "active_bytes.all.peak",
    "num_alloc_retries",
    "num_ooms",
)


class DeviceBackend(Backend):
    """A real accelerator: the step runs for real and the device reports its own peak."""

    measured = True

    def __init__(
        self,
        training_step: TrainingStep,
        *,
        policy: FitPolicy,
        name: str,
        device_module: Any,
        peak_stats: bool,
        timed_steps: int = 3,
    ) -> None:
        super().__init__(training_step, policy=policy)
        self.name = self.device = name
        self._module = device_module
        # torch.cuda keeps peak statistics; torch.mps does not, so there the tracker's peak
        # (live tensor bytes on the device) is the measurement.
        self._peak_stats = peak_stats
        self.timed_steps = timed_steps
        """Steps timed (after one warm-up) for the median step time of a probe that fit."""

    def _reset_device_peak(self) -> None:
        if self._peak_stats:
            self._module.reset_peak_memory_stats()

    def _device_peak(self) -> tuple[int, int | None] | None:
        if not self._peak_stats:
            return None
        return self._module.max_memory_allocated(), self._module.max_memory_reserved()

    def _device_stats(self) -> dict[str, int] | None:
        if not self._peak_stats:
            return None
        stats = self._module.memory_stats()
        return {name: int(stats.get(name, 0)) for name in MEMORY_STATS}

    def _synchronize(self) -> None:
        self._module.synchronize()

    def _time_steps(self, batch_size: int) -> float:
        # Untracked steps: the tracker's Python work per operator would slow the timed ones.
        def step() -> None:
            self.training_step.run_step(
                self._built_model(), self._optimizer, batch_size, self.device
            )

        self._timing = True
        try:
            return throughput.time_step(step, self._synchronize, steps=self.timed_steps)
        finally:
            self._timing = False

    def _empty_cache(self) -> None:
        self._module.empty_cache()


class CpuBackend(Backend):
    """Real CPU kernels under the same tracker as `sim`: checks the simulation on small models."""

    name = "cpu"
    measured = False
    device = "cpu"

    def __init__(
        self,
        training_step: TrainingStep,
        *,
        policy: FitPolicy,
        resident_allocations: tuple[int, ...] = (),
        thread_workspace: tuple[int, ...] = (),
    ) -> None:
        # Real tensors: the tracker stops the step at the capacity before it exhausts this
        # machine's memory (no required bytes past it, unlike the simulation).
        super().__init__(
            training_step,
            policy=policy,
            budget_bytes=policy.capacity_bytes,
            resident_allocations=resident_allocations,
            thread_workspace=thread_workspace,
        )

    def _step_context(self) -> contextlib.AbstractContextManager[object]:
        return self._user_code(self.device)
