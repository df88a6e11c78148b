"""The rules by which a training step on CUDA differs from the same step on CPU, in one place.

The simulation runs the step on CPU fake tensors. Wherever the CUDA kernel a call reaches would
allocate differently from the CPU kernel the same call reaches, a rule here makes the CPU tensors
allocate what CUDA would. Each rule cites the PyTorch source it copies and is tested on its own
(tests/test_cuda_rules.py):

- the optimizer implementation CUDA picks by default: foreach (`optimizer_kwargs`);
- the fused attention kernel `scaled_dot_product_attention` picks, by dtype, head dim, mask,
  dropout and the GPU's compute capability, and the tensors it saves (`sdpa_choice`, `sdpa`);
- dropout's fused kernel and its one-byte mask (`dropout`);
- bitsandbytes' 4-bit matmul, which past 1536 rows dequantizes the whole weight (`bnb_gemm`);
- autocast with CUDA's op lists for bf16-mixed and 16-mixed (`autocast_lists`,
  `autocast_emulation`);
- FlashAttention-2's kernels, which transformers calls for `attn_implementation=
  "flash_attention_2"` and which have no CPU build (`flash_attn2`).

The workload asks this package for an optimizer's arguments and for the autocast region of a
precision; it never asks which device it is on. The simulated backend enters `applied()` around
its steps; the CUDA backend never does (its kernels are the rules). The `cpu` backend keeps CPU's
rules: the fused attention kernels have no CPU implementation, so real CPU tensors can't follow
them, and a partly applied set would match neither device. A simulation with `cuda_rules=False`
reproduces the `cpu` backend byte for byte, which is how the tests check the fake-tensor machinery.
`scoped_patch` is how a rule replaces a library function for the threads that ask, and only while
they ask.

Must not know: how memory is counted, which batch sizes are tried, or which model is trained
beyond the operators it calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from memorymark.cuda_rules import autocast_emulation as _autocast
from memorymark.cuda_rules import bnb_gemm as _bnb_gemm
from memorymark.cuda_rules import dropout as _dropout
from memorymark.cuda_rules import flash_attn2 as _flash_attn2
from memorymark.cuda_rules import sdpa as _sdpa
from memorymark.cuda_rules.sdpa_choice import Capability

AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
"""Lightning's mixed precisions: the dtype autocast runs the lower-precision ops in."""
PARAMETER_DTYPES = {"bf16-true": torch.bfloat16}
"""Lightning's true precisions other than fp32: the dtype of parameters and buffers."""


def optimizer_kwargs(name: str) -> dict[str, Any]:
    """Constructor arguments that make an optimizer run as it does by default on CUDA.

    torch/optim/optimizer.py `_default_to_fused_or_foreach` picks `foreach=True` when every
    parameter is a CUDA tensor (and for-loop on CPU). The foreach kernels allocate temporaries as
    large as all parameters of a dtype group, so the choice moves the optimizer-step peak by a
    whole model's worth of bytes. Fused stays opt-in on CUDA, as in PyTorch (`adamw-fused`), and
    so does the for-loop implementation (`foreach=False`: `adamw-forloop`, `sgd-forloop`).
    """
    if name in ("adamw", "sgd"):
        return {"foreach": True}
    if name == "adamw-fused":
        return {"fused": True}
    if name in ("adamw-forloop", "sgd-forloop"):
        return {"foreach": False}
    raise ValueError(f"no CUDA rule for optimizer {name!r}")


def default_to_foreach(optimizer: torch.optim.Optimizer) -> None:
    """Give `optimizer` the implementation CUDA would pick for it where its user left the
    choice to PyTorch (`foreach=None`, not fused, not differentiable): foreach, as
    torch/optim/optimizer.py `_default_to_fused_or_foreach` picks for CUDA tensors. Fake CPU
    tensors would get the for-loop kernels, whose temporaries are one parameter at a time.
    Optimizers without a foreach implementation (no `foreach` default) are left as they are."""
    if "foreach" not in optimizer.defaults:
        return
    for group in optimizer.param_groups:
        if (
            group.get("foreach") is None
            and not group.get("fused")
            and not group.get("differentiable")
        ):
            group["foreach"] = True


def parameter_dtype(precision: str) -> torch.dtype | None:
    """The dtype `precision` stores weights, buffers and optimizer state in (None: keep fp32)."""
    return PARAMETER_DTYPES.get(precision)


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype quantized weights are dequantized to (bitsandbytes' `compute_dtype`, HF's
    `bnb_4bit_compute_dtype`): the precision's low-precision dtype, else fp32."""
    return AUTOCAST_DTYPES.get(precision) or PARAMETER_DTYPES.get(precision) or torch.float32


def uses_grad_scaler(precision: str) -> bool:
    """16-mixed scales the loss (fp16 gradients underflow); bf16 has fp32's exponent range."""
    return precision == "16-mixed"


@contextlib.contextmanager
def autocast(precision: str, device_type: str) -> Iterator[None]:
    """The forward pass's autocast region for `precision`, as the PyTorch AMP docs write it.

    `torch.autocast(device_type, dtype)` for the mixed precisions, nothing otherwise. Under
    `applied()` the CPU region follows CUDA's op lists and caches weight casts per region.
    """
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device_type, dtype=dtype), _autocast.cast_cache():
        yield


@contextlib.contextmanager
def applied(capability: Capability) -> Iterator[None]:
    """In this thread, CPU tensors follow CUDA's rules for a GPU of `capability` (major, minor).

    Scoped patches of `F.scaled_dot_product_attention`, `F.dropout` and transformers' attention
    lookup (for flash_attention_2), and CUDA's autocast lists; other threads keep PyTorch's own
    behaviour. Re-entrant.
    """
    previous = _sdpa.set_capability((capability[0], capability[1]))
    flash_attn2 = _flash_attn2.patch()
    try:
        with contextlib.ExitStack() as stack:
            for patch in (_sdpa.PATCH, _dropout.PATCH, _bnb_gemm.PATCH):
                stack.enter_context(patch.active())
            if flash_attn2 is not None:
                stack.enter_context(flash_attn2.active())
            stack.enter_context(_autocast.emulated())
            yield
    finally:
        if previous is not None:
            _sdpa.set_capability(previous)
