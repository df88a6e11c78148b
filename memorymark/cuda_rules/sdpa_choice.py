"""Which kernel `scaled_dot_product_attention` runs on CUDA, decided from the call and the GPU.

A transcription of `select_sdp_backend` in aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
(PyTorch 2.13) and the filters it runs (`can_use_flash_attention`,
`can_use_mem_efficient_attention`, `can_use_cudnn_attention`; the shared ones are in
sdp_utils_cpp.h), for dense 4-D inputs with
PyTorch's defaults: every backend enabled, non-deterministic algorithms. Each check names the
filter it copies. The GPU enters only through its compute capability. Nothing here allocates: the
kernels themselves are called in `sdpa`.
Must not know models, measurement or search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FLASH = "flash"
EFFICIENT = "efficient"
CUDNN = "cudnn"
MATH = "math"

Capability = tuple[int, int]

_HALF = (torch.float16, torch.bfloat16)

# sdp_utils.cpp `check_prefer_cudnn_attention`: with a cuDNN newer than 9.15.0 (the CUDA 13 wheels
# ship one), cuDNN attention goes first on sm90 and sm10x. Older wheels keep it last, behind
# math, where it is never reached; the saved tensors are the same size as flash's either way.
CUDNN_PREFERRED_MAJORS = (9, 10)
# check_cudnn_tensor_shapes: head dims up to 128 (256 needs cuDNN > 9.22 on sm90/sm10x: not
# assumed), batch and heads up to 65535.
_CUDNN_MAX_HEAD_DIM = 128
_CUDNN_MAX_DIM = 65535


@dataclass(frozen=True, slots=True)
class SdpaCall:
    """What backend selection reads from one call: shapes, strides, dtype, mask, dropout."""

    dtype: torch.dtype
    q_shape: tuple[int, ...]
    k_shape: tuple[int, ...]
    v_shape: tuple[int, ...]
    strides: tuple[tuple[int, ...], ...]
    """Strides of query, key, value."""
    offsets: tuple[int, ...]
    """Storage offsets (in elements) of query, key, value."""
    mask_shape: tuple[int, ...] | None = None
    mask_stride_last: int = 1
    mask_requires_grad: bool = False
    dropout_p: float = 0.0
    is_causal: bool = False
    enable_gqa: bool = False
    requires_grad: bool = False
    """Grad mode is on and an input requires grad (sdp_utils `input_requires_grad`)."""

    @classmethod
    def from_tensors(
        cls,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        enable_gqa: bool = False,
    ) -> SdpaCall:
        """The selection inputs of a call with these tensors (real, fake or meta)."""
        qkv = (query, key, value)
        return cls(
            dtype=query.dtype,
            q_shape=tuple(query.shape),
            k_shape=tuple(key.shape),
            v_shape=tuple(value.shape),
            strides=tuple(tuple(t.stride()) for t in qkv),
            offsets=_offsets(qkv),
            mask_shape=None if attn_mask is None else tuple(attn_mask.shape),
            mask_stride_last=1 if attn_mask is None else attn_mask.stride(-1),
            mask_requires_grad=attn_mask is not None and attn_mask.requires_grad,
            dropout_p=dropout_p,
            is_causal=is_causal,
            enable_gqa=enable_gqa,
            requires_grad=torch.is_grad_enabled() and any(t.requires_grad for t in qkv),
        )


def _offsets(qkv: tuple[torch.Tensor, ...]) -> tuple[int, ...]:
    """Storage offsets of query, key and value. Inside a compiled region (Dynamo tracing) a
    storage offset is not a graph value and would break the graph (fatally inside a
    checkpoint): there they read 0, as Inductor's graphs hand SDPA inputs it laid out itself
    (aligned buffers); the alignment rule they feed changes the kernel only for offset views."""
    if torch.compiler.is_compiling():
        return (0,) * len(qkv)
    return tuple(int(t.storage_offset()) for t in qkv)


def select_backend(call: SdpaCall, capability: Capability) -> str:
    """The backend CUDA runs `call` with on a GPU of compute capability `capability`.

    `select_sdp_backend`: the first backend in priority order whose filters all pass; math last.
    """
    preferred = capability[0] in CUDNN_PREFERRED_MAJORS
    order = (CUDNN, FLASH, EFFICIENT) if preferred else (FLASH, EFFICIENT)
    checks = {CUDNN: can_use_cudnn, FLASH: can_use_flash, EFFICIENT: can_use_efficient}
    for backend in order:
        if checks[backend](call, capability):
            return backend
    return MATH


def can_use_flash(call: SdpaCall, capability: Capability) -> bool:
    """`can_use_flash_attention`: fp16/bf16 on sm80-sm121, no mask, head dim <= 256."""
    q, k, v = call.q_shape, call.k_shape, call.v_shape
    head_dim = q[-1]
    return (
        _four_d(call)
        and call.mask_shape is None  # check_for_attn_mask
        and head_dim == k[-1] == v[-1]  # check_head_dim_size_flash
        and head_dim <= 256
        and _sm_between(capability, (8, 0), (12, 1))  # check_flash_attention_hardware_support
        and _flash_backward_supported(call, capability)
        and not (call.is_causal and q[-2] != k[-2])  # check_flash_causal_non_square_seqlens
        and call.dtype in (_HALF if capability[0] >= 8 else (torch.float16,))
        and _heads_ok(call, same_heads_unless_gqa=True)
        and _nonzero_lengths(call)
        and _last_stride_one(call, ignore_singleton=True)
    )


def _flash_backward_supported(call: SdpaCall, capability: Capability) -> bool:
    # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120: flash's backward
    # fails on sm86-89 and sm120-121 for head dims in (192, 224], and in (224, 256] with dropout.
    consumer = _sm_between(capability, (8, 6), (8, 9)) or _sm_between(capability, (12, 0), (12, 1))
    if not (call.requires_grad and consumer):
        return True
    head_dim = call.q_shape[-1]
    return head_dim <= 192 or (call.dropout_p == 0.0 and head_dim > 224)


def can_use_efficient(call: SdpaCall, capability: Capability) -> bool:
    """`can_use_mem_efficient_attention`: fp32 too, masks allowed, sm50-sm121."""
    dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.float32, torch.bfloat16)
    if capability[0] < 8:
        dtypes = (torch.float16, torch.float32)
    return (
        _sm_between(capability, (5, 0), (12, 1))  # check_mem_efficient_hardware_support
        and _four_d(call)
        and _head_dims_aligned(call, capability)  # check_head_dim_size_mem_efficient
        and _offsets_aligned(call, capability)  # check_data_ptr_alignment_mem_efficient
        and _nonzero_lengths(call)
        and _last_stride_one(call, ignore_singleton=False)
        and _heads_ok(call, same_heads_unless_gqa=True)
        and call.dtype in dtypes
    )


def can_use_cudnn(call: SdpaCall, capability: Capability) -> bool:
    """`can_use_cudnn_attention`: fp16/bf16 on sm80+, dropout in steps of 1/16, head dim <= 128."""
    q, k, v = call.q_shape, call.k_shape, call.v_shape
    dropout_steps = call.dropout_p * 16.0
    return (
        _four_d(call)
        and call.dtype in (_HALF if capability[0] >= 8 else (torch.float16,))
        and _mask_shape_ok(call)  # check_attn_mask_shape
        and _sm_between(capability, (8, 0), (12, 1))  # check_cudnn_hardware_support
        and dropout_steps == math.floor(dropout_steps)  # check_cudnn_dropout
        and _nonzero_lengths(call)
        and _last_stride_one(call, ignore_singleton=True)
        and _heads_ok(call, same_heads_unless_gqa=False)
        and q[0] <= _CUDNN_MAX_DIM  # check_cudnn_tensor_shapes
        and q[1] <= _CUDNN_MAX_DIM
        and q[-1] <= _CUDNN_MAX_HEAD_DIM
        and v[-1] <= _CUDNN_MAX_HEAD_DIM
        and q[-1] % 8 == 0
        and v[-1] % 8 == 0
        and k[-2] != 1
        and not (call.dropout_p != 0.0 and q[-2] == 1)
        and _cudnn_layout_ok(call)  # check_cudnn_layout
    )


def _four_d(call: SdpaCall) -> bool:
    # check_tensor_shapes
    return len(call.q_shape) == len(call.k_shape) == len(call.v_shape) == 4


def _sm_between(capability: Capability, low: Capability, high: Capability) -> bool:
    # check_sm_version<lower_bound, upper_bound>: inclusive on both ends.
    return low <= tuple(capability) <= high


def _nonzero_lengths(call: SdpaCall) -> bool:
    # check_nonzero_sequence_lengths_dense
    return call.q_shape[-2] != 0 and call.k_shape[-2] != 0


def _last_stride_one(call: SdpaCall, *, ignore_singleton: bool) -> bool:
    # check_last_dim_stride_equals_1_dense<ignore_singleton_dim>
    ok = all(stride[-1] == 1 for stride in call.strides)
    if ignore_singleton:
        ok = ok or call.q_shape[-1] == 1
    return ok and call.mask_stride_last == 1


def _heads_ok(call: SdpaCall, *, same_heads_unless_gqa: bool) -> bool:
    # check_batch_size_and_num_heads_dense<supports_gqa=true, requires_same_num_heads, mqa=true>
    q, k, v = call.q_shape, call.k_shape, call.v_shape
    if not q[0] == k[0] == v[0]:
        return False
    if call.enable_gqa or not same_heads_unless_gqa:
        return k[-3] == v[-3] and q[-3] % k[-3] == 0  # check_grouped_query_attention
    return q[-3] == k[-3] == v[-3]


def _gemm_alignment(dtype: torch.dtype, capability: Capability) -> int:
    # minimum_gemm_alignment: 4 elements from sm80, raised to 128 bits where tensor cores run.
    is_half = dtype in _HALF
    tensor_cores = capability[0] >= 8 or (capability[0] >= 7 and is_half)
    alignment = 4 if capability[0] >= 8 else 1
    if tensor_cores:
        alignment = max(alignment, 128 // (16 if is_half else 32))
    return alignment


def _head_dims_aligned(call: SdpaCall, capability: Capability) -> bool:
    alignment = _gemm_alignment(call.dtype, capability)
    q_dim, k_dim, v_dim = call.q_shape[-1], call.k_shape[-1], call.v_shape[-1]
    return q_dim == k_dim and q_dim % alignment == 0 and v_dim % alignment == 0 and q_dim > 0


def _offsets_aligned(call: SdpaCall, capability: Capability) -> bool:
    # check_data_ptr_alignment_mem_efficient: from sm80 the CUTLASS kernels need each input's
    # storage offset aligned to the GEMM alignment (the caching allocator aligns the base).
    if capability[0] < 8:
        return True
    alignment = _gemm_alignment(call.dtype, capability)
    return all(offset % alignment == 0 for offset in call.offsets)


def _mask_shape_ok(call: SdpaCall) -> bool:
    mask = call.mask_shape
    if mask is None:
        return True
    q = call.q_shape
    if (
        call.mask_requires_grad
        or mask[-2] not in (q[-2], 1)
        or mask[-1] not in (call.k_shape[-2], 1)
    ):
        return False
    if len(mask) == 2:
        return True
    return len(mask) == 4 and mask[0] in (1, q[0]) and mask[1] in (1, q[1])


def _cudnn_layout_ok(call: SdpaCall) -> bool:
    # check_cudnn_layout: each of q, k, v laid out as (batch, seq, heads, dim) in memory, or the
    # value packed with q and k as (batch, seq, 3, heads, dim).
    def unpacked(shape: tuple[int, ...], stride: tuple[int, ...], heads: int) -> bool:
        s, d = shape[2], shape[3]
        return stride == (s * heads * d, d, heads * d, 1)

    def packed(shape: tuple[int, ...], stride: tuple[int, ...], heads: int) -> bool:
        s, d = shape[2], shape[3]
        return stride == (s * 3 * heads * d, d, 3 * heads * d, 1)

    heads = call.q_shape[1]
    shapes = (call.q_shape, call.k_shape, call.v_shape)
    layout_ok = all(unpacked(sh, st, heads) for sh, st in zip(shapes, call.strides, strict=True))
    return layout_ok or packed(call.v_shape, call.strides[2], heads)
