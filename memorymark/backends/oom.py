"""Recognising an out-of-memory error, on any device, without swallowing anything else.

Each pattern says where it comes from, as accelerate's `utils/memory.py` does. Anything that is
not an OOM is re-raised by the caller with a clear message.
Knows nothing of devices' memory, fit verdicts or search.
"""

from __future__ import annotations

import torch

_OOM_MESSAGES = (
    # c10/cuda/CUDACachingAllocator.cpp raises OutOfMemoryError("CUDA out of memory. ...").
    "CUDA out of memory.",
    # cuDNN reports a failed workspace allocation this way (accelerate's should_reduce_batch_size).
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "CUDNN_STATUS_ALLOC_FAILED",
    # c10/core/impl/alloc_cpu.cpp on a real CPU backend.
    "DefaultCPUAllocator: can't allocate memory",
    # aten/src/ATen/mps/MPSAllocator.mm.
    "MPS backend out of memory",
)


def is_oom(exc: BaseException) -> bool:
    """True when `exc` means the step did not fit in memory."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MESSAGES)


class StepError(RuntimeError):
    """The training step failed for a reason other than memory."""
