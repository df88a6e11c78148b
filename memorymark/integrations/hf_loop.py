"""One optimizer step of an HF Trainer, as `Trainer.train()` runs it, for a `memorymark.Training`.

Each micro-batch goes through the Trainer's own `compute_loss` (a subclass's override is what
runs), the loss scaled for accumulation by `training_step`'s rule, then clipping, the optimizer
step and the gradients freed. Checked against transformers 5.24. Must not know how memory is
counted, which batch sizes are tried, or where the batch comes from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
import transformers
from torch import nn


def step(trainer: transformers.Trainer, accumulation: int) -> Callable[[Any, Any, Any], None]:
    """One optimizer step as `Trainer.train()` runs it: each micro-batch through
    `trainer.compute_loss`, the loss divided by the accumulation unless already scaled for it,
    backward (through a GradScaler for fp16), clipping at `max_grad_norm`, the optimizer step,
    and the gradients freed. Two micro-batches stand for any accumulation: from the second on,
    each runs with the gradients already held, so the peak repeats."""
    args = trainer.args
    micro_batches = min(accumulation, 2)
    # Only a flush at every step repeats in every step replayed; a flush every k > 1 steps
    # (and at the first) is not modelled: the figures are for the steps in between.
    flushes_every_step = args.torch_empty_cache_steps == 1

    def one_step(model: nn.Module, batch: Any, optimizer: Any) -> None:
        model.train()
        if callable(getattr(optimizer, "train", None)):
            optimizer.train()  # schedule-free optimizers, as training_step does
        scaler = torch.amp.GradScaler("cuda") if args.fp16 else None
        items = _items_in_batch(trainer, batch, accumulation)
        for _ in range(micro_batches):
            inputs = dict(batch) if isinstance(batch, Mapping) else batch
            # Without return_outputs, compute_loss returns the loss alone.
            loss = cast(torch.Tensor, trainer.compute_loss(model, inputs, num_items_in_batch=items))
            if flushes_every_step:
                # Trainer.training_step empties the cache after the loss, before backward,
                # every `torch_empty_cache_steps` steps (`clear_device_cache`).
                torch.cuda.empty_cache()
            if not _loss_scaled_for_accumulation(trainer, items):
                loss = loss / accumulation
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if args.max_grad_norm is not None and args.max_grad_norm > 0:
            if scaler is not None:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        model.zero_grad(set_to_none=True)

    return one_step


def _items_in_batch(trainer: transformers.Trainer, batch: Any, accumulation: int) -> Any:
    """The label count Trainer passes to compute_loss when the model or `compute_loss_func`
    takes it (`Trainer._get_num_items_in_batch`), over every micro-batch; else None."""
    takes_it = getattr(trainer, "model_accepts_loss_kwargs", False) or (
        getattr(trainer, "compute_loss_func", None) is not None
    )
    if not takes_it or not isinstance(batch, Mapping) or "labels" not in batch:
        return None
    labels = batch["labels"]
    return labels.ne(-100).sum() * accumulation if isinstance(labels, torch.Tensor) else None


def _loss_scaled_for_accumulation(trainer: transformers.Trainer, items: Any) -> bool:
    """Whether compute_loss already scaled the loss for accumulation (training_step's test)."""
    declared = getattr(trainer, "loss_is_scaled_for_ga", None)
    if declared is not None:
        return bool(declared)
    accepts = getattr(trainer, "model_accepts_loss_kwargs", False)
    return (
        bool(accepts and items is not None)
        or getattr(trainer, "compute_loss_func", None) is not None
    )
