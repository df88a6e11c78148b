"""Liger's Triton kernels (`--kernels liger`) as they allocate, for the simulation.

Liger-Kernel (linkedin/Liger-Kernel, src/liger_kernel/ops/) replaces four pieces of a Llama-style
decoder with Triton kernels that keep less for backward. Triton has no CPU build, so the
simulation stands in for each with an autograd Function that allocates and saves what the kernel
does (the kernels' arithmetic allocates nothing and is left out):

- RMSNorm (`rms_norm.py`, `LigerRMSNormFunction`): output `Y` like `X`, `RSTD` fp32 [rows];
  saves `X, W, RSTD`; backward writes dX over dY (`in_place=True`, LigerRMSNorm's default) and
  sums a per-SM fp32 [sm_count, hidden] partial dW.
- SwiGLU / GeGLU MLP (`swiglu.py` `LigerSiLUMulFunction`, `geglu.py` `LigerGELUMulFunction`):
  `c = empty_like(a)`; saves the gate and up projections `a, b` only (the activation is
  recomputed); backward writes the two gradients over `a` and `b`.
- RoPE (`rope.py`, `LigerRopeFunction`): rotates q and k in place; saves `cos, sin`.
- the fused linear cross-entropy, in `memorymark/step/fused_loss.py`.

`apply(model, emulated=True)` patches a built model's instances (RMSNorm and gated MLP
modules) the way `_apply_liger_kernel_to_instance` does; RoPE is a module-level function in
transformers, so `rope_patches(model)` returns scoped patches the simulation enters around its
steps. Mixture-of-experts expert weights (fused 3-D parameters) keep transformers' own code.
This module knows nothing about measurement.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch
from torch import nn

from memorymark.cuda_rules.scoped_patch import ScopedPatch
from memorymark.step import fused_loss

SM_COUNT = 132
"""Streaming multiprocessors of an H100 SXM, the most in the catalog: RMSNorm's backward keeps an
fp32 [sm_count, hidden] partial sum (rms_norm.py `rms_norm_backward`); a few MiB at most."""


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        y = torch.empty_like(x)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        _x, weight, _rstd = ctx.saved_tensors
        dweight = None
        if ctx.needs_input_grad[1]:
            partial = torch.empty((SM_COUNT, weight.shape[0]), dtype=torch.float32)
            dweight = partial.sum(dim=0).to(weight.dtype)
        return dy, dweight  # dX written over dY


class _GatedMul(torch.autograd.Function):
    """act(a) * b, saving only a and b; the gradients overwrite them in backward."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return torch.empty_like(a)

    @staticmethod
    def backward(ctx: Any, dc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        return a, b


class _Rope(torch.autograd.Function):
    """One of q, k rotated in place (autograd takes one in-place view per Function, so q and k
    go through one each; both save the same cos and sin, one storage each)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, dx: torch.Tensor) -> tuple[Any, ...]:
        # rope_backward: transposed to [batch, seq, heads, dim] and made contiguous (a copy when
        # autograd hands a gradient in another layout), then rotated in place.
        return dx.transpose(1, 2).contiguous().transpose(1, 2), None, None


def _rms_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    # Gemma's (1 + weight) offset changes the arithmetic, not what is kept.
    return _RMSNorm.apply(hidden_states, self.weight)


def _gated_mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    # `self` is a transformers gated MLP (gate_proj, up_proj, down_proj), bound by name.
    return self.down_proj(_GatedMul.apply(self.gate_proj(x), self.up_proj(x)))


def _liger_rope(
    original: object,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    if q.shape[-1] != cos.shape[-1]:  # partial rotary (not in Liger's patched models)
        return original(q, k, cos, sin, *args, **kwargs)  # type: ignore[operator]
    return _Rope.apply(q, cos, sin), _Rope.apply(k, cos, sin)


def _is_rms_norm(module: nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNorm") and isinstance(
        getattr(module, "weight", None), nn.Parameter
    )


def _is_gated_mlp(module: nn.Module) -> bool:
    parts = ("gate_proj", "up_proj", "down_proj")
    return all(isinstance(getattr(module, p, None), nn.Module) for p in parts) and hasattr(
        module, "act_fn"
    )


def apply(model: nn.Module, *, emulated: bool) -> None:
    """Liger's kernels on `model`: emulated (RMSNorm, gated MLP, fused loss; RoPE through
    `rope_patches`), or the liger-kernel package's own `_apply_liger_kernel_to_instance` on a
    real GPU. ValueError when neither can be done."""
    if not emulated:
        try:
            from liger_kernel.transformers import _apply_liger_kernel_to_instance
        except ImportError:
            raise ValueError(
                "liger kernels need the liger-kernel package on a CUDA GPU (pip install "
                "liger-kernel); --backend sim models them without it"
            ) from None
        _apply_liger_kernel_to_instance(model=model)
        return
    patch_modules(model)
    fused_loss.use_fused_loss(model, liger=True, chunks=0)


def patch_modules(model: nn.Module) -> int:
    """Swap every RMSNorm and gated MLP module's forward for Liger's; returns how many. Raises
    ValueError when the model has neither (Liger supports Llama-style decoders only)."""
    patched = 0
    for module in model.modules():
        if _is_rms_norm(module):
            module.forward = _rms_norm_forward.__get__(module)
            patched += 1
        elif _is_gated_mlp(module):
            module.forward = _gated_mlp_forward.__get__(module)
            patched += 1
    if not patched:
        raise ValueError(
            f"Liger has no kernels for {type(model).__name__}: it patches Llama-style decoders "
            "(RMSNorm, gated MLP, RoPE)"
        )
    return patched


def rope_patches(model: nn.Module) -> tuple[ScopedPatch, ...]:
    """Scoped patches of `apply_rotary_pos_emb` in each modeling module `model` uses."""
    modules = {type(m).__module__ for m in model.modules()}
    patches = []
    for name in sorted(modules):
        owner = sys.modules.get(name)
        if owner is not None and callable(getattr(owner, "apply_rotary_pos_emb", None)):
            patches.append(_rope_patch(name))
    return tuple(patches)


_ROPE_PATCHES: dict[str, ScopedPatch] = {}
_ROPE_LOCK = threading.Lock()


def _rope_patch(module_name: str) -> ScopedPatch:
    # One patch per modeling module, shared by every thread, as ScopedPatch requires.
    with _ROPE_LOCK:
        if module_name not in _ROPE_PATCHES:
            owner = sys.modules[module_name]
            _ROPE_PATCHES[module_name] = ScopedPatch(owner, "apply_rotary_pos_emb", _liger_rope)
        return _ROPE_PATCHES[module_name]
