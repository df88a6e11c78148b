"""bitsandbytes' 4-bit matmul as its CUDA kernel runs it: past 1536 rows, dequantize then matmul.

bitsandbytes/backends/cuda/ops.py (0.50) registers `bitsandbytes::gemm_4bit` for CUDA: when the
input has more than `_gemm_4bit_custom_max_m = 1536` rows (batch x sequence), it takes
`_dequant_linear_fallback`, which allocates the whole weight dequantized,
`B_dq = torch.empty(shapeB, dtype=A.dtype)` (and with double quant first the absmax in fp32,
`absmax_dq = torch.empty_like(absmax_8bit, dtype=torch.float32)`), then calls `F.linear(A, B_dq)`:
both are alive while the output is allocated. The op's fake kernel (bitsandbytes/_ops.py) returns
the output only, so a simulated step allocates those temporaries here. At 1536 rows or fewer the
custom kernel reads the packed weight directly and allocates nothing more.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from memorymark.cuda_rules.scoped_patch import ScopedPatch
from memorymark.step import quantization

CUSTOM_KERNEL_MAX_ROWS = 1536
"""bitsandbytes/backends/cuda/ops.py `_gemm_4bit_custom_max_m` (CUDA; ROCm's is 256)."""


def dequantized_scratch(
    original: Callable[..., list[torch.Tensor]],
    x: torch.Tensor,
    dtype: torch.dtype,
    weight_shape: tuple[int, int],
    absmax: torch.Tensor | None,
) -> list[torch.Tensor]:
    """The temporaries CUDA's gemm_4bit holds beside its output for input `x` computed in
    `dtype`: the weight dequantized to `dtype`, and a double-quant absmax in fp32."""
    rows = x.numel() // max(x.shape[-1], 1)
    if rows <= CUSTOM_KERNEL_MAX_ROWS:
        return original(x, dtype, weight_shape, absmax)
    scratch = []
    if absmax is not None:  # double quant: the 8-bit absmax dequantized first
        scratch.append(torch.empty(absmax.shape, dtype=torch.float32, device=x.device))
    scratch.append(torch.empty(weight_shape, dtype=dtype, device=x.device))
    return scratch


PATCH = ScopedPatch(quantization, "gemm_scratch", dequantized_scratch)
"""Active while a simulated step applies CUDA's rules (`cuda_rules.applied`)."""
