"""Dropout as CUDA runs it: the fused kernel, whose mask is one byte per element.

aten/src/ATen/native/Dropout.cpp `dropout`: when `is_fused_kernel_acceptable` (a CUDA tensor,
0 < p < 1, not empty, not complex) and training, it calls `native_dropout`, which returns the output
and a **bool** mask that `native_dropout_backward` reads (aten/src/ATen/native/cuda/Dropout.cu
allocates the mask with `dtype(kBool)`). On a CPU tensor the same call falls back to
`_dropout_impl`: a noise tensor in the input's dtype, saved for backward, so an fp32 mask costs 4
bytes per element instead of 1. In-place dropout (`dropout_`) takes `_dropout_impl` on CUDA too, and
so does feature/alpha dropout; only the out-of-place function changes.

`native_dropout` has a CPU kernel and a meta kernel, both returning the bool mask, so the rule is
correct on real CPU tensors as well as fake ones.
Must not know models, measurement or search.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.overrides import has_torch_function_unary

from memorymark.cuda_rules.scoped_patch import ScopedPatch


def fused_dropout(
    original: Callable[..., torch.Tensor],
    input: torch.Tensor,  # F.dropout's own parameter name: callers pass it by keyword too
    p: float = 0.5,
    training: bool = True,
    inplace: bool = False,
) -> torch.Tensor:
    """`F.dropout(input, p, training, inplace)` taking CUDA's kernel choice."""
    fused = (
        training
        and not inplace
        and 0.0 < p < 1.0
        and input.numel() > 0
        and input.is_floating_point()
        and not has_torch_function_unary(input)
    )
    if not fused:
        return original(input, p, training, inplace)
    return torch.ops.aten.native_dropout(input, p, True)[0]


PATCH = ScopedPatch(F, "dropout", fused_dropout)
"""Active while a simulated step applies CUDA's rules (`cuda_rules.applied`)."""
