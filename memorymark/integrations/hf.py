"""A Hugging Face `transformers.Trainer`, sized as the user built it: `find_batch_size(trainer)`.

Turns a Trainer into a `memorymark.Training` that does what `Trainer.train()` does for one
optimizer step (`as_training`), sizes it with a Session, and writes the answer back into the
Trainer's arguments (`TrainerBatch.apply`). Everything is read from the Trainer: its model
(copied, never modified), its optimizer as `create_optimizer()` builds it, its loss through
`compute_loss` (a subclass's override included), its collator over its longest samples, and its
arguments' accumulation, clipping, mixed precision and activation checkpointing. Checked against
transformers 5.24 and accelerate 1.15 (`Trainer.training_step`, `Accelerator.prepare_model`).
Arguments built on a CPU-only machine for a GPU (`bf16=True`) are built under `target_gpu`
(`memorymark.target_gpu`, offered here too); `torch_compile=True` is refused, not modelled yet.

Must not know: how memory is counted or replayed, which batch sizes are tried, or how anything
is shown; nor does it train: the user's Trainer, model and arguments stay as they were until
`apply` is called.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, cast

import torch
import transformers
from accelerate.utils import convert_to_fp32
from torch import nn

from memorymark import Report, Session, Settings
from memorymark.backends.target import target_gpu
from memorymark.backends.target_gpu import target_of
from memorymark.integrations import hf_batches, hf_loop
from memorymark.step.user_job import Training, compile_refusal
from memorymark.step.user_step import compiled_part, copy_module

__all__ = ["TrainerBatch", "as_training", "find_batch_size", "target_gpu"]

SCAN_SAMPLES = 10_000
"""How many samples, from the start of the train dataset, are read to find the longest ones: a
bound, so a dataset of billions of rows (or a stream) is never read to its end."""


@dataclass(frozen=True, slots=True)
class TrainerBatch:
    """What `find_batch_size` found for a Trainer, and the arguments that train with it.

    `per_device_train_batch_size * gradient_accumulation_steps` is the arguments' own product
    (the global batch per device, a training hyperparameter the learning rate was tuned for):
    the per-device batch is the largest divisor of it that fits (`report.optimal`). When even
    the global batch fits in one step, accumulation is 1 and the per-device batch is the global
    batch, not the larger optimal one: raising the global batch is the user's call (it changes
    the training), and `report.optimal.batch_size` says how far it could go. Both are None when
    batch 1 does not fit.
    """

    report: Report
    per_device_train_batch_size: int | None
    gradient_accumulation_steps: int | None

    def apply(self, trainer: transformers.Trainer) -> None:
        """Sets the per-device batch and accumulation on `trainer.args` (and the batch size the
        Trainer cached from them when it was built), keeping the global batch."""
        if self.per_device_train_batch_size is None or self.gradient_accumulation_steps is None:
            raise ValueError(
                "nothing fits, not even batch 1: try activation_checkpointing=True, bf16=True, "
                "a smaller model or a larger gpu"
            )
        _check_trainer(trainer)
        # TrainingArguments is a mutable dataclass; transformers' own `set_dataloader` sets
        # these fields in place. `dataclasses.replace` would rerun __post_init__ and its checks.
        trainer.args.per_device_train_batch_size = self.per_device_train_batch_size
        trainer.args.gradient_accumulation_steps = self.gradient_accumulation_steps
        # Trainer.__init__ caches args.train_batch_size and train() reads that copy
        # (transformers 5.24, trainer.py: `self._train_batch_size = args.train_batch_size`).
        if hasattr(trainer, "_train_batch_size"):
            trainer._train_batch_size = trainer.args.train_batch_size


def find_batch_size(
    trainer: transformers.Trainer,
    gpu: str | None = "a10",
    *,
    scan_samples: int = SCAN_SAMPLES,
    **search_settings: Any,
) -> TrainerBatch:
    """The largest per-device batch that trains `trainer` on `gpu`, with the accumulation that
    keeps its global batch, simulated with no GPU (or measured on this machine's GPU with
    `backend="cuda"`).

    The batch is the Trainer's collator over the longest of the first `scan_samples` samples
    of its train dataset (dynamic padding pads each batch to its longest sample), so a dataset
    whose longest samples lie further on is sized short: raise `scan_samples` or sort it.
    `search_settings` are the Session's search and hardware settings (`max_batch`, `margin`,
    `gpu_memory_gib`, `strategy`...); the model, precision and step come from the Trainer.

    Example (a two-layer BERT, a few seconds on a laptop):

        >>> result = find_batch_size(trainer, gpu="a10", max_batch=256)
        >>> result.per_device_train_batch_size, result.gradient_accumulation_steps
        (32, 1)
        >>> result.apply(trainer)  # trainer.train() now runs with them
    """
    training = as_training(trainer, scan_samples=scan_samples)
    search_settings.setdefault("current_batch", trainer.args.per_device_train_batch_size)
    # TrainingArguments(torch_compile=True): Trainer compiles the whole model (`_wrap_model`),
    # as the simulation does for a user's step (memorymark/step/compiled.py).
    search_settings.setdefault("compile", bool(trainer.args.torch_compile))
    settings = Settings(gpu=gpu, **search_settings)
    report = Session(settings, training=training).analyze()
    per_device, accumulation = _plan(report, training, trainer, settings)
    return TrainerBatch(report, per_device, accumulation)


def as_training(
    trainer: transformers.Trainer,
    *,
    scan_samples: int = SCAN_SAMPLES,
    accumulation: int | None = None,
) -> Training:
    """The Trainer's optimizer step as a `memorymark.Training`, for a Session of one's own:
    `accumulation` micro-batches per step (the arguments' `gradient_accumulation_steps` by
    default), each of the batch size the Session tries."""
    _check_trainer(trainer)
    accumulation = accumulation or trainer.args.gradient_accumulation_steps
    return Training(
        model=lambda: _model_copy(trainer),
        batch=hf_batches.batches(trainer, scan_samples),
        step=hf_loop.step(trainer, accumulation),
        optimizer=lambda model: _optimizer(trainer, model),
        name=type(trainer.model).__name__,
        optimizer_takes="model",
        set_up_for=target_of(trainer.args),
    )


def _check_trainer(trainer: Any) -> None:
    """One-line errors for what cannot be sized, each with the way forward."""
    if not isinstance(trainer, transformers.Trainer):
        raise ValueError(
            f"find_batch_size takes a transformers.Trainer, got {type(trainer).__name__}; "
            "for your own loop, describe it with memorymark.Training"
        )
    compiled = compiled_part(trainer.model)
    if compiled is not None:
        raise compile_refusal(compiled, "give the Trainer the model before torch.compile")
    if trainer.train_dataset is None:
        raise ValueError(
            "the Trainer has no train_dataset: build it with Trainer(train_dataset=...), "
            "as its longest samples are the batch that is sized"
        )
    if not callable(trainer.data_collator):
        raise ValueError(
            "the Trainer has no data_collator: build it with Trainer(data_collator=...), "
            "e.g. DataCollatorWithPadding(tokenizer)"
        )


# -- the model: a copy, set up as Trainer.train() and Accelerator.prepare set up the original --
def _model_copy(trainer: transformers.Trainer) -> nn.Module:
    """The Trainer's model, copied on the current device, with its arguments' activation
    checkpointing and mixed precision."""
    model = copy_module(_model_of(trainer))
    args = trainer.args
    # `activation_checkpointing` is transformers 5's name; `gradient_checkpointing` the alias
    # older releases have alone.
    if getattr(args, "activation_checkpointing", None) or args.gradient_checkpointing:
        _enable_checkpointing(model, args)
    dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
    if dtype is not None:
        _autocast_forward(model, dtype)
    return model


def _model_of(trainer: transformers.Trainer) -> nn.Module:
    # A Trainer without a model (model_init) is refused before any copy is made.
    return cast(nn.Module, trainer.model)


def _enable_checkpointing(model: Any, args: transformers.TrainingArguments) -> None:
    """As Trainer.train() does (transformers 5.24): `every_n_layers` and `offload` are
    taken out of the kwargs, the rest go to torch's checkpoint; no kwargs means the model's
    default, `use_reentrant=False`."""
    given = getattr(args, "activation_checkpointing_kwargs", None)
    # (TrainingArguments parses a JSON string into a dict in __post_init__)
    kwargs: dict[str, Any] = dict(given or cast(dict, args.gradient_checkpointing_kwargs) or {})
    every_n_layers = kwargs.pop("every_n_layers", 1)
    offload = kwargs.pop("offload", False)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=kwargs or None,
            every_n_layers=every_n_layers,
            offload=offload,
        )
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)


def _autocast_forward(model: nn.Module, dtype: torch.dtype) -> None:
    """Runs the forward under autocast and hands its outputs back in float32, as accelerate's
    `prepare_model` does for `bf16`/`fp16`: a loss computed outside the forward (a
    `compute_loss` override) is computed on float32 copies, as in real training."""
    forward = model.forward

    def forward_in_autocast(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cuda", dtype=dtype):
            outputs = forward(*args, **kwargs)
        return convert_to_fp32(outputs)

    model.forward = forward_in_autocast


# -- the optimizer: the Trainer's own recipe, applied to the copy --------------------------------
def _optimizer(trainer: transformers.Trainer, model: nn.Module) -> Any:
    """The optimizer the Trainer would train `model` with: the one it was given (or already
    built), rebuilt over the copy's parameters; else `create_optimizer()`'s, a subclass's
    override included (the `optim` argument through `get_optimizer_cls_and_kwargs`, weight
    decay off for biases and norms by `get_decay_parameter_names`)."""
    if trainer.optimizer is not None:
        return _rebuild(trainer.optimizer, _model_of(trainer), model)
    # create_optimizer stores what it builds on `self`: a shallow copy of the Trainer takes
    # that store, so the user's Trainer keeps no optimizer over the copy's parameters.
    view = copy.copy(trainer)
    view.optimizer = None
    view.model = model
    # no argument: create_optimizer reads `self.model`, and overrides written for transformers 4
    # take none
    built = view.create_optimizer()
    return built if built is not None else view.optimizer


def _rebuild(optimizer: torch.optim.Optimizer, source: nn.Module, model: nn.Module) -> Any:
    """`optimizer` (over `source`'s parameters) again over `model`'s same-named parameters,
    with its class, defaults and groups."""
    names = {id(p): name for name, p in source.named_parameters()}
    params = dict(model.named_parameters())
    groups = []
    for group in optimizer.param_groups:
        if any(id(p) not in names for p in group["params"]):
            raise ValueError(
                "the Trainer's optimizer holds parameters that are not its model's: pass "
                "optimizer_cls_and_kwargs to the Trainer instead of a built optimizer"
            )
        options = {k: v for k, v in group.items() if k != "params"}
        groups.append({**options, "params": [params[names[id(p)]] for p in group["params"]]})
    # Defaults can hold what the constructor does not take (torch 2.13's AdamW keeps
    # `decoupled_weight_decay` there); the groups carry every option anyway.
    takes = inspect.signature(type(optimizer)).parameters
    anything = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in takes.values())
    defaults = {k: v for k, v in optimizer.defaults.items() if anything or k in takes}
    return type(optimizer)(groups, **defaults)


# -- the answer: per-device batch x accumulation for the arguments' global batch -----------------
def _plan(
    report: Report, training: Training, trainer: transformers.Trainer, settings: Settings
) -> tuple[int | None, int | None]:
    """The largest divisor of the global batch that fits, with the accumulation that keeps the
    global batch. The sweep ran with the arguments' accumulation. A plan that accumulates where
    they did not holds the gradients through a forward, so it is measured once more; one that
    does not where they did peaks lower than measured, a safe side to err on."""
    optimal = report.optimal
    if optimal is None:
        return None, None
    global_batch = (
        trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps
    )
    swept_accumulates = trainer.args.gradient_accumulation_steps > 1
    checked: Session | None = None
    for per_device in _divisors_down(global_batch, optimal.batch_size):
        accumulation = global_batch // per_device
        if accumulation == 1 or swept_accumulates:
            return per_device, accumulation
        if checked is None:
            accumulated = dataclasses.replace(training, step=hf_loop.step(trainer, accumulation))
            checked = Session(settings, training=accumulated)
        if checked.measure(per_device).fits:
            return per_device, accumulation
    return None, None


def _divisors_down(number: int, most: int) -> list[int]:
    """The divisors of `number` that are at most `most`, largest first."""
    return [d for d in range(min(number, most), 0, -1) if number % d == 0]
