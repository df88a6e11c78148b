"""Pipeline parallelism simulated: every distinct stage's rank runs its schedule, the worst decides.

Pipeline ranks hold different things (the first the embeddings, the last the norm, output layer
and loss) and keep different numbers of microbatches in flight (under 1F1B rank r runs
pp - r forwards before its first backward; under GPipe every rank holds all of them), so one
rank does not stand for the others. `PipelineSimBackend` simulates rank 0, rank 1 and the last
pipeline rank, each a `StageSimBackend`: `DistSimBackend` (a fake process group, with this
process as that rank) running `memorymark/step/pipeline.py`'s step on the mesh torchtitan
builds (memorymark/distributed/layout.py), with FSDP2 over the data-parallel dimension of each
stage. Ranks 2 .. pp-2 hold as many layers as rank 1 or one fewer and fewer microbatches in
flight, so rank 1 stands for them (an upper bound). The measurement is the worst stage's, with
every stage's peak beside it (`Measurement.stages`).

Under PP, FSDP2 keeps each stage's parameters gathered from forward to backward
(`reshard_after_forward=False`), as torchtitan does by default (`fsdp_reshard_after_forward =
"default"`: "False for PP"), so a block is not gathered again for every microbatch. Each rank's
stages are depth-replayed (memorymark/backends/depth_replay.py) where the model's blocks are
alike and split evenly: the model built with k blocks a stage gives that rank's stages at
depth k. This module knows nothing about search or reports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from memorymark import cuda_rules, models
from memorymark.backends import sharding
from memorymark.backends.base import Backend
from memorymark.backends.dist_sim import DistSimBackend, _sharding_patches
from memorymark.cuda_rules.scoped_patch import ScopedPatch
from memorymark.distributed import layout, layout_costs, topology
from memorymark.measurement import DepthReplay, Measurement, StagePeak
from memorymark.settings import Settings
from memorymark.step.pipeline import PipelineStep, chunks, micro_batch


def check(settings: Settings) -> None:
    """Refuse, in one line, what the pipeline simulation does not run."""
    s = settings
    config = models.config_of(models.find_model(s.workload.model)) or {}
    layout.check_model(
        s.hardware.layout(),
        heads=None,
        kv_heads=None,
        layers=config.get("num_hidden_layers"),
        seq_len=None,
        pp_stages_per_rank=s.hardware.virtual_stages,
    )
    microbatches = s.hardware.pipeline_microbatches
    if s.hardware.pp_schedule == "1f1b" and microbatches < s.hardware.pp:
        # torch's Schedule1F1B refuses fewer (schedules.py, Schedule1F1B.__init__).
        raise ValueError(
            f"--microbatches {microbatches} under 1f1b: it takes at least one a stage, so give "
            f"{s.hardware.pp} or more (or --pp-schedule gpipe)"
        )
    if s.hardware.dist in ("ddp", "zero1"):
        raise ValueError(
            f"--pp with --dist {s.hardware.dist} is not modelled: use --dist fsdp, as torchtitan "
            "shards each stage"
        )
    refusals = (
        (s.workload.forward_only, "a forward-only step"),
        (s.workload.eval_batch is not None, "an evaluation pass (--eval-batch)"),
        (s.workload.kernels == "liger" or bool(s.workload.loss_chunks), "a fused loss"),
        (bool(s.workload.lora_rank), "LoRA"),
        (s.workload.quantization != "none", "quantization"),
        (cuda_rules.uses_grad_scaler(s.workload.precision), "16-mixed's GradScaler"),
        (s.hardware.offload == "cpu", "CPU offload"),
    )
    for refused, what in refusals:
        if refused:
            raise ValueError(f"--pp with {what} is not simulated: drop one of them")


def simulated_ranks(pp: int) -> tuple[int, ...]:
    """The pipeline ranks simulated: the first, the second (for the middle ones), the last."""
    return tuple(sorted({0, min(1, pp - 1), pp - 1}))


class StageSimBackend(DistSimBackend):
    """One pipeline rank's step (`PipelineStep`) on a fake process group, as that rank."""

    travels = False  # its rank and stage are set past the constructor: traced in this process

    def __init__(self, step: PipelineStep, **kwargs: Any) -> None:
        super().__init__(step, **kwargs)
        self.step = step
        self.rank = step.rank * (self.world_size // step.pp)  # pp is the mesh's outermost dim

    def _mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        return self.training_step.settings.hardware.layout(self.world_size).mesh()

    def _open_group(self) -> None:
        super()._open_group()
        self.step.group = self._mesh["pp"].get_group()
        self.step.activation_dtype = self._activation_dtype()

    def _sharded(self) -> bool:
        return sharded_stages(self.training_step.settings, self.world_size)

    def _activation_dtype(self) -> torch.dtype:
        return activation_dtype(self.training_step.settings, self._sharded())

    @contextlib.contextmanager
    def _step_context(self) -> Iterator[None]:
        vote = _static_vote()
        with super()._step_context(), vote.active() if vote else contextlib.nullcontext():
            yield

    def _distribute(self, model: nn.Module) -> nn.Module:
        tp = self._parts.get("tp")
        if tp is None and not self._sharded():
            return model
        with contextlib.ExitStack() as stack:
            for patch in _sharding_patches():
                stack.enter_context(patch.active())
            if tp is not None:
                split_stages(model, tp)
            if not self._sharded():
                return model
            return shard_stages(model, self.training_step.settings, self._mesh)


@functools.cache
def _static_vote() -> ScopedPatch | None:
    from torch.distributed.pipelining import schedules

    base = getattr(schedules, "_PipelineSchedule", None)
    if base is None or not hasattr(base, "_warmup_p2p"):
        return None  # a release without the vote: nothing to stand in for
    return ScopedPatch(base, "_warmup_p2p", _vote_locally)


def _vote_locally(
    original: Callable[..., Any], schedule: Any, stages: list[Any], *args: Any
) -> Any:
    """The schedule's first step, where its stages vote across ranks on how they learn their
    neighbours' shapes (`_warmup_p2p`): on a fake group, decided here, as torch 2.14 does.
    torch 2.13 runs the vote and reads its result (`result.item() == 1` in
    torch/distributed/pipelining/schedules.py), a value a fake tensor has not: every pipeline
    failed at its first step there, as on the hosted app's pinned torch. 2.14 sets each
    `PipelineStage` static, with no vote, under a fake group with a neighbour on another rank
    (the stages are given their shapes: `PipelineStep._example`); so does this, on any release
    that has the vote. Anything else runs as torch has it."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining._utils import InferenceMode

    def crosses_ranks(st: Any) -> bool:
        return (not st.is_first and not st._is_same_rank(st.stage_index - 1)) or (
            not st.is_last and not st._is_same_rank(st.stage_index + 1)
        )

    if (
        stages
        and all(isinstance(st, PipelineStage) for st in stages)
        and any(crosses_ranks(st) for st in stages)
        and all(dist.get_backend(st.group) == "fake" for st in stages)
    ):
        for st in stages:
            st._inference_mode = InferenceMode.STATIC
        return None
    return original(schedule, stages, *args)


def sharded_stages(settings: Settings, gpus: int) -> bool:
    """Whether FSDP2 shards each stage: an FSDP strategy over more than one data-parallel rank."""
    return settings.hardware.dist in topology.SHARDED and settings.hardware.layout(gpus).dp > 1


def activation_dtype(settings: Settings, sharded: bool) -> torch.dtype:
    """The dtype stages pass on: FSDP2's compute dtype (its MixedPrecisionPolicy casts the
    weights), else the weights' (bf16-true), else fp32 (a residual stream of fp32 weights stays
    fp32 under autocast)."""
    precision = settings.workload.precision
    if sharded and settings.hardware.mp_policy == "auto":
        compute = cuda_rules.AUTOCAST_DTYPES.get(precision)
        if compute is not None:
            return compute
    return cuda_rules.parameter_dtype(precision) or torch.float32


def split_stages(model: nn.Module, tp_mesh: Any) -> None:
    """Tensor parallelism in each stage of a rank, before FSDP2 as torchtitan orders them: the
    stage's blocks, and its embeddings, final norm and output layer where it holds them
    (memorymark/backends/tensor_parallel.py), the logits split by vocabulary for
    `loss_parallel()`."""
    from memorymark.backends import tensor_parallel

    for chunk in chunks(model):
        tensor_parallel.apply_tp(
            chunk, tp_mesh, loss_parallel=True, config=chunk.config, blocks=list(chunk.layers)
        )
        chunk.tp_mesh = tp_mesh


def shard_stages(model: nn.Module, settings: Settings, mesh: Any) -> nn.Module:
    """FSDP2 on each stage of a rank (its blocks, then the stage), over the mesh's dp_shard
    dimension, parameters kept gathered from forward to backward (torchtitan under PP)."""
    from torch.distributed.fsdp import fully_shard

    kwargs = {"mesh": mesh["dp_shard"], "mp_policy": sharding._mp_policy(settings)}
    for chunk in chunks(model):  # torchtitan: parallelize each model part
        for block in sharding.blocks(chunk):
            fully_shard(block, reshard_after_forward=False, **kwargs)
        fully_shard(chunk, reshard_after_forward=False, **kwargs)
    return model


class PipelineSimBackend(Backend):
    """The worst of the pipeline's distinct ranks, each simulated by a `StageSimBackend`."""

    name = "sim"
    measured = False
    holds_memory = False

    def __init__(
        self, settings: Settings, open_stage: Callable[[PipelineStep], StageSimBackend]
    ) -> None:
        check(settings)
        pp = settings.hardware.pp
        steps = [PipelineStep(settings, rank) for rank in simulated_ranks(pp)]
        self.stages = [open_stage(step) for step in steps]
        first = self.stages[0]
        super().__init__(steps[0], policy=first.policy)
        self.roofline = None

    def measure(self, batch_size: int) -> Measurement:
        """Each distinct rank's step at local batch `batch_size`; the worst stage's measurement
        with every stage's peak (`stages`)."""
        micro = micro_batch(batch_size, self.stages[0].step.microbatches)
        measured: list[Measurement] = []
        for backend in self.stages:
            try:
                measured.append(backend.measure(batch_size))
            finally:
                backend.release()  # the process group is process-wide: the next rank's turn
        peaks = tuple(
            StagePeak(
                pp_rank=backend.step.rank,
                rank=backend.rank,
                stages=backend.step.stages,
                stands_for=_stands_for(backend.step.rank, backend.step.pp),
                micro_batch=micro,
                peak_bytes=m.peak_bytes,
                reserved_bytes=m.cuda_reserved_bytes,
                fits=m.fits,
            )
            for backend, m in zip(self.stages, measured, strict=True)
        )
        worst = max(range(len(measured)), key=lambda i: _severity(measured[i]))
        return dataclasses.replace(
            measured[worst],
            stages=peaks,
            worst_stage=worst,
            samples_per_second=self._pipeline_rate(measured),
            throughput_source=measured[worst].throughput_source,
            step_flops=None,
            step_seconds=None,
        )

    def _pipeline_rate(self, measured: list[Measurement]) -> float | None:
        """Samples a second through the pipeline (estimated): its slowest stage's rate, idle
        for the bubble's share of the step (`layout_costs.bubble_fraction`). Each rank's rate
        is its own step's on the roofline; rank 1 stands for the middle ones, alike."""
        rates = [m.samples_per_second for m in measured]
        if not rates or any(r is None for r in rates):
            return None
        hw = self.training_step.settings.hardware
        microbatches = self.stages[0].step.microbatches
        bubble = layout_costs.bubble_fraction(
            hw.pp, microbatches, hw.pp_schedule, hw.virtual_stages
        )
        return min(cast(list[float], rates)) * (1 - bubble)

    @property
    def depth_replay(self) -> DepthReplay | None:
        """What the depth replay of each rank's stages traced and replayed, the ranks that
        traced theirs in full and why; None where it was not asked for."""
        settings = self.training_step.settings
        if settings.search.depth != "replay":
            return None
        config = models.config_of(models.find_model(settings.workload.model)) or {}
        layers = config.get("num_hidden_layers", 0)
        why = next((b.depth_why for b in self.stages if b.depth_why), None)
        ranks = [(b.step.rank, s) for b in self.stages if (s := b.depth_replay) is not None]
        if why is not None or len(ranks) < len(self.stages):
            return DepthReplay(layers, (), 0, 0, why)
        replayed = [s for _, s in ranks if s.fallback is None]
        full = [f"pipeline rank {r}: {s.fallback}" for r, s in ranks if s.fallback]
        if not replayed:
            return DepthReplay(layers, (), 0, 0, "; ".join(full))
        return DepthReplay(
            replayed[0].layers,
            tuple(sorted({d for s in replayed for d in s.traced_depths})),
            sum(s.traced_steps for _, s in ranks),
            sum(s.replayed_steps for s in replayed),
            f"traced in full for {'; '.join(full)}" if full else None,
            stages=self.stages[0].step.n_stages,
        )

    def resident_bytes(self) -> dict[str, int]:
        """The states of the rank that holds the most before its first step."""
        held = []
        for backend in self.stages:
            try:
                held.append(backend.resident_bytes())
            finally:
                backend.release()
        return max(held, key=lambda h: sum(h.values()))

    def release(self) -> None:
        for backend in self.stages:
            backend.release()


def _stands_for(rank: int, pp: int) -> tuple[int, ...]:
    """The pipeline ranks whose figures rank `rank`'s stand for (rank 1: the middle ones)."""
    if rank == 1 and pp > 2:
        return tuple(range(1, pp - 1))
    return (rank,)


def _severity(m: Measurement) -> tuple[bool, bool, int]:
    """Orders stages by how far they are from fitting: not running, not fitting, then bytes."""
    held = m.required_bytes or m.cuda_reserved_bytes or m.peak_bytes
    return (not m.runs, not m.fits, held)
