"""Tensor parallelism with sequence-parallel norms: PyTorch's `parallelize_module` driven by the
model's own plan.

A transformers model's config carries `base_model_tp_plan` ("layers.*.self_attn.q_proj":
"colwise", "layers.*.mlp.down_proj": "rowwise", ...): the plan transformers applies with
`from_pretrained(tp_plan="auto")` (transformers/distributed/tensor_parallel.py). Here it is
applied the way torchtitan applies its Llama plan (torchtitan/models/llama3/infra/parallelize.py,
`apply_tp`), with PyTorch's own styles:

- in each block, the plan's colwise projections get `ColwiseParallel` (weight rows split: each
  rank computes its own heads, and transformers' attention reshapes to `-1` heads, so it runs
  with the local head count) and its rowwise ones `RowwiseParallel(output_layouts=Shard(1))`
  (a reduce-scatter onto the sequence);
- the block's own norms (its direct children) get `SequenceParallel`: between the projections
  the residual stream is split along the sequence, and the module holding the projections
  gathers it first (`PrepareModuleInput`'s Shard(1) -> Replicate, taken from wherever the model
  passes `hidden_states`); norms inside the attention (Qwen3's q_norm, the plan's
  "replicated_with_grad_allreduce") get `SequenceParallel(use_local_output=True)`, as
  torchtitan gives its q_norm and k_norm;
- outside the blocks, where the subtree holds them: the input embedding split by vocabulary with
  its output on the sequence (`RowwiseParallel(input_layouts=Replicate(), output_layouts=
  Shard(1))`), the final norm `SequenceParallel`, and the LM head `ColwiseParallel`, whose
  logits stay split by vocabulary for `loss_parallel()` (the default: a rank never holds the
  whole logits) or are gathered whole.

transformers computes rotary positions and the causal mask from the embedding's output shape, so
the sequence-split residual stream stays a DTensor (its global shape) instead of torchtitan's
local tensors: the same bytes on every rank. `apply_tp` works on any module subtree that holds
the blocks (a pipeline stage). This module knows nothing about meshes' other dimensions, data
parallelism or measurement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from memorymark.accounting.tracker import uncounted
from memorymark.backends.blocks import blocks as find_blocks

PLAN_STYLES = ("colwise", "rowwise", "replicated_with_grad_allreduce")
"""Entries of a model's `base_model_tp_plan` this module applies (transformers' style names)."""


def model_plan(model: nn.Module, config: Any = None) -> dict[str, str]:
    """The model's tensor-parallel plan, per block: {"self_attn.q_proj": "colwise", ...}, read
    from `config` (the model's own when not given).

    Raises a one-line ValueError when the model's config carries no plan, or a style this
    module does not apply (mixture-of-experts styles)."""
    config = config if config is not None else getattr(model, "config", None)
    getter = getattr(config, "get_text_config", None)
    text = getter() if callable(getter) else config
    plan = getattr(text, "base_model_tp_plan", None) or {}
    name = type(model).__name__
    if not plan:
        raise ValueError(
            f"--tp needs a tensor-parallel plan, and {name}'s config carries none "
            "(base_model_tp_plan): use --tp 1 with this model"
        )
    block_plan: dict[str, str] = {}
    for key, style in plan.items():
        if style not in PLAN_STYLES:
            raise ValueError(
                f"--tp: {name}'s plan shards {key} as {style!r}, which is not simulated "
                f"(only {', '.join(PLAN_STYLES)}): use --tp 1 with this model"
            )
        _, sep, inside = key.partition(".*.")
        if sep:
            block_plan[inside] = style
    return block_plan


def _is_norm(module: nn.Module) -> bool:
    # LlamaRMSNorm, Qwen3RMSNorm, Gemma3RMSNorm, nn.LayerNorm, nn.RMSNorm: their class names.
    return "Norm" in type(module).__name__


def _block_styles(block: nn.Module, plan: dict[str, str]) -> dict[str, Any]:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    modules = dict(block.named_modules())
    styles: dict[str, Any] = {
        name: SequenceParallel() for name, child in block.named_children() if _is_norm(child)
    }
    for key, style in plan.items():
        if key not in modules:
            continue
        if style == "colwise":
            styles[key] = ColwiseParallel()
            holder = key.rpartition(".")[0]
            if holder and holder not in styles:
                styles[holder] = GatherSequence()
        elif style == "rowwise":
            styles[key] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
        else:
            styles[key] = SequenceParallel(use_local_output=True)
    return styles


def apply_tp(
    model: nn.Module,
    tp_mesh: Any,
    *,
    loss_parallel: bool = True,
    config: Any = None,
    blocks: list[nn.Module] | None = None,
) -> nn.Module:
    """Split `model`'s blocks (and its embedding, final norm and LM head, where this subtree
    holds them) over the 1-D `tp_mesh`, in place; returns `model`.

    `model` is a transformers model or any subtree of one holding its blocks (a pipeline
    stage): pass the whole model's `config` when the subtree has none, and its `blocks` when
    the subtree does not list them (`_no_split_modules`). `loss_parallel`: the LM head's logits
    stay split by vocabulary (run the loss under `loss_parallel_context(True)`); False gathers
    them whole on every rank.

    What the split makes is not counted as made: torchtitan splits a model built on the meta
    device and materialises what each rank holds at the end (`to_empty`, then `init_weights`),
    so each rank's whole slice of every block, which FSDP2 then shards further, never takes
    device memory at once. Counted as made, those slices of Llama-3.1-70B at tp 2 held 1.7 GiB
    a block while the model was set up, and the cache they left reserved 146 GiB by the first
    step at a 16.5 GiB peak. The parameters a rank ends with are counted once the model is
    spread (`Backend._prepare`), or as FSDP2 makes its shards of them."""
    with uncounted():
        return _split(model, tp_mesh, loss_parallel=loss_parallel, config=config, blocks=blocks)


def _split(
    model: nn.Module,
    tp_mesh: Any,
    *,
    loss_parallel: bool,
    config: Any,
    blocks: list[nn.Module] | None,
) -> nn.Module:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    plan = model_plan(model, config)
    blocks = blocks if blocks is not None else find_blocks(model)
    if not blocks:
        raise ValueError(f"--tp: {type(model).__name__} has no transformer blocks to split")
    for block in blocks:
        parallelize_module(block, tp_mesh, _block_styles(block, plan), src_data_rank=None)
    # The modules around the blocks: found by what they are, as a pipeline stage may lack them.
    outer: dict[str, Any] = {}
    names = {id(m): n for n, m in model.named_modules()}
    embeddings = _called(model, "get_input_embeddings")
    if isinstance(embeddings, nn.Embedding) and id(embeddings) in names:
        outer[names[id(embeddings)]] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
        )
    holder = _blocks_holder(model, blocks)
    if holder is not None:
        prefix = names[id(holder)]
        for name, child in holder.named_children():
            if _is_norm(child):
                outer[f"{prefix}.{name}" if prefix else name] = SequenceParallel()
    head = _called(model, "get_output_embeddings")
    if isinstance(head, nn.Linear) and id(head) in names:
        outer[names[id(head)]] = ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    if outer:
        parallelize_module(model, tp_mesh, outer, src_data_rank=None)
    return model


def _called(model: nn.Module, method: str) -> Any:
    getter = getattr(model, method, None)
    try:
        return getter() if callable(getter) else None
    except (AttributeError, NotImplementedError):
        return None


def _blocks_holder(model: nn.Module, blocks: list[nn.Module]) -> nn.Module | None:
    """The module whose ModuleList (or a pipeline stage's ModuleDict) holds the blocks (a
    transformers base model: its final norm is its direct child)."""
    for module in model.modules():
        for child in module.children():
            held = isinstance(child, (nn.ModuleList, nn.ModuleDict))
            if held and any(b is blocks[0] for b in child.children()):
                return module
    return None


class GatherSequence(ParallelStyle):
    """`PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())` for the
    hidden states wherever the model passes them (first positional argument, or the
    `hidden_states` keyword transformers' decoder layers use for attention)."""

    def _apply(self, module: nn.Module, mesh: Any) -> nn.Module:
        module.register_forward_pre_hook(
            lambda _m, args, kwargs: _gathered(args, kwargs, mesh), with_kwargs=True
        )
        return module


def _gather(x: Any, mesh: Any) -> Any:
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(x, torch.Tensor):
        return x
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [Shard(1)], run_check=False)
    return x.redistribute(placements=[Replicate()]) if x.placements != (Replicate(),) else x


def _gathered(args: tuple, kwargs: dict, mesh: Any) -> tuple[tuple, dict]:
    if args:
        return (_gather(args[0], mesh), *args[1:]), kwargs
    if "hidden_states" in kwargs:
        kwargs = {**kwargs, "hidden_states": _gather(kwargs["hidden_states"], mesh)}
    return args, kwargs


@contextlib.contextmanager
def loss_parallel_context(on: bool) -> Iterator[None]:
    """torch's `loss_parallel()` when the logits are split by vocabulary: cross-entropy (and
    its backward) computed on the shards."""
    if not on:
        yield
        return
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():
        yield
