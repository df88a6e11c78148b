"""One step of Lightning's fit loop, run on a copy of a LightningModule without a Trainer.

The copy is set up as Trainer.fit sets a module up (`configure_model()`, true half precision)
and attached to a stand-in for the Trainer the way Lightning's Fabric attaches a module
(`module.fabric`, `module._fabric_optimizers`): a path Lightning supports, so the module's
`self.optimizers()`, `self.manual_backward()`, `self.clip_gradients()`, `self.lr_schedulers()`
and `self.toggle_optimizer()` work unchanged, while `self.log()` does nothing. The step is
Lightning's automatic optimization with its hooks (loops/optimization/automatic.py), or the
module's own `training_step` under manual optimization. Checked against Lightning 2.6.

Must not know: where the batch comes from, how memory is counted, or which batch sizes are
tried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import lightning.pytorch as pl
import torch
from lightning.pytorch.core.optimizer import (
    _configure_optimizers,
    _configure_schedulers_automatic_opt,
    _configure_schedulers_manual_opt,
)
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from torch import nn

from memorymark.integrations.lightning_batches import hook_owner

LIGHTNING_PRECISIONS: dict[str, tuple[torch.dtype | None, bool]] = {
    "32-true": (None, False),
    "16-mixed": (torch.float16, True),
    "bf16-mixed": (torch.bfloat16, True),
    "16-true": (torch.float16, False),
    "bf16-true": (torch.bfloat16, False),
}
"""Trainer(precision=...) as (dtype, autocast): mixed autocasts `training_step`, true casts the
model and the batch's floats (lightning/pytorch/plugins/precision/amp.py and half.py).
Lightning's GradScaler for 16-mixed is left out: a scale and an in-place unscale."""
_PRECISION_ALIASES = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}
"""The older spellings Lightning still takes (lightning/fabric/connector.py)."""


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a Trainer adds around the module's step."""

    trainer: Any
    """The real Trainer (in the callback): it answers the module's other `self.trainer.*`."""
    datamodule: Any
    dtype: torch.dtype | None
    autocast: bool
    """True: `training_step` runs under autocast to `dtype`; False: the model is in `dtype`."""
    gradient_clip_val: float | None
    gradient_clip_algorithm: str

    @staticmethod
    def precision(precision: str | int | None) -> tuple[torch.dtype | None, bool]:
        """`(dtype, autocast)` for a Trainer's `precision` argument."""
        key = str(precision if precision is not None else "32-true")
        key = _PRECISION_ALIASES.get(key, key)
        if key not in LIGHTNING_PRECISIONS:
            known = ", ".join(LIGHTNING_PRECISIONS)
            raise ValueError(f"precision {precision!r} cannot be sized here; use one of {known}")
        return LIGHTNING_PRECISIONS[key]


_DETACHED = {
    "global_step": 0,
    "current_epoch": 0,
    "world_size": 1,
    "num_devices": 1,
    "global_rank": 0,
    "local_rank": 0,
    # Any count: it sets a schedule's length (OneCycleLR's total_steps), no tensor's size.
    "estimated_stepping_batches": 1_000_000,
}
"""What a module reads most from `self.trainer` (in `configure_optimizers`, say), answered as
at the start of a fit on one device when there is no Trainer to ask."""


