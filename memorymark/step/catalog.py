"""What one training step is: the model, its batch, its loss, its optimizer, run once.

A CatalogStep turns `Settings` into a model, an optimizer and a batch of the right shape, and runs
one optimizer step exactly as a training loop does: `model.train()`, then `grad_accum` times forward
with labels, the task's loss (divided by `grad_accum`) and `backward()`, gradients adding up; then
gradient clipping when asked, `optimizer.step()`, `zero_grad(set_to_none=True)`. The precision is
applied as the PyTorch AMP docs and Lightning do it: forward and loss under `torch.autocast`
(bf16-mixed, 16-mixed), a GradScaler for 16-mixed, weights and buffers converted for bf16-true. It
knows nothing about how memory is measured, nor which device it runs on (`cuda_rules` decides how
the precision is applied); the caller passes `on_phase` to hear when forward, backward and the
optimizer start, and may pass `run_optimizer` to decide how the optimizer phase runs (the
simulation runs it once and replays its memory afterwards). `run_eval` is HF Trainer's
evaluation pass between training steps, at the settings' eval batch.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from torch import nn

from memorymark import cuda_rules, models
from memorymark.settings import Settings
from memorymark.step import (
    adapters,
    checkpointing,
    compiled,
    float8,
    fused_loss,
    liger,
    optimizers,
    quantization,
)
from memorymark.step.protocol import OnPhase, Phase, RunOptimizer, no_phase, run_now
from memorymark.step.user_job import simulating

# 16-mixed: the GradScaler of each optimizer, created with its state at the first step and kept
# as long as the optimizer, as a training loop keeps both.
_SCALERS: weakref.WeakKeyDictionary[torch.optim.Optimizer, torch.amp.GradScaler] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True, slots=True)
class CatalogStep:
    """The training step `settings` describe, independent of device and measurement: the
    catalog's implementation of `memorymark.step.protocol.TrainingStep`."""

    settings: Settings
    layers: int | None = None
    """Build the model with this many blocks (the depth replay's shallower steps); None: as
    many as its config says."""
    user_code: ClassVar[bool] = False
    """MemoryMark wrote this step: it reads no values and names no device."""

    @property
    def entry(self) -> models.ModelEntry:
        """The catalog entry of the model being trained."""
        return models.find_model(self.settings.workload.model)

    @property
    def task(self) -> str:
        """The task the step trains."""
        return self.settings.workload.resolved_task

    def build_model(self, *, emulate_kernels: bool = False) -> nn.Module:
        """The model with random weights, on the current default device (meta, cpu, cuda),
        with LoRA adapters and gradient checkpointing when the settings ask for them.

        `emulate_kernels` (the simulation) stands in for CUDA-only kernels the settings name
        (flash_attention_2, Liger) with what they allocate; otherwise the libraries themselves
        are used, and a missing one is a one-line ValueError."""
        s = self.settings
        image_size = s.workload.image_size if self.entry.input_kind == "image" else None
        model = models.build_model(
            self.entry,
            self.task,
            image_size=image_size,
            attn_implementation=s.workload.attention,
            emulate_flash_attention=emulate_kernels,
            layers=self.layers,
        )
        dtype = cuda_rules.parameter_dtype(s.workload.precision)
        if dtype is not None:
            model.to(dtype)  # bf16-true, as Lightning converts the module: parameters and buffers
        if s.workload.quantization != "none":
            # As from_pretrained(quantization_config=BitsAndBytesConfig(...)) then peft's
            # prepare_model_for_kbit_training: the linear layers quantized, the rest in fp32.
            compute = cuda_rules.compute_dtype(s.workload.precision)
            model = quantization.quantize(
                model, s.workload.quantization, s.workload.double_quant, compute
            )
        # Liger's kernels after loading, as Trainer(use_liger_kernel=True) applies them.
        if s.workload.kernels == "liger":
            liger.apply(model, emulated=emulate_kernels)
        elif s.workload.loss_chunks:
            fused_loss.use_fused_loss(model, liger=False, chunks=s.workload.loss_chunks)
        if s.workload.lora_rank:
            model = adapters.apply_lora(
                model, self.task, s.workload.lora_rank, s.workload.lora_targets
            )
        if s.workload.float8 != "none":
            # Before checkpointing and compile, as torchtitan's model converters run first.
            float8.convert(model, s.workload.float8)
        if s.workload.grad_checkpointing:
            checkpointing.enable(model, s.workload.checkpointing)
        if s.workload.compile:
            # After checkpointing, before FSDP (the backend's): torchtitan's order.
            budget = s.workload.activation_memory_budget
            backend = compiled.simulated_backend(budget) if simulating() else None
            if backend is None:
                # A real step compiles afresh too, as the simulation does (SimBackend's
                # `_build_model`): Dynamo's recompile limit, reached by earlier models of the
                # same code in this process, would run this one eagerly without a word.
                torch._dynamo.reset()
            compiled.compile_model(model, backend or compiled.inductor_backend(budget))
        return model

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer | None:
        """The optimizer the settings ask for, over the parameters that train."""
        if self.settings.workload.forward_only:
            return None
        params = [p for p in model.parameters() if p.requires_grad]
        return optimizers.build_optimizer(self.settings.workload.optimizer, params)

    def make_batch(self, batch_size: int, device: torch.device | str) -> dict[str, torch.Tensor]:
        """Model inputs with labels; values are zeros because memory does not depend on them."""
        s = self.settings
        if self.entry.input_kind == "image":
            shape = (batch_size, 3, s.workload.image_size, s.workload.image_size)
            # bf16-true feeds inputs in the weights' dtype, as Lightning's plugin converts them.
            dtype = cuda_rules.parameter_dtype(s.workload.precision) or torch.float32
            batch = {"pixel_values": torch.zeros(shape, dtype=dtype, device=device)}
        else:
            # No attention_mask: without padding it changes nothing, and transformers would
            # otherwise materialise a full mask it treats as real data.
            ids = torch.zeros((batch_size, s.workload.seq_len), dtype=torch.long, device=device)
            batch = {"input_ids": ids}
        if s.workload.loss == "task":
            if self.task in (models.CAUSAL_LM, models.SEQ2SEQ_LM):
                # Seq2seq models shift labels right into decoder inputs themselves.
                batch["labels"] = batch["input_ids"]
            else:
                batch["labels"] = torch.zeros(batch_size, dtype=torch.long, device=device)
        return batch

    def prime_optimizer(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        run_step: RunOptimizer = run_now,
    ) -> None:
        """Create the optimizer's state (AdamW's moments, SGD's momentum) with zero gradients.

        Every real step after the first carries this state, so each measured step must too.
        `run_step` runs the optimizer's first step (without a GradScaler), as `run_step`'s
        `run_optimizer` runs later ones: the simulation records it.
        """
        if optimizer is None:
            return
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        if cuda_rules.uses_grad_scaler(self.settings.workload.precision):
            device = next(model.parameters()).device
            scaler = _SCALERS[optimizer] = torch.amp.GradScaler(device.type)
            # The scale and its growth tracker are created at the first scale(), as in training.
            scaler.scale(torch.zeros((), device=device))
            scaler.step(optimizer)
            scaler.update()
        else:
            run_step(optimizer.step)
        optimizer.zero_grad(set_to_none=True)

    def run_step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        batch_size: int,
        device: torch.device | str,
        on_phase: OnPhase = no_phase,
        run_optimizer: RunOptimizer = run_now,
    ) -> None:
        """Run one optimizer step at micro-batch `batch_size`: `grad_accum` forward/backward
        passes whose gradients add up, clipping if asked, then the optimizer step (through
        `run_optimizer`). Raises the device's OOM error if it does not fit."""
        with _tf32_matmuls(self.settings.workload.tf32):
            self._run_step(model, optimizer, batch_size, device, on_phase, run_optimizer)

    def _run_step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        batch_size: int,
        device: torch.device | str,
        on_phase: OnPhase,
        run_optimizer: RunOptimizer,
    ) -> None:
        s = self.settings
        model.train(s.workload.mode == "train")
        if s.workload.forward_only:
            on_phase(Phase.FORWARD)
            with torch.no_grad(), self._autocast(device):
                self._forward(model, self.make_batch(batch_size, device))
            return
        scaler = None
        if optimizer is not None and cuda_rules.uses_grad_scaler(s.workload.precision):
            # A loop makes its GradScaler before its first step (the optimizer's state and the
            # scale come at that step): an optimizer not primed gets one here.
            scaler = _SCALERS.get(optimizer)
            if scaler is None:
                scaler = _SCALERS[optimizer] = torch.amp.GradScaler(torch.device(device).type)
        try:
            for _ in range(s.workload.grad_accum):
                # From the second micro-batch on, every gradient is alive through forward and
                # backward: that, not the first micro-batch, is the loop's peak.
                self._forward_backward(model, batch_size, device, scaler, on_phase)
            if optimizer is not None:
                on_phase(Phase.OPTIMIZER)
                run_optimizer(lambda: self._optimizer_phase(model, optimizer, scaler))
        finally:
            # set_to_none frees the gradients, as training loops do; after an OOM it also drops
            # the partial gradients so the next probe starts from the same baseline.
            model.zero_grad(set_to_none=True)

    def run_eval(
        self,
        model: nn.Module,
        batch_size: int,
        device: torch.device | str,
        on_phase: OnPhase = no_phase,
    ) -> None:
        """HF Trainer's evaluation loop (`evaluation_loop`) over the eval batches whose
        predictions stay on the GPU together (`Settings.eval_batches_kept`), at eval batch
        `batch_size`: `model.eval()`, then for each batch, under `no_grad` and the training
        forward's autocast, forward with labels (`prediction_step`); the loss (repeated over
        the batch), the logits and the labels are each concatenated onto those kept so far
        (`EvalLoopContainer.add` -> `nested_concat` -> `torch.cat`: the old and the new alive
        at once). Then they are dropped, as moving them to the CPU frees them, and the model
        goes back to training."""
        kept: list[Any] = [None, None, None]  # losses, logits, labels (all_losses, ...)
        try:
            model.eval()
            with torch.no_grad():
                for _ in range(self.settings.workload.eval_batches_kept):
                    for i, new in enumerate(self._predict(model, batch_size, device, on_phase)):
                        if new is not None:
                            kept[i] = new if kept[i] is None else _concat(kept[i], new)
        finally:
            kept.clear()  # to_cpu_and_numpy: the GPU copies go
            model.train(self.settings.workload.mode == "train")

    def _predict(
        self, model: nn.Module, batch_size: int, device: torch.device | str, on_phase: OnPhase
    ) -> tuple[Any, Any, Any]:
        """One `prediction_step`: (losses, logits, labels) as `evaluation_loop` adds them."""
        on_phase(Phase.FORWARD)
        batch = self.make_batch(batch_size, device)
        with self._hearing_logits(model, on_phase), self._autocast(device):
            outputs = self._forward(model, batch)
        on_phase(Phase.LOGITS)  # what is kept is predictions
        loss = getattr(outputs, "loss", None)
        losses = None if loss is None else loss.detach().mean().repeat(batch_size)
        # Trainer's `ignore_keys`: the config's, else ["cache"]; non-tensors it could not
        # concatenate are left out too.
        config = getattr(model, "config", None)
        ignored = {"loss", *getattr(config, "keys_to_ignore_at_inference", ["cache"])}
        values = outputs.items() if isinstance(outputs, dict) else vars(outputs).items()
        logits = tuple(v for k, v in values if k not in ignored and _tensors(v))
        return losses, logits[0] if len(logits) == 1 else logits or None, batch.get("labels")

    def _forward_backward(
        self,
        model: nn.Module,
        batch_size: int,
        device: torch.device | str,
        scaler: torch.amp.GradScaler | None,
        on_phase: OnPhase,
    ) -> None:
        on_phase(Phase.FORWARD)
        batch = self.make_batch(batch_size, device)
        # Forward and loss only; backward runs in the dtypes forward chose.
        with self._hearing_logits(model, on_phase), self._autocast(device):
            loss = self._loss(self._forward(model, batch))
            if self.settings.workload.grad_accum > 1:
                loss = loss / self.settings.workload.grad_accum  # as HF Trainer and Lightning do
        del batch
        on_phase(Phase.BACKWARD)
        (loss if scaler is None else scaler.scale(loss)).backward()

    @contextlib.contextmanager
    def _hearing_logits(self, model: nn.Module, on_phase: OnPhase) -> Iterator[None]:
        """Within the block, `on_phase` hears LOGITS when a causal LM's decoder finishes."""
        decoder = self._decoder(model)
        hook = decoder.register_forward_hook(lambda *_: on_phase(Phase.LOGITS)) if decoder else None
        try:
            yield
        finally:
            if hook is not None:
                hook.remove()

    def _decoder(self, model: nn.Module) -> nn.Module | None:
        """A causal LM's decoder (transformers' `get_decoder()`): what follows it is the logits."""
        if self.task != models.CAUSAL_LM:
            return None
        get_base = getattr(model, "get_base_model", None)  # peft's wrapper
        base = get_base() if get_base is not None else model
        get_decoder = getattr(base, "get_decoder", None)
        decoder = get_decoder() if get_decoder is not None else None
        return decoder if isinstance(decoder, nn.Module) and decoder is not base else None

    def _optimizer_phase(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
    ) -> None:
        # Reads parameters, gradients and optimizer state only: nothing the batch size shapes.
        if self.settings.workload.max_grad_norm is not None:
            self._clip(model, optimizer, scaler, self.settings.workload.max_grad_norm)
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()

    def _autocast(self, device: torch.device | str) -> contextlib.AbstractContextManager[None]:
        return cuda_rules.autocast(self.settings.workload.precision, torch.device(device).type)

    def _clip(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
        max_norm: float,
    ) -> None:
        # HF Trainer and the AMP docs unscale before clipping, so the norm is of true gradients.
        if scaler is not None:
            scaler.unscale_(optimizer)
        params = [p for p in model.parameters() if p.grad is not None]
        # foreach=True: clip_grad_norm_'s own default on CUDA (torch/nn/utils/clip_grad.py picks
        # foreach when `_has_foreach_support`, which fake CPU tensors would not get).
        nn.utils.clip_grad_norm_(params, max_norm, foreach=True)

    def _forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> Any:
        if self.entry.source not in ("timm", "torchvision"):
            return model(**batch)
        # timm and torchvision classifiers take pixels and return logits; the loss is the
        # cross-entropy their training scripts compute.
        logits = model(batch["pixel_values"])
        labels = batch.get("labels")
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SimpleNamespace(logits=logits, loss=loss)

    def _loss(self, outputs: Any) -> torch.Tensor:
        if self.settings.workload.loss == "logits-mean":
            return outputs.logits.mean()
        return outputs.loss


@contextlib.contextmanager
def _tf32_matmuls(on: bool) -> Iterator[None]:
    """fp32 matmuls on TF32 tensor cores for this step, as the user's script would set it
    (torch.backends.cuda.matmul.allow_tf32, a process-wide flag, put back afterwards)."""
    if not on:
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def _tensors(value: Any) -> bool:
    """A tensor, or a tuple or list of them: what `nested_concat` concatenates."""
    if isinstance(value, (tuple, list)):
        return bool(value) and all(isinstance(v, torch.Tensor) for v in value)
    return isinstance(value, torch.Tensor)


def _concat(kept: Any, new: Any) -> Any:
    """transformers' `nested_concat` for equal shapes: `torch.cat` on the first dimension."""
    if isinstance(kept, (tuple, list)):
        return type(kept)(_concat(k, n) for k, n in zip(kept, new, strict=True))
    return torch.cat((torch.atleast_1d(kept), torch.atleast_1d(new)), dim=0)
