"""Which PyTorch releases each CUDA rule was read from, and which rules the installed one is past.

The simulation copies specific releases' kernels and dispatch (`cuda_rules`), the caching
allocator (`memorymark/accounting/allocator.py`) and the cuBLAS workspaces
(`memorymark/gpus/workspaces.py`). Each rule here names the source it was read from and the
releases it was checked against; a report run on a torch outside that range says which rules
it touches, so an answer never silently rests on code that may have moved. Every rule was
verified on 2.13; on 2.14 (what a new install gets) all but two were: 2.14 changed the cuDNN
filters of the SDPA kernel choice and the caching allocator's code (see RULES). The test suite
knows which rules each release it runs on leaves unverified (tests/test_versions.py). This module
knows nothing of how a rule is applied.
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
    # 2.14: torch/optim/optimizer.py, adamw.py, sgd.py and utils/_foreach_utils.py of the
    # 2.13.0 and 2.14.1 wheels differ in type annotations only.
    RuleSource("optimizer implementation (foreach on CUDA)",
               "torch/optim/optimizer.py _default_to_fused_or_foreach", (2, 13), (2, 14)),
    # Not 2.14: its libtorch_cuda.so has new cuDNN filters (check_cudnn_d256_bprop_head_dim;
    # check_cudnn_tensor_shapes raises the head-dim limit to 256 on sm90/sm10x past cuDNN 9.22
    # and calls is_cudnn_attention_decode_disabled), and its wheel ships cuDNN 9.24.0 (2.13.0:
    # 9.20.0), so cuDNN takes head dims the rule sends to flash. Not transcribed yet.
    RuleSource("SDPA kernel choice", "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp",
               (2, 13), (2, 13)),
    # 2.14: the generated autograd/generated/Functions.h (from derivatives.yaml) saves the same
    # tensors for every attention and dropout backward node; the CUDA meta kernels in
    # _meta_registrations.py (attention.cpp's output shapes) and the op schemas are unchanged;
    # the flash, efficient and cuDNN ops on fake CUDA tensors return and save the same shapes in
    # 2.13.0+cu130 and 2.14.1+cu130.
    RuleSource("SDPA saved tensors", "tools/autograd/derivatives.yaml, attention.cpp",
               (2, 13), (2, 14)),
    # 2.14: F.dropout on fake CUDA tensors runs each release's own Dropout.cpp; 2.13.0+cu130 and
    # 2.14.1+cu130 take the same paths (native_dropout, bool mask, for the out-of-place call;
    # bernoulli noise for in-place, feature and alpha dropout; nothing at p=0 or in eval).
    RuleSource("fused dropout mask", "aten/src/ATen/native/Dropout.cpp", (2, 13), (2, 14)),
    # 2.14: the CUDA autocast wrappers compiled into 2.13.0+cu130's and 2.14.1+cu130's
    # libtorch_cpu.so are the same but for one new op (autocast_lists.NEWER_POLICIES).
    RuleSource("CUDA autocast op lists", "aten/src/ATen/autocast_mode.cpp", (2, 13), (2, 14)),
    # Not 2.14: its libc10_cuda.so adds memory annotations, user metadata, uncached_allocate and
    # expandable-segment handle types; whether block sizes, splits and caching moved is unread.
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