class TrainerStandIn:
    """What a LightningModule reaches through `self.fabric` and `self.trainer` while it is
    sized without a Trainer (core/module.py takes the Fabric path when `module.fabric` is
    set). Any other `self.trainer.*` is the real Trainer's in the callback, else an
    AttributeError naming it."""

    def __init__(self, context: StepContext) -> None:
        self.context = context
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list[Any] = []
        self.logger = None
        self.loggers: list[Any] = []
        self.is_global_zero = True
        self.progress_bar_callback = None
        if context.trainer is None:
            self.__dict__.update(_DETACHED, datamodule=context.datamodule)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """`self.manual_backward(loss)` and the default `backward` hook."""
        loss.backward(*args, **kwargs)

    def clip_gradients(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        clip_val: float | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> None:
        """`self.clip_gradients(...)` and the default `configure_gradient_clipping`: by value
        or by norm, as Fabric clips; neither when the clip value is None."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if clip_val is not None:
            nn.utils.clip_grad_value_(params, clip_val)
        elif max_norm is not None:
            # error_if_nonfinite reads the norm's value, which a simulation does not have.
            nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite=False)

    def __getattr__(self, name: str) -> Any:
        context = self.__dict__.get("context")
        if context is None or context.trainer is None or name.startswith("_"):
            raise AttributeError(
                f"self.trainer.{name} is not available while MemoryMark sizes the step without "
                "a Trainer: use MemoryMarkBatchSizeFinder in trainer.fit, or skip it while "
                "sizing with `if not memorymark.simulating(): ...`"
            )
        return getattr(context.trainer, name)


def _no_log(*args: Any, **kwargs: Any) -> None:
    """`self.log()` and `self.log_dict()` while sizing: nothing is logged."""


def attach(copy: Any, context: StepContext) -> nn.Module:
    """The copy, set up as Trainer.fit sets a module up, attached to a stand-in Trainer."""
    if is_overridden("configure_model", copy):
        copy.configure_model()  # Lightning calls it on every fit: it must be idempotent
    if context.dtype is not None and not context.autocast:
        copy.to(context.dtype)
    stand_in = TrainerStandIn(context)
    copy.fabric = stand_in  # the setter keeps a weak proxy, so the copy holds it too:
    copy._memorymark_trainer = stand_in
    for part in copy.modules():
        if isinstance(part, pl.LightningModule):
            part.log = part.log_dict = _no_log  # type: ignore[method-assign]  # (logging a torchmetrics Metric needs a Trainer)
    return copy


def configure_optimizers(copy: pl.LightningModule) -> list[torch.optim.Optimizer]:
    """The copy's `configure_optimizers()`, in any shape Lightning takes, parsed by Lightning
    (core/optimizer.py); the optimizers and schedulers go to the stand-in, where
    `self.optimizers()` and `self.lr_schedulers()` read them."""
    configured = copy.configure_optimizers()
    if configured is None:
        raise ValueError(
            f"{type(copy).__name__}.configure_optimizers() returned None: a step without an "
            "optimizer is not what training runs; return the optimizer"
        )
    # Lightning's parser is typed narrower than the shapes configure_optimizers may return.
    optimizers, schedulers, monitor = _configure_optimizers(cast(Any, configured))
    if copy.automatic_optimization and len(optimizers) > 1:
        raise ValueError(
            f"{type(copy).__name__} has {len(optimizers)} optimizers with automatic "
            "optimization, which Lightning refuses: set self.automatic_optimization = False"
        )
    stand_in: Any = copy._memorymark_trainer
    stand_in.optimizers = list(optimizers)
    stand_in.lr_scheduler_configs = (
        _configure_schedulers_automatic_opt(schedulers, monitor)
        if copy.automatic_optimization
        else _configure_schedulers_manual_opt(schedulers)
    )
    copy._fabric_optimizers = list(optimizers)
    return list(optimizers)


class _ClosureFirst:
    """The optimizer `optimizer_step` is handed: as Lightning's precision plugins do,
    `step(closure)` runs the closure (forward, backward, clipping), then steps without it, so
    the optimizer's step hooks see its update alone."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        result = closure() if closure is not None else None
        self.optimizer.step(**kwargs)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def _training_step(copy: pl.LightningModule, batch: Any, context: StepContext) -> Any:
    """`training_step` on the batch after `on_after_batch_transfer` (which runs on the GPU:
    augmentations there count), under autocast for mixed precision."""
    owner = hook_owner(copy, context.datamodule, "on_after_batch_transfer")
    batch = owner.on_after_batch_transfer(batch, 0)
    takes_index = is_param_in_hook_signature(copy.training_step, "batch_idx", min_args=2)
    args = (batch, 0) if takes_index else (batch,)
    if not context.autocast:
        return copy.training_step(*args)
    # "cuda", as on the GPU: the simulation runs it with CUDA's autocast rules.
    with torch.autocast("cuda", dtype=context.dtype):
        return copy.training_step(*args)


def _loss(output: Any, module: nn.Module) -> torch.Tensor | None:
    """The loss in what `training_step` returned: a tensor, a dict's "loss", or None (no
    backward), as `ClosureResult.from_training_step_output` reads it."""
    if output is None or isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and "loss" in output:
        return output["loss"]
    raise ValueError(
        f"{type(module).__name__}.training_step returned {type(output).__name__}; with "
        'automatic optimization it returns the loss, a dict with "loss", or None'
    )


def automatic_step(
    copy: pl.LightningModule, batch: Any, optimizers: Sequence[Any], context: StepContext
) -> None:
    """One step of Lightning's automatic optimization, hooks included: `optimizer_step` with a
    closure that runs `training_step`, zero_grad, backward, `on_before_optimizer_step` and
    `configure_gradient_clipping` (loops/optimization/automatic.py `Closure`)."""
    (optimizer,) = optimizers
    # Lightning zeroes gradients after the next step's forward, so last step's gradients are
    # held through this forward: every trained parameter has one, as after a step.
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)

    def closure() -> torch.Tensor | None:
        loss = _loss(_training_step(copy, batch, context), copy)
        copy.on_before_zero_grad(optimizer)
        copy.optimizer_zero_grad(0, 0, optimizer)
        if loss is not None:
            copy.on_before_backward(loss)
            copy.backward(loss)
            copy.on_after_backward()
        copy.on_before_optimizer_step(optimizer)
        copy.configure_gradient_clipping(
            optimizer,
            gradient_clip_val=context.gradient_clip_val,
            gradient_clip_algorithm=context.gradient_clip_algorithm,
        )
        return loss

    copy.optimizer_step(0, 0, cast(Any, _ClosureFirst(optimizer)), closure)


def manual_step(
    copy: pl.LightningModule, batch: Any, optimizers: Sequence[Any], context: StepContext
) -> None:
    """One step of manual optimization: `training_step` steps its optimizers itself."""
    _training_step(copy, batch, context)
