"""`scaled_dot_product_attention` as CUDA runs it: the fused kernel it picks, and what it saves.

On CPU a training step's SDPA call (dropout on) takes the math path, which keeps the L x L
attention matrix and its dropout mask for backward. On CUDA the same call runs a fused kernel
that saves only its output and a log-sum-exp per query row. This rule replaces the function,
while a simulated step runs in the calling thread, with the composite of
aten/src/ATen/native/transformers/attention.cpp `scaled_dot_product_attention` as it runs on CUDA:
convert a boolean mask, choose the backend (`sdpa_choice`), pad or expand what that backend needs,
and call its aten op, whose fake/meta kernel allocates the kernel's outputs and whose autograd
formula (tools/autograd/derivatives.yaml) saves what CUDA saves. The math backend is replayed
in Python so that its dropout is CUDA's fused one (a bool mask). A scoped patch of the function,
not a TorchFunctionMode: a mode is popped while backward runs, so activation-checkpoint
recomputation would take the CPU path.
Must not know models, measurement or search; which kernel runs is sdpa_choice's.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F

from memorymark.cuda_rules.scoped_patch import ScopedPatch
from memorymark.cuda_rules.sdpa_choice import (
    CUDNN,
    EFFICIENT,
    FLASH,
    Capability,
    SdpaCall,
    select_backend,
)

_aten = torch.ops.aten
Tensor = torch.Tensor
Mask = torch.Tensor | None
Scale = float | None


_target = threading.local()
"""`capability`: the compute capability of the GPU this thread's step imitates."""


def set_capability(capability: Capability) -> Capability | None:
    """Make this thread's patched calls choose kernels as on `capability`; returns the old one."""
    old = getattr(_target, "capability", None)
    _target.capability = capability
    return old


