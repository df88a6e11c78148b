"""What paged optimizer state (CUDA unified memory) means for the fit verdict: one rule.

bitsandbytes' paged optimizers (paged-adamw-8bit, paged-adamw-32bit) allocate each state buffer
of at least 1e5 values with `cudaMallocManaged` (bitsandbytes/functional.py `get_paged`), not
through PyTorch's caching allocator. So the state never shows in `memory_allocated` or
`memory_reserved`, and when a `cudaMalloc` of the allocator needs room, the driver evicts
unified pages to host memory and pages them back when the optimizer touches them
(bitsandbytes' docs: "automatically evict to CPU RAM when GPU memory runs out").

The rule MemoryMark applies, the same for simulated and measured steps:

- the fit verdict (fits / runs / out of memory) judges the step without the paged state, since
  the allocator never waits on it: a batch whose reserved peak fits runs;
- the paged state is reported on its own line (`paged_bytes`), outside the peak and breakdown;
- when reserved peak + paged state exceed the capacity, the step `pages_to_host`: it runs, but
  part of the optimizer state crosses PCIe at each optimizer step, so it is slower (by how much
  is not estimated). Below that, the state fits beside the step on the GPU and costs nothing.

This module knows nothing about optimizers or tensors beyond the byte counts it is given.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memorymark.units import size_text

PAGED_MIN_VALUES = 100_000
"""The smallest state buffer bitsandbytes pages (its optimizers page a buffer of at least 1e5
values, the module docstring's `get_paged` rule); smaller ones go through the allocator."""


def pages_to_host(required_bytes: int | None, paged_bytes: int, capacity_bytes: int) -> bool:
    """True when the step's reserved peak and the paged state do not fit the GPU together."""
    if not paged_bytes or required_bytes is None:
        return False
    return required_bytes + paged_bytes > capacity_bytes


def paged_state_bytes(state_values: Iterable[Any]) -> int:
    """Bytes of real paged buffers among an optimizer's state (bitsandbytes marks them
    `is_paged`); the simulation counts its own with `tracker.unified_memory()` instead."""
    total = 0
    for values in state_values:
        for t in values.values() if isinstance(values, dict) else ():
            if getattr(t, "is_paged", False):
                total += t.untyped_storage().nbytes()
    return total


def note(paged_bytes: int, pages: bool) -> str:
    """One line for a report: where the paged state lives and what it does to the step; with
    nothing paged (every state buffer under PAGED_MIN_VALUES values, as LoRA's are), why."""
    if not paged_bytes:
        return (
            f"no optimizer state is paged: bitsandbytes pages only state buffers of at least "
            f"{PAGED_MIN_VALUES:,} values, and these are smaller, so they sit in the caching "
            "allocator, inside the peak"
        )
    where = (
        f"paged optimizer state {size_text(paged_bytes)} in CUDA unified memory, outside the peak"
    )
    if pages:
        return f"{where}: the GPU cannot hold it beside the step, so it pages to host (slower)"
    return f"{where}: it fits beside the step"
