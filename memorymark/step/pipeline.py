"""One pipeline-parallel rank's training step: its stages of a decoder, run by a schedule.

torchtitan splits a decoder into stages (torchtitan/distributed/pipeline_parallel.py,
`pipeline_module_split`): each stage is a copy of the model with the layers of the others
deleted, the first keeping the token embeddings and the last the final norm and the output
layer; the loss runs on the last stage. `split` does the same to a transformers decoder
(`model.embed_tokens`, `model.layers`, `model.norm`, `lm_head`) with a `StageModule` per stage.
Layers are shared out evenly, the earlier stages taking one more where they do not divide.
Rank r holds stage r, and with interleaved schedules r + pp, r + 2 pp, ... (torch's "loop"
placement, as torchtitan's `stage_ids_this_rank`).

`PipelineStep` is the `TrainingStep` of one rank: `run_step` builds torch's `PipelineStage` for
each of its stages (with their inputs' and outputs' shapes given: a fake process group moves no
metadata) and the schedule the settings name (ScheduleGPipe, Schedule1F1B,
ScheduleInterleaved1F1B), which splits the local batch into microbatches, receives activations
and gradients into buffers it allocates, and runs the loss on the last stage. Must not know
how memory is counted or which process group it runs on (the backend hands it `group`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memorymark import cuda_rules, models
from memorymark.settings import Settings
from memorymark.step.catalog import CatalogStep
from memorymark.step.protocol import OnPhase, Phase, RunOptimizer, no_phase, run_now


def stages_of_rank(rank: int, pp: int, virtual_stages: int) -> tuple[int, ...]:
    """The stages pipeline rank `rank` holds: r, r + pp, ... (torch's interleaved placement)."""
    return tuple(rank + pp * k for k in range(virtual_stages))


def layer_split(layers: int, stages: int) -> list[range]:
    """The layers of each stage: as even as they go, the earlier stages one more where the
    count does not divide."""
    if stages > layers:
        raise ValueError(
            f"{stages} pipeline stages over {layers} layers: each stage needs a layer, so use "
            "fewer stages (--pp, --virtual-stages)"
        )
    share, extra = divmod(layers, stages)
    bounds = [0]
    for s in range(stages):
        bounds.append(bounds[-1] + share + (s < extra))
    return [range(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


def micro_batch(batch_size: int, microbatches: int) -> int:
    """Samples in each microbatch of a local batch, or a one-line refusal where they do not
    divide it (the stages are built for one microbatch shape)."""
    if batch_size % microbatches:
        raise ValueError(
            f"a local batch of {batch_size} does not split into {microbatches} microbatches: "
            f"use a batch that is a multiple of {microbatches} (--step {microbatches}), or "
            "another --microbatches"
        )
    return batch_size // microbatches


class StageModule(nn.Module):
    """One pipeline stage of a transformers decoder: its run of layers, with the embeddings on
    the first stage and the final norm and output layer on the last (torchtitan's split: the
    modules of other stages are not held). Forward runs under the step's autocast, as the
    unsplit model's forward would."""

    def __init__(
        self,
        model: Any,
        layers: range,
        *,
        first: bool,
        last: bool,
        autocast: Callable[[], contextlib.AbstractContextManager[None]],
    ) -> None:
        super().__init__()
        decoder = model.model
        # Typed as Any: transformers' modules, called as they are in the unsplit forward.
        self.embed_tokens: Any = decoder.embed_tokens if first else None
        self.layers = nn.ModuleList(decoder.layers[i] for i in layers)
        self.rotary_emb: Any = decoder.rotary_emb
        self.norm: Any = decoder.norm if last else None
        self.lm_head: Any = model.lm_head if last else None
        # FSDP2 wraps each of these one by one (memorymark/backends/sharding.py `blocks`).
        self._no_split_modules = list(getattr(model, "_no_split_modules", None) or ())
        self.config: Any = model.config
        """The whole model's config: tensor parallelism reads its plan from it."""
        self._autocast = autocast
        self.on_phase: OnPhase = no_phase
        self.tp_mesh: Any = None
        """The tensor-parallel mesh when the stage's blocks are split (set by the backend):
        the residual stream between stages is then each rank's slice of the sequence."""

    def get_input_embeddings(self) -> Any:
        """The token embeddings, on the first stage (None elsewhere)."""
        return self.embed_tokens

    def get_output_embeddings(self) -> Any:
        """The output layer, on the last stage (None elsewhere)."""
        return self.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.on_phase(Phase.FORWARD)
        with self._autocast():
            h = self.embed_tokens(x) if self.embed_tokens is not None else x
            if self.tp_mesh is not None and self.embed_tokens is None:
                # Stages pass plain tensors: under tensor parallelism, this rank's slice of the
                # sequence-split stream (torchtitan's stages hand on local tensors too).
                from torch.distributed.tensor import DTensor, Shard

                h = DTensor.from_local(h, self.tp_mesh, [Shard(1)], run_check=False)
            positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            rotary = self.rotary_emb(h, positions)
            for layer in self.layers:
                out = layer(h, position_embeddings=rotary, position_ids=positions)
                h = out[0] if isinstance(out, tuple) else out
            if self.norm is None or self.lm_head is None:
                local = getattr(h, "to_local", None)
                return local() if self.tp_mesh is not None and local is not None else h
            h = self.norm(h)
            self.on_phase(Phase.LOGITS)
            return self.lm_head(h)


def split(model: Any, stages: tuple[int, ...], n_stages: int, autocast: Any) -> nn.ModuleList:
    """The stages `stages` (of `n_stages`) of a transformers decoder, as torchtitan splits it."""
    decoder: Any = getattr(model, "model", None)
    if not all(
        hasattr(decoder, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")
    ) or not hasattr(model, "lm_head"):
        raise ValueError(
            f"--pp splits Llama-style decoders (model.embed_tokens, model.layers, model.norm, "
            f"lm_head); {type(model).__name__} is not one: drop --pp"
        )
    layers = layer_split(len(decoder.layers), n_stages)
    return nn.ModuleList(
        StageModule(model, layers[s], first=s == 0, last=s == n_stages - 1, autocast=autocast)
        for s in stages
    )


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' causal LM loss (`ForCausalLMLoss`: logits upcast to fp32, labels shifted
    left), what the unsplit model's forward computes from its labels."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    return ForCausalLMLoss(logits, labels, vocab_size=logits.shape[-1])


def chunks(model: nn.Module) -> list[StageModule]:
    """The stages of a rank's model (`PipelineStep.build_model`'s ModuleList), in order."""
    assert isinstance(model, nn.ModuleList)
    return [chunk for chunk in model if isinstance(chunk, StageModule)]


def schedule_class(name: str) -> type:
    """torch.distributed.pipelining's schedule for `--pp-schedule`."""
    from torch.distributed import pipelining

    return {
        "gpipe": pipelining.ScheduleGPipe,
        "1f1b": pipelining.Schedule1F1B,
        "interleaved-1f1b": pipelining.ScheduleInterleaved1F1B,
    }[name]


@dataclass
class PipelineStep:
    """The training step of pipeline rank `rank` (a `TrainingStep`): the catalog's step for
    `settings`, its model cut to the rank's stages and run by the schedule."""

    settings: Settings
    rank: int
    group: Any = None
    """The pipeline process group (the mesh's pp dimension), set by the backend."""
    activation_dtype: torch.dtype = torch.float32
    """The dtype stages pass on: FSDP2's compute dtype, the weights' (bf16-true), else fp32
    (a residual stream of fp32 weights stays fp32 under autocast). Set by the backend."""
    layers: int | None = None
    """Build the model with this many blocks (None: its config's count)."""
    user_code: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        # torch.distributed.pipelining makes a tensor as it is imported (microbatch.py's
        # `sum_reducer`, 4 bytes): imported here, before any step is tracked, so no rank counts
        # it as the step's (on a GPU it is host memory).
        from torch.distributed import pipelining  # noqa: F401

    @property
    def catalog(self) -> CatalogStep:
        """The unsplit step: model, optimizer, batch and precision come from it."""
        return CatalogStep(self.settings, layers=self.layers)

    @property
    def pp(self) -> int:
        return self.settings.hardware.pp

    @property
    def n_stages(self) -> int:
        """Stages of the whole pipeline: pp, times the virtual stages each rank holds."""
        return self.pp * self.settings.hardware.virtual_stages

    @property
    def stages(self) -> tuple[int, ...]:
        """The stages this rank holds."""
        return stages_of_rank(self.rank, self.pp, self.settings.hardware.virtual_stages)

    @property
    def microbatches(self) -> int:
        """Microbatches a step splits the local batch into (default: one per pipeline rank,
        the fewest Schedule1F1B takes)."""
        return self.settings.hardware.pipeline_microbatches

    def build_model(self, *, emulate_kernels: bool = False) -> nn.Module:
        """This rank's stages (a ModuleList, one `StageModule` each) of the catalog's model."""
        model = self.catalog.build_model(emulate_kernels=emulate_kernels)
        return split(model, self.stages, self.n_stages, self._autocast)

    def build_optimizer(self, model: nn.Module) -> Any:
        return self.catalog.build_optimizer(model)

    def make_batch(self, batch_size: int, device: torch.device | str) -> dict[str, torch.Tensor]:
        return self.catalog.make_batch(batch_size, device)

    def prime_optimizer(self, model: nn.Module, optimizer: Any, run_step: RunOptimizer = run_now):
        self.catalog.prime_optimizer(model, optimizer, run_step)

    def _autocast(self) -> contextlib.AbstractContextManager[None]:
        return cuda_rules.autocast(self.settings.workload.precision, "cpu")

    def run_step(
        self,
        model: nn.Module,
        optimizer: Any,
        batch_size: int,
        device: torch.device | str,
        on_phase: OnPhase = no_phase,
        run_optimizer: RunOptimizer = run_now,
    ) -> None:
        """One optimizer step: `grad_accum` runs of the schedule over the local batch
        `batch_size` (its microbatches' gradients adding up), then the optimizer step."""
        catalog = self.catalog
        model.train()
        with self._listening(model, on_phase):
            schedule = self._schedule(model, micro_batch(batch_size, self.microbatches), device)
            try:
                for _ in range(self.settings.workload.grad_accum):
                    on_phase(Phase.FORWARD)
                    self._run_schedule(schedule, catalog.make_batch(batch_size, device))
                if optimizer is not None:
                    on_phase(Phase.OPTIMIZER)
                    run_optimizer(lambda: catalog._optimizer_phase(model, optimizer, None))
            finally:
                model.zero_grad(set_to_none=True)

    def _run_schedule(self, schedule: Any, batch: dict[str, torch.Tensor]) -> None:
        first, last = 0 in self.stages, self.n_stages - 1 in self.stages
        args = (batch["input_ids"],) if first else ()
        target = batch["labels"] if last else None
        del batch
        with warnings.catch_warnings():
            # Under tensor parallelism a stage hands on its DTensor's local slice, a view, and
            # FSDP2 warns that an in-place op on it would skip its pre-backward hook; the
            # schedule only sends it and runs backward from it.
            warnings.filterwarnings("ignore", "FSDP2-wrapped module .* returned a view tensor")
            # The first stage's inputs are token ids, which take no gradient: the hook that
            # hears its backward fires on its outputs' gradients, as meant (torch 2.13 warns).
            warnings.filterwarnings("ignore", "Full backward hook is firing when gradients")
            schedule.step(*args, target=target)

    @contextlib.contextmanager
    def _listening(self, model: nn.Module, on_phase: OnPhase) -> Iterator[None]:
        """The step's phases heard from its stages: forward as each runs, backward as its
        gradient arrives (the schedule interleaves them)."""
        hooks = []
        for chunk in chunks(model):
            chunk.on_phase = on_phase
            hooks.append(chunk.register_full_backward_pre_hook(lambda *_: on_phase(Phase.BACKWARD)))
        try:
            yield
        finally:
            for chunk, hook in zip(chunks(model), hooks, strict=True):
                chunk.on_phase = no_phase
                hook.remove()

    def _schedule(self, model: nn.Module, micro: int, device: torch.device | str) -> Any:
        """torch's stages for this rank's modules and the schedule over them."""
        from torch.distributed.pipelining import PipelineStage

        stages = [
            PipelineStage(
                chunk,
                index,
                self.n_stages,
                torch.device(device),
                input_args=self._example(index, micro, output=False),
                output_args=self._example(index, micro, output=True),
                group=self.group,
            )
            for chunk, index in zip(chunks(model), self.stages, strict=True)
        ]
        kind = schedule_class(self.settings.hardware.pp_schedule)
        one = stages if kind.__name__ == "ScheduleInterleaved1F1B" else stages[0]
        return kind(one, self.microbatches, loss_fn=causal_lm_loss)

    def _example(self, stage: int, micro: int, *, output: bool) -> torch.Tensor:
        """A tensor of the shape and dtype stage `stage` takes in (or gives out) per microbatch:
        the metadata torch's `PipelineStage` is given when ranks cannot exchange it (on the
        meta device: it keeps their shapes, not them)."""
        seq = self.settings.workload.seq_len
        config = models.config_of(self.catalog.entry) or {}
        if not output and stage == 0:
            return torch.zeros((micro, seq), dtype=torch.long, device="meta")
        if output and stage == self.n_stages - 1:
            dtype = cuda_rules.AUTOCAST_DTYPES.get(self.settings.workload.precision)
            shape = (micro, seq, config["vocab_size"])
            logits = torch.zeros(shape, dtype=dtype or self.activation_dtype, device="meta")
            return logits.requires_grad_()
        # Under tensor parallelism a stage hands on its slice of the sequence.
        shape = (micro, seq // self.settings.hardware.tp, config["hidden_size"])
        hidden = torch.zeros(shape, dtype=self.activation_dtype, device="meta")
        return hidden.requires_grad_()