def _sdpa(
    original: Callable[..., torch.Tensor],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Replacement for `F.scaled_dot_product_attention` in threads that simulate CUDA."""
    if query.dim() != 4:
        # Unbatched inputs: PyTorch adds the batch dimension first; not seen in the catalog.
        return original(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    args = (attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if not torch.is_autocast_enabled("cpu"):
        return _dispatch(query, key, value, *args)
    # scaled_dot_product_attention is on CUDA's lower_precision_fp autocast list: its inputs are
    # cast before the backend is chosen, and nothing inside is autocast again.
    dtype = torch.get_autocast_dtype("cpu")
    query, key, value = (_lower(t, dtype) for t in (query, key, value))
    attn_mask = _lower(attn_mask, dtype) if attn_mask is not None else None
    with torch.autocast("cpu", enabled=False):
        return _dispatch(query, key, value, attn_mask, *args[1:])


def _lower(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype) if t.is_floating_point() and t.dtype != torch.float64 else t


def _dispatch(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    call = SdpaCall.from_tensors(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    backend = select_backend(call, _target.capability)
    mask = _convert_boolean_mask(attn_mask, query.dtype)
    if backend == FLASH:
        return _flash(query, key, value, dropout_p, is_causal, scale)
    if backend in (EFFICIENT, CUDNN):
        # Fewer key/value heads than query heads (GQA): given to these kernels expanded, as the
        # math path does. An upper bound, should a kernel read the groups in place.
        key, value = _expand_groups(query, key, value, enable_gqa)
        if backend == CUDNN:
            compute_lse = call.requires_grad
            out = _aten._scaled_dot_product_cudnn_attention(
                query, key, value, mask, compute_lse, dropout_p, is_causal, False, scale=scale
            )
            return out[0]
        return _efficient(query, key, value, mask, dropout_p, is_causal, scale)
    return _math(query, key, value, mask, dropout_p, is_causal, scale, enable_gqa)


def _convert_boolean_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    # attention.cpp convert_boolean_attn_mask: True keeps a position, False becomes -inf.
    if mask is None or mask.dtype != torch.bool:
        return mask
    neg_inf = torch.scalar_tensor(-math.inf, dtype=dtype, device=mask.device)
    return torch.where(mask, 0.0, neg_inf)


def _flash(
    q: Tensor, k: Tensor, v: Tensor, dropout_p: float, is_causal: bool, scale: Scale
) -> Tensor:
    # attention.cpp: pad head dims to a multiple of 8 (pad_last_dim), scale from the original
    # head dim, slice the output back (post_process_flash_output).
    head_dim = v.size(-1)
    padded = [t if t.size(-1) % 8 == 0 else F.pad(t, (0, 8 - t.size(-1) % 8)) for t in (q, k, v)]
    og_scale = scale if scale is not None else 1.0 / math.sqrt(q.size(-1))
    out = _aten._scaled_dot_product_flash_attention(
        *padded, dropout_p, is_causal, False, scale=og_scale
    )[0]
    return out if out.size(-1) == head_dim else out[..., :head_dim]


def _efficient(
    q: Tensor, k: Tensor, v: Tensor, mask: Mask, dropout_p: float, is_causal: bool, scale: Scale
) -> Tensor:
    if mask is not None:
        mask = _preprocess_mask(mask, q, k)
    # should_compute_logsumexp_with_attn_mask: the log-sum-exp is kept only for a backward.
    compute_lse = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, mask)
    )
    out = _aten._scaled_dot_product_efficient_attention(
        q, k, v, mask, compute_lse, dropout_p, is_causal, scale=scale
    )
    return out[0]


def _preprocess_mask(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    # attention.cpp preprocess_mask: a bias whose strides are not multiples of 8 is padded (and
    # sliced back) so the kernel can read it aligned; then it is broadcast, not copied.
    aligned = all(s % 8 == 0 for s in mask.stride()[:-1]) and mask.stride(-1) == 1
    if not aligned:
        last = mask.size(-1)
        mask = F.pad(mask, (0, 8 - last % 8))[..., :last]
    return mask.expand(q.size(0), q.size(1), q.size(2), k.size(2))


def _expand_groups(q: Tensor, k: Tensor, v: Tensor, enable_gqa: bool) -> tuple[Tensor, Tensor]:
    # attention.cpp pre_process_group_query_attention_input
    if not enable_gqa or q.size(-3) == k.size(-3) == v.size(-3):
        return k, v
    return (
        k.repeat_interleave(q.size(-3) // k.size(-3), -3),
        v.repeat_interleave(q.size(-3) // v.size(-3), -3),
    )


def _math(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask,
    dropout_p: float,
    is_causal: bool,
    scale: Scale,
    enable_gqa: bool,
) -> Tensor:
    """attention.cpp `_scaled_dot_product_attention_math`, line for line, with CUDA's dropout."""
    origin = q.dtype
    reduced = getattr(torch.backends.cuda, "fp16_bf16_reduction_math_sdp_allowed", lambda: False)
    if origin in (torch.float16, torch.bfloat16) and not reduced():
        q, k, v = q.float(), k.float(), v.float()  # kept in fp32 for accuracy
    factor = math.sqrt(abs(scale) if scale is not None else 1.0 / math.sqrt(q.size(-1)))
    q = q * (-factor if scale is not None and scale < 0 else factor)
    if is_causal:
        causal = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        mask = _convert_boolean_mask(causal, q.dtype)
    k, v = _expand_groups(q, k, v, enable_gqa)
    attn = torch.matmul(q, k.transpose(-2, -1) * factor)
    if mask is not None:
        attn.add_(mask)  # in place on real CUDA tensors (no subclass): no second L x L buffer
    attn = _aten._safe_softmax(attn, -1)
    if dropout_p > 0.0:
        # at::dropout on a CUDA tensor is the fused native_dropout: a bool mask (dropout rule).
        attn = _aten.native_dropout(attn, dropout_p, True)[0]
    out = torch.matmul(attn, v).to(origin)
    attn.to(origin)  # the op's second output: a copy in the input dtype the composite drops
    return out


PATCH = ScopedPatch(F, "scaled_dot_product_attention", _sdpa)
"""Active while a simulated step applies CUDA's rules (`cuda_rules.applied`)."""
