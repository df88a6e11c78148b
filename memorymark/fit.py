"""The one rule that says whether a batch size fits, for every backend alike.

A batch **runs** when its step completes with no out-of-memory error and the memory the device
must hold for it (the caching allocator's peak reserved bytes) stays within the capacity: total
memory less the CUDA context. It **fits** (is recommended) when it runs with no allocation retry
and its reserved peak also leaves the margin free. Measured on a GPU, the facts come from the
device (`memory_stats()`: OOMs, `num_alloc_retries`, the reserved peak); simulated, from the
caching allocator replay against the same capacity. The report's `max_batch_size` is the largest
batch that runs, `optimal_batch_size` the largest that fits.

A step that completes only because the allocator flushed its cache and retried a cudaMalloc
does train, so it counts towards the maximum, but it is never recommended: it is one
fragmentation pattern away from an OOM, and slower (torchtitan's memory monitor warns on the
same counter). This module is arithmetic: no torch, no devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memorymark.gpus import GPU
    from memorymark.settings import Settings


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the policy says of one step."""

    runs: bool
    """Completes within the full capacity: no OOM (allocation retries allowed)."""
    fits: bool
    """Runs with no allocation retry and leaves the margin free: what MemoryMark recommends."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FitPolicy:
    """Capacity and margin: the two numbers every fit verdict is judged against."""

    capacity_bytes: int
    """What the caching allocator can reserve on the device: total less the CUDA context."""
    margin_bytes: int = 0
    """Headroom the recommended batch keeps free below the capacity."""

    def __post_init__(self) -> None:
        if self.capacity_bytes <= 0:
            raise ValueError(f"capacity must be positive (got {self.capacity_bytes} bytes)")
        if not 0 <= self.margin_bytes < self.capacity_bytes:
            raise ValueError(
                f"the margin ({self.margin_bytes} bytes) must be below the capacity "
                f"({self.capacity_bytes} bytes)"
            )

    @classmethod
    def on(cls, settings: Settings, gpu: GPU) -> FitPolicy:
        """The policy of a run of `settings` on `gpu` as one rank sees it: what its caching
        allocator can reserve (usable memory), and the margin the settings keep below that."""
        capacity = gpu.usable_bytes
        return cls(capacity_bytes=capacity, margin_bytes=settings.margin_bytes(capacity))

    @property
    def limit_bytes(self) -> int:
        """Capacity less the margin: what a recommended batch's reserved peak must stay within."""
        return self.capacity_bytes - self.margin_bytes

    def judge(self, *, oom: bool, alloc_retries: int | None, reserved_bytes: int | None) -> Verdict:
        """The verdict on a step: whether it ran out of memory, how many allocations were retried
        (None: the device does not say), and its peak reserved bytes (None: unknown)."""
        runs = not oom and (reserved_bytes is None or reserved_bytes <= self.capacity_bytes)
        fits = runs and not alloc_retries
        fits = fits and (reserved_bytes is None or reserved_bytes <= self.limit_bytes)
        return Verdict(runs=runs, fits=fits)
