"""Context parallelism: the sequence split over the mesh's cp ranks, attention as a ring.

PyTorch's context parallelism (`torch.distributed.tensor.experimental`, its `_context_parallel`
package) does two things, and both run here with its own code:

- it splits the batch's sequence-shaped inputs over the cp ranks, load-balanced for causal
  attention (each rank takes a head chunk and a tail chunk of 2 x cp: `_HeadTailLoadBalancer`),
  with `_context_parallel_shard`, as torchtitan's `prepare_context_parallel_input` does.
  transformers builds the model's inputs inside `forward`, so a forward pre-hook on the model
  shards `input_ids` and `labels` there; everything after (embeddings, rotary positions,
  activations, logits, loss) is then the local sequence's;
- it routes `scaled_dot_product_attention` to ring attention: the query, key and value become
  DTensors sharded on the sequence (`_ContextParallel.sdpa_input_fn`), and the DTensor
  dispatcher's context-parallel handlers (`_enable_context_parallel_dispatcher`) run the fused
  kernel once per ring step on the local query against each rank's keys and values (all-gathered
  once, `_RotateMethod.ALL_GATHER`, the default), merging outputs and log-sum-exps in fp32, and
  the backward likewise (its key/value gradients passed around the ring).

One stand-in: torch's legacy `context_parallel()` context monkey-patches
`F.scaled_dot_product_attention` for the whole process; here the same input and output functions
wrap it through a `ScopedPatch`, in the simulating thread only, on top of `cuda_rules`' own patch
(which picks the CUDA kernel: the ring handlers take only the flash, memory-efficient and cuDNN
kernels, as on a GPU). It calls the same functions on the same tensors, so memory is unchanged.
The attention of models that do not call SDPA (eager attention) is not ring-parallel: refused.
This module knows nothing about measurement, search or the other mesh dimensions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from memorymark.cuda_rules.scoped_patch import ScopedPatch

SEQ_DIM = 1
"""The sequence dimension of `input_ids` and `labels` (batch, sequence)."""
SHARDED_INPUTS = ("input_ids", "labels", "position_ids")
"""The model inputs that run along the sequence (torchtitan shards inputs, labels, positions)."""

_meshes: list[Any] = []
"""The cp meshes of the steps running ring attention, innermost last (one simulation at a time:
the fake process group is process-wide, and so is its lock)."""


def shard_inputs(model: nn.Module, cp_mesh: Any) -> None:
    """Make `model` take its sequence-shaped inputs and keep its cp rank's chunks of them."""
    model.register_forward_pre_hook(
        lambda _m, args, kwargs: (args, _sharded(kwargs, cp_mesh)), with_kwargs=True
    )


def _sharded(kwargs: dict[str, Any], cp_mesh: Any) -> dict[str, Any]:
    from torch.distributed.tensor.experimental._context_parallel import (
        _context_parallel_shard,
        _HeadTailLoadBalancer,
    )

    names = [n for n in SHARDED_INPUTS if isinstance(kwargs.get(n), torch.Tensor)]
    if not names:
        return kwargs
    first = kwargs[names[0]]
    balancer = _HeadTailLoadBalancer(first.size(SEQ_DIM), cp_mesh.size(), first.device)
    shards = _context_parallel_shard(
        cp_mesh, [kwargs[n] for n in names], [SEQ_DIM] * len(names), load_balancer=balancer
    )
    return {**kwargs, **dict(zip(names, shards, strict=True))}


def _ring_sdpa(original: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.distributed.tensor.experimental._context_parallel import _ContextParallel

    if kwargs.get("attn_mask") is not None or (len(args) > 3 and args[3] is not None):
        raise ValueError(
            "--cp: ring attention takes no attention mask (torch's context parallelism is "
            "causal SDPA only): train without padding masks"
        )
    mesh = _meshes[-1]
    style = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA)
    args, kwargs = style.sdpa_input_fn(None, args, kwargs, mesh)
    return style.sdpa_output_fn(None, (args, kwargs), original(*args, **kwargs), mesh)


_PATCH = ScopedPatch(F, "scaled_dot_product_attention", _ring_sdpa)


@contextlib.contextmanager
def ring_attention(cp_mesh: Any) -> Iterator[None]:
    """In this thread, `scaled_dot_product_attention` runs as ring attention over `cp_mesh`
    (enter it inside `cuda_rules.applied`, whose kernel choice it then wraps)."""
    from torch.distributed.tensor.experimental._context_parallel import (
        _disable_context_parallel_dispatcher,
        _enable_context_parallel_dispatcher,
    )

    _meshes.append(cp_mesh)
    _enable_context_parallel_dispatcher()
    try:
        with _PATCH.active():
            yield
    finally:
        _meshes.pop()
        if not _meshes:
            _disable_context_parallel_dispatcher()
