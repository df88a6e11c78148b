"""Spreading a built model and its optimizer over ranks with PyTorch's own distributed code.

`shard_model` applies the strategy `Settings.dist` names, as a training script does after it
builds the model: DDP (`DistributedDataParallel`, 25 MiB gradient buckets by default) for ddp
and zero1; FSDP2's `fully_shard` on every transformer block and then the root, as torchtitan and
Accelerate's FSDP2 path do, for fsdp, fsdp-no-reshard (`reshard_after_forward=False`) and hsdp
(a 2-D mesh: replicate across nodes, shard inside one), with a `MixedPrecisionPolicy` and
`CPUOffloadPolicy` when asked. `build_optimizer` wraps zero1's optimizer in
`ZeroRedundancyOptimizer`. The same code runs on a fake process group (the simulation) and on a
real one (torchrun). This module knows nothing about measuring memory or which process group it
is handed; `mesh_shape` says what mesh a strategy needs.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch
from torch import nn

from memorymark import cuda_rules
from memorymark.backends.blocks import blocks
from memorymark.distributed import topology
from memorymark.settings import Settings
from memorymark.step import optimizers

MESH_DIMS = ("replicate", "shard")


def mesh_shape(settings: Settings) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(shape, dimension names) of the device mesh the strategy shards over: with tensor or
    context parallelism, torchtitan's (memorymark/distributed/layout.py, `Layout.mesh`)."""
    gpus = settings.hardware.gpu_count or 1
    layout = settings.hardware.layout(gpus)
    if layout.tp * layout.cp > 1:
        return layout.mesh()
    if settings.hardware.dist == "hsdp":
        nodes = settings.hardware.node_count
        return (nodes, gpus // nodes), MESH_DIMS
    return (gpus,), ("shard",)


def _mp_policy(settings: Settings) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = cuda_rules.AUTOCAST_DTYPES.get(settings.workload.precision)
    if settings.hardware.mp_policy == "none" or dtype is None:
        return MixedPrecisionPolicy()
    # bf16 (fp16) parameters for compute, gradients reduced in fp32: torchtitan's default.
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def shard_model(
    model: nn.Module,
    settings: Settings,
    mesh: Any,
    ddp_kwargs: dict,
    *,
    pin_memory: bool = True,
    parts: dict[str, Any] | None = None,
) -> nn.Module:
    """`model` spread over `mesh` as `settings.hardware.dist` says (the returned module trains).
    `pin_memory`: offloaded states in page-locked host memory (CPUOffloadPolicy's default;
    fake tensors cannot pin, and pinning moves no GPU memory). `parts`: `mesh_parts(mesh)`,
    when it had to be made outside fake mode.

    With `--tp`, each block is split over the mesh's tp dimension first
    (memorymark/backends/tensor_parallel.py), then FSDP2 shards over the data-parallel
    dimensions, as torchtitan's `parallelize_llama` orders them; with `--cp`, FSDP2 shards over
    dp_shard x cp flattened (torchtitan's dp_shard_cp: the context-parallel ranks hold the same
    weights, so they share their shards) and the inputs are split along the sequence
    (memorymark/backends/context_parallel.py)."""
    hardware = settings.hardware
    if hardware.tp > 1 or hardware.cp > 1:
        if hardware.dist in ("ddp", "zero1", "hsdp"):
            # torchtitan's apply_ddp: "DDP has not supported > 1D parallelism".
            raise ValueError(
                f"--dist {hardware.dist} beside --tp or --cp is not modelled: use --dist fsdp, "
                "which torchtitan composes with them"
            )
        parts = parts if parts is not None else mesh_parts(mesh)
        return _parallel(model, settings, parts, pin_memory=pin_memory)
    if settings.hardware.dist in topology.SHARDED:
        fully_shard_all(model, settings, mesh, pin_memory=pin_memory)
        return model
    if settings.hardware.dist in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, process_group=mesh.get_group(), **ddp_kwargs)
    raise ValueError(f"no distributed strategy to apply for dist={settings.hardware.dist!r}")


def mesh_parts(mesh: Any) -> dict[str, Any]:
    """The sub-meshes tensor and context parallelism and FSDP2 use, by role: "tp", "cp", and
    "dp" (what FSDP2 shards over: dp_shard, cp, or both flattened as torchtitan's
    dp_shard_cp), each where the mesh has it. Slicing a mesh makes tensors: call this outside
    fake mode."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    parts = {role: mesh[role] for role in ("tp", "cp") if role in names}
    sharded = [n for n in ("dp_shard", "cp") if n in names]
    if len(sharded) == 1:
        parts["dp"] = mesh[sharded[0]]
    elif sharded:
        parts["dp"] = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    return parts


def _parallel(
    model: nn.Module, settings: Settings, parts: dict[str, Any], *, pin_memory: bool
) -> nn.Module:
    """Tensor and context parallelism, then FSDP2 over what data parallelism is left."""
    from memorymark.backends import context_parallel, tensor_parallel

    if "tp" in parts:
        tensor_parallel.apply_tp(model, parts["tp"], loss_parallel=True)
    if "cp" in parts:
        context_parallel.shard_inputs(model, parts["cp"])
    if "dp" in parts:  # else tensor parallelism alone: each rank holds its split, whole
        fully_shard_all(model, settings, parts["dp"], pin_memory=pin_memory)
    return model


def fully_shard_all(model: nn.Module, settings: Settings, mesh: Any, *, pin_memory: bool) -> None:
    """FSDP2's `fully_shard` on every block, then the root, over `mesh`."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    kwargs = {
        "mesh": mesh,
        "mp_policy": _mp_policy(settings),
        "offload_policy": CPUOffloadPolicy(pin_memory=pin_memory)
        if settings.hardware.offload == "cpu"
        else OffloadPolicy(),
    }
    reshard = settings.hardware.dist != "fsdp-no-reshard"
    for block in blocks(model):
        fully_shard(block, reshard_after_forward=reshard, **kwargs)
    fully_shard(model, reshard_after_forward=reshard, **kwargs)


def build_optimizer(
    settings: Settings, model: nn.Module, mesh: Any
) -> torch.optim.Optimizer | None:
    """The optimizer over the trainable parameters; zero1 shards its state with
    `ZeroRedundancyOptimizer` (each rank steps its own partition, then broadcasts it)."""
    params = [p for p in model.parameters() if p.requires_grad]
    local = optimizers.build_optimizer(settings.workload.optimizer, params)
    if settings.hardware.dist != "zero1" or local is None:
        return local
    with warnings.catch_warnings():
        # torch.distributed.optim scripts its functional optimizers at import, and torch 2.13
        # deprecates torch.jit.script and .interface: a warning about PyTorch's code.
        warnings.filterwarnings("ignore", "`torch.jit.[a-z]*` is deprecated", DeprecationWarning)
        from torch.distributed.optim import ZeroRedundancyOptimizer

    # The local optimizer's own settings, as far as its constructor takes them back.
    accepted = inspect.signature(type(local).__init__).parameters
    defaults = {k: v for k, v in local.defaults.items() if k in accepted and k != "params"}
    return ZeroRedundancyOptimizer(
        params, optimizer_class=type(local), process_group=mesh.get_group(), **defaults
    )
