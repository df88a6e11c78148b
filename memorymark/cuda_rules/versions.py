"""Which PyTorch releases each CUDA rule was read from, and which rules the installed one is past.

The simulation copies specific releases' kernels and dispatch (`cuda_rules`), the caching
allocator (`memorymark/accounting/allocator.py`) and the cuBLAS workspaces
(`memorymark/gpus/workspaces.py`). Each rule here names the source it was read from and the
releases it was checked against; a report run on a torch outside that range says which rules
it touches, so an answer never silently rests on code that may have moved. The test suite runs
on the release every rule was verified with (2.13). This module knows nothing of how a rule is
applied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memorymark.environment import torch_version

Release = tuple[int, int]


@dataclass(frozen=True, slots=True)
class RuleSource:
    """Where one rule was read, and the releases it was checked against (inclusive)."""

    name: str
    source: str
    first: Release
    last: Release


RULES = (
    RuleSource("optimizer implementation (foreach on CUDA)",
               "torch/optim/optimizer.py _default_to_fused_or_foreach", (2, 13), (2, 13)),
    RuleSource("SDPA kernel choice", "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp",
               (2, 13), (2, 13)),
    RuleSource("SDPA saved tensors", "tools/autograd/derivatives.yaml, attention.cpp",
               (2, 13), (2, 13)),
    RuleSource("fused dropout mask", "aten/src/ATen/native/Dropout.cpp", (2, 13), (2, 13)),
    RuleSource("CUDA autocast op lists", "aten/src/ATen/autocast_mode.cpp", (2, 13), (2, 13)),
    RuleSource("caching allocator", "c10/cuda/CUDACachingAllocator.cpp @001074d2",
               (2, 13), (2, 13)),
    # Read from each release's libtorch_cuda.so and CublasHandlePool.cpp, 2.5.1 to 2.15.0.
    RuleSource("cuBLAS workspaces", "aten/src/ATen/cuda/CublasHandlePool.cpp", (2, 5), (2, 15)),
)  # fmt: skip


def release(version: str | None = None) -> Release:
    """(major, minor) of a torch version string ("2.13.0+cpu"); the installed torch's by default."""
    text = torch_version() if version is None else version
    match = re.match(r"(\d+)\.(\d+)", str(text))
    if match is None:
        raise ValueError(f"not a torch version: {text!r}")
    return int(match.group(1)), int(match.group(2))


def unverified_rules(version: str | None = None) -> tuple[str, ...]:
    """The rules whose verified releases do not include `version` (the installed torch's)."""
    current = release(version)
    return tuple(r.name for r in RULES if not r.first <= current <= r.last)
