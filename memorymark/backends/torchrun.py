"""Measuring many GPUs for real: the same sweep on every rank under `torchrun`, in lock-step.

`torchrun --nproc-per-node N -m memorymark analyze MODEL --dist fsdp --gpus N` starts N
processes; each builds the model on its own device, spreads it with the same PyTorch code the
simulation runs (memorymark/backends/sharding.py) over the real process group (NCCL on CUDA, gloo on
CPU), and sweeps. The ranks must agree on every verdict or they propose different batch sizes
and wait forever in each other's collectives: after each probe they all-reduce (MAX) whether it
ran out of memory, whether it fits, and its bytes, and each rank's strategy sees the same
agreed measurement. Only rank 0 prints.

A rank that runs out of memory *inside* the step, while another rank is already waiting in a
collective of the same step, would leave that rank waiting: symmetric ranks run out at the same
allocation, so in practice they fail together, and the process group's timeout
(`MEMORYMARK_DIST_TIMEOUT`, seconds, 300 by default) turns a rank left waiting into an error
rather than a hang. This module knows nothing about search or reports.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from memorymark.backends import sharding
from memorymark.backends.base import Backend
from memorymark.measurement import Measurement
from memorymark.settings import Settings

DEFAULT_TIMEOUT_SECONDS = 300


def under_torchrun() -> bool:
    """True in a process torchrun started (it sets RANK, WORLD_SIZE and LOCAL_RANK)."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def rank() -> int:
    """This process's rank (0 outside torchrun)."""
    return int(os.environ.get("RANK", "0"))


def ensure_process_group(device: str) -> None:
    """Join torchrun's process group once per process: NCCL for CUDA, gloo for CPU."""
    if dist.is_initialized():
        return
    seconds = float(os.environ.get("MEMORYMARK_DIST_TIMEOUT", DEFAULT_TIMEOUT_SECONDS))
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(
        "nccl" if device == "cuda" else "gloo", timeout=datetime.timedelta(seconds=seconds)
    )
    atexit.register(dist.destroy_process_group)


def check_world(settings: Settings) -> None:
    """Refuse settings whose GPU count is not the number of processes torchrun started."""
    world = int(os.environ["WORLD_SIZE"])
    if settings.hardware.dist == "none" and settings.hardware.model_parallel != world:
        raise ValueError(f"torchrun started {world} processes: choose --dist (fsdp, ddp, ...)")
    if settings.hardware.gpu_count != world:
        raise ValueError(
            f"--gpus {settings.hardware.gpus} under torchrun with {world} processes: "
            f"give --gpus {world}"
        )


def agree(m: Measurement, device: str) -> Measurement:
    """The measurement every rank reports: out of memory if any rank was, fits only if every
    rank fits, the largest bytes of any rank."""
    flags = [
        int(not m.runs),
        int(not m.fits),
        m.peak_bytes,
        m.required_bytes if m.required_bytes is not None else -1,
    ]
    values = torch.tensor(flags, dtype=torch.int64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    any_oom, any_unfit, peak, required = (int(v) for v in values.tolist())
    error = m.error
    if any_oom and m.runs:
        error = "another rank ran out of memory at this batch"
    return replace(
        m,
        runs=not any_oom,
        fits=not any_oom and not any_unfit,
        peak_bytes=peak,
        required_bytes=None if required < 0 else required,
        error=error,
    )


class RankedBackend:
    """Mixed into a real backend (cuda, cpu): spreads the model over torchrun's process group
    and agrees on each probe with the other ranks."""

    training_step: Any
    device: str
    _tracker: Any
    _failed_tracker: Any

    def _mesh(self) -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        shape, names = sharding.mesh_shape(self.training_step.settings)
        return self._on_host(init_device_mesh(self.device, shape, mesh_dim_names=names))

    def _on_host(self, mesh: Any) -> Any:
        """`mesh`, its rank layout (`DeviceMesh.mesh`, a CPU tensor beside any device) not
        counted: host memory on a GPU, which a CPU run's tracker would add to every peak (8
        bytes for 2 ranks; the simulation's fake mesh holds none)."""
        if self._failed_tracker is not None:  # setting up runs under it (base._prepare)
            self._failed_tracker.to_host(mesh.mesh)
        return mesh

    def _distribute(self, model: nn.Module) -> nn.Module:
        self._device_mesh = self._mesh()
        ddp = {"device_ids": [torch.cuda.current_device()]} if self.device == "cuda" else {}
        return sharding.shard_model(model, self.training_step.settings, self._device_mesh, ddp)

    def _build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer | None:
        if self.training_step.settings.workload.forward_only:
            return None
        return sharding.build_optimizer(self.training_step.settings, model, self._device_mesh)

    @contextlib.contextmanager
    def _step_context(self) -> Iterator[None]:
        from memorymark.backends.dist_sim import fsdp_reported_to, parallel_contexts

        with contextlib.ExitStack() as stack:
            stack.enter_context(super()._step_context())  # type: ignore[misc]
            stack.enter_context(fsdp_reported_to(self._tracker))
            mesh = getattr(self, "_device_mesh", None)
            for context in parallel_contexts(sharding.mesh_parts(mesh) if mesh else {}):
                stack.enter_context(context)
            yield

    def measure(self, batch_size: int) -> Measurement:
        return agree(super().measure(batch_size), self.device)  # type: ignore[misc]


class RankedPipelineBackend(RankedBackend):
    """Mixed into a real backend: this rank's pipeline stages (memorymark/step/pipeline.py) on
    torchrun's mesh, torchtitan's layout (memorymark/distributed/layout.py), FSDP2 on each
    stage over the data-parallel ranks as the simulation runs it (pipeline_sim.shard_stages)."""

    def _mesh(self) -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        shape, names = self.training_step.settings.hardware.layout().mesh()
        return self._on_host(init_device_mesh(self.device, shape, mesh_dim_names=names))

    def _distribute(self, model: nn.Module) -> nn.Module:
        from memorymark.backends import pipeline_sim

        settings = self.training_step.settings
        mesh = self._device_mesh = self._mesh()
        sharded = pipeline_sim.sharded_stages(settings, int(os.environ["WORLD_SIZE"]))
        self.training_step.group = mesh["pp"].get_group()
        self.training_step.activation_dtype = pipeline_sim.activation_dtype(settings, sharded)
        if settings.hardware.tp > 1:  # each stage split first, as the simulation splits it
            pipeline_sim.split_stages(model, self._on_host(mesh["tp"]))
        return pipeline_sim.shard_stages(model, settings, mesh) if sharded else model


def pipeline_rank(settings: Settings) -> int:
    """This process's place in the pipeline (pp is the mesh's outermost dimension)."""
    return rank() // (int(os.environ["WORLD_SIZE"]) // settings.hardware.pp)


def ranked(backend_class: type[Backend]) -> type[Backend]:
    """`backend_class` run as one rank of torchrun's job."""
    return type(f"Ranked{backend_class.__name__}", (RankedBackend, backend_class), {})


def ranked_pipeline(backend_class: type[Backend]) -> type[Backend]:
    """`backend_class` run as one pipeline rank of torchrun's job (its step a PipelineStep)."""
    name = f"RankedPipeline{backend_class.__name__}"
    return type(name, (RankedPipelineBackend, backend_class), {})
