"""FlashAttention-2 (`attn_implementation="flash_attention_2"`) as its CUDA kernels allocate.

The `flash_attn` package is CUDA-only and is not installed where the simulation runs, so this rule
stands in for it under fake tensors: while a simulated step runs, transformers' attention
interface (`AttentionInterface.get_interface`, the lookup every model's attention layer makes)
answers "flash_attention_2" with `flash_attention_forward` here, a custom autograd Function whose
allocations and saved tensors are flash-attn 2's:

- forward (csrc/flash_attn/flash_api.cpp `mha_fwd`): `out = empty_like(q)` in the input dtype and
  `softmax_lse` fp32 [batch, heads, seq_q]; `rng_state` int64[2]; no seq x seq matrix. Saved for
  backward (flash_attn/flash_attn_interface.py `FlashAttnFunc.forward`):
  `save_for_backward(q, k, v, out_padded, softmax_lse, rng_state)`. Keys and values keep their
  own (fewer, under GQA) heads: no repeat.
- backward (`FlashAttnFunc.backward`, `mha_bwd`): `dq, dk, dv = empty_like(q/k/v)`; `softmax_d`
  fp32 [batch, heads, round128(seq_q)]; `dq_accum` fp32 [batch, round128(seq_q), heads,
  round32(head_dim)] (non-deterministic, `loop = true`); under GQA `dk_expanded`/`dv_expanded`
  [batch, seq_k, heads, head_dim] in the input dtype, summed into dk, dv.
- head dims that are not multiples of 8 are padded first (`_flash_attn_forward`, as PyTorch's
  flash path does).

The forward's split-KV accumulators (`num_splits > 1`) are only used when batch x heads x query
blocks would not fill 80% of the GPU (`num_splits_heuristic`): short single sequences, never the
long ones this rule matters for; they are left out. This module never imports transformers at
import time and knows nothing about models beyond the interface's call signature.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from memorymark.cuda_rules.scoped_patch import ScopedPatch

NAME = "flash_attention_2"
"""transformers' `attn_implementation` value this rule answers."""


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


class _FlashAttnFunc(torch.autograd.Function):
    """Inputs and outputs are [batch, seq, heads, head_dim], as flash_attn_func takes them."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch, seq_q, heads, _ = q.shape
        out = torch.empty_like(q)
        lse = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device)
        rng_state = torch.empty(2, dtype=torch.int64, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse, rng_state)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, _out, _lse, _rng = ctx.saved_tensors
        batch, seq_q, heads, head_dim = q.shape
        seq_k, heads_k = k.shape[1], k.shape[2]
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        seq_q_rounded = _round_up(seq_q, 128)
        # mha_bwd: head_size_rounded = head_size <= 192 ? round_multiple(head_size, 32) : 256
        head_rounded = _round_up(head_dim, 32) if head_dim <= 192 else 256
        f32 = {"dtype": torch.float32, "device": q.device}
        softmax_d = torch.empty((batch, heads, seq_q_rounded), **f32)
        dq_accum = torch.empty((batch, seq_q_rounded, heads, head_rounded), **f32)
        if heads_k != heads:
            expanded = (batch, seq_k, heads, head_dim)
            dk_expanded = torch.empty(expanded, dtype=k.dtype, device=k.device)
            dv_expanded = torch.empty(expanded, dtype=v.dtype, device=v.device)
            group = (batch, seq_k, heads_k, heads // heads_k, head_dim)
            torch.sum(dk_expanded.view(group), dim=3, out=dk)
            torch.sum(dv_expanded.view(group), dim=3, out=dv)
            del dk_expanded, dv_expanded
        del softmax_d, dq_accum
        return dq, dk, dv


def _pad8(t: torch.Tensor) -> torch.Tensor:
    return t if t.size(-1) % 8 == 0 else F.pad(t, (0, 8 - t.size(-1) % 8))


def flash_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' `flash_attention_forward` (integrations/flash_attention.py) with flash-attn's
    kernel replaced by its allocations: [batch, heads, seq, dim] in, [batch, seq, heads, dim] out.

    A sliding window and softcapping change which scores the kernel computes, not what it keeps.
    A padding mask is not modelled: MemoryMark's batches carry none (transformers would unpad)."""
    query, key, value = (t.transpose(1, 2) for t in (query, key, value))
    if query.dtype == torch.float32:
        # transformers' get_target_dtype: fp32 inputs are cast to the autocast dtype (the
        # simulation's autocast region is CPU's, standing in for CUDA's).
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        if dtype is None:
            raise RuntimeError("FlashAttention only supports fp16 and bf16 data type")
        query, key, value = (t.to(dtype) for t in (query, key, value))
    head_dim = query.size(-1)
    padded = [_pad8(t) for t in (query, key, value)]
    out = _FlashAttnFunc.apply(*padded)
    if out.size(-1) != head_dim:
        out = out[..., :head_dim]
    return out, None


def _get_interface(original: Any, interface: Any, attn_implementation: str, default: Any) -> Any:
    if attn_implementation == NAME:
        return flash_attention_forward
    return original(interface, attn_implementation, default)


@functools.cache
def patch() -> ScopedPatch | None:
    """The scoped patch of transformers' attention lookup (None without transformers)."""
    try:
        from transformers.modeling_utils import AttentionInterface
    except ImportError:
        return None
    return ScopedPatch(AttentionInterface, "get_interface", _get_interface)
