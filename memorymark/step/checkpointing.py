"""Activation checkpointing as a model is trained with it: every block, every K-th block, or
every block with torchtitan's selective op policy.

Each mode goes through the library's own switch (transformers' `activation_checkpointing_enable`,
non-reentrant, as PyTorch recommends; timm's `set_grad_checkpointing`), so the step recomputes
exactly what the real run would; the op-level mode passes PyTorch's
`create_selective_checkpoint_contexts` as the checkpoint's `context_fn`, the only hook
transformers offers for it. Must not know settings' sections, backends or how memory is counted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

# torchtitan's `_save_list`, the outputs selective op checkpointing keeps (and does not
# recompute): torchtitan/models/llama3/infra/parallelize.py at pytorch/torchtitan@81c1243 (mm,
# SDPA's efficient and flash kernels, reduce_scatter, max), with the SDPA kernels its later
# `_op_sac_save_list` adds (cudnn, math, overrideable) and without those needing torch.compile
# (flex_attention, inductor_compiled_code); plus `addmm`: a linear layer with a bias runs as
# addmm where Llama's bias-free ones run as mm, so biased models (GPT-2, BERT) keep their
# matmuls too. `bmm` is not in torchtitan's list: eager attention's score matmuls are
# recomputed, as torchtitan's SDPA-only models never meet them. Names under torch.ops, so the
# snippets (memorymark/reporting/snippets.py) write the same list without importing torch.
MATMUL_OPS: tuple[str, ...] = ("aten.mm.default", "aten.addmm.default")
SAVED_OPS: tuple[str, ...] = (
    *MATMUL_OPS,
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_attention_math.default",
    "aten._scaled_dot_product_fused_attention_overrideable.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    # torchtitan: "for low precision training, it's useful to always save the result of max,
    # since the absolute maximum is used to compute the scaling factor for quantization."
    "aten.max.default",
)


@cache
def _ops(paths: tuple[str, ...]) -> frozenset[Any]:
    """The ops at `paths` under torch.ops that this build of PyTorch has."""
    import torch

    found = set()
    for path in paths:
        op: Any = torch.ops
        for part in path.split("."):
            op = getattr(op, part, None)
            if op is None:
                break
        if op is not None:
            found.add(op)
    return frozenset(found)


def _selective_op_policy() -> Callable[..., Any]:
    """torchtitan's `_custom_policy` (`_apply_ac_to_transformer_block` in
    torchtitan/models/llama3/infra/parallelize.py at pytorch/torchtitan@81c1243; the same rule
    in its later torchtitan/distributed/activation_checkpoint.py): keep the output of every op
    in the save list except every second matmul, counted apart in the forward and in the
    recompute, one count per block's checkpoint (its `meta` is made afresh by each
    `context_fn` call)."""
    from torch.utils.checkpoint import CheckpointPolicy

    meta: defaultdict[str, int] = defaultdict(int)
    matmuls, saved = _ops(MATMUL_OPS), _ops(SAVED_OPS)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        mm_count_key = f"{mode}_mm_count"
        if func in matmuls:
            meta[mm_count_key] += 1
        # "Saves output of all compute ops, except every second mm"
        to_save = func in saved and not (func in matmuls and meta[mm_count_key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_op_context() -> Any:
    """The checkpoint's `context_fn` for selective op checkpointing: the pair of contexts
    PyTorch's `create_selective_checkpoint_contexts` makes from torchtitan's policy."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_selective_op_policy())


def checkpointed_block(index: int, every: int) -> bool:
    """Whether block `index` (from 0) is checkpointed under layers:`every`: torchtitan's
    `_apply_layer_sac` counts the blocks from 1 and wraps those whose count `% ac_freq == 0`
    (torchtitan/distributed/activation_checkpoint.py), so blocks every-1, 2*every-1, ...
    (transformers' own `every_n_layers` takes blocks 0, every, ... instead)."""
    return (index + 1) % every == 0


def enable(model: nn.Module, mode: str) -> None:
    """Turn on checkpointing `mode` (full, selective-op or layers:K) with the model's own
    switch, or say in one line that the model cannot."""
    every = int(mode.removeprefix("layers:")) if mode.startswith("layers:") else None
    kwargs: dict[str, Any] = {"use_reentrant": False}  # needs no input that requires grad (LoRA)
    if mode == "selective-op":
        kwargs["context_fn"] = selective_op_context
    supported = getattr(model, "supports_gradient_checkpointing", True)
    # Each library's own switch, found by name (an nn.Module's attributes type as tensors).
    switch_5 = getattr(model, "activation_checkpointing_enable", None)  # transformers 5
    switch_4 = getattr(model, "gradient_checkpointing_enable", None)  # transformers 4
    switch_timm = getattr(model, "set_grad_checkpointing", None)
    if supported and switch_5 is not None:
        switch_5(activation_checkpointing_kwargs=kwargs)
    elif supported and switch_4 is not None:
        switch_4(gradient_checkpointing_kwargs=kwargs)
    if supported and (switch_5 is not None or switch_4 is not None):
        if every is not None:
            _every_kth_block(model, every)
        return
    if switch_timm is not None and mode == "full":
        switch_timm(True)
        return
    if switch_timm is not None:
        raise ValueError(
            f"timm's set_grad_checkpointing checkpoints every block of {type(model).__name__}: "
            "use --checkpointing full"
        )
    raise ValueError(
        f"{type(model).__name__} does not support gradient checkpointing; "
        "use --checkpointing none or pick another model"
    )


def _every_kth_block(model: nn.Module, every: int) -> None:
    """Leave checkpointing on in every `every`-th block only, counted as torchtitan counts them.
    transformers' blocks are its `GradientCheckpointingLayer`s, in module order (the order its
    own `every_n_layers` counts)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not blocks:
        raise ValueError(
            f"{type(model).__name__} has no per-block checkpointing switch for layers:{every}: "
            "use --checkpointing full or selective-op"
        )
    for index, block in enumerate(blocks):
        block.gradient_checkpointing = checkpointed_block(index, every)
