"""A Lightning `LightningModule`, sized as the user wrote it: `find_batch_size(module)` and the
`MemoryMarkBatchSizeFinder` callback.

Turns a LightningModule into a `memorymark.Training` that runs one step as Lightning's fit loop
runs it (`as_training`), sizes it with a Session, and writes the answer where Lightning's own
`BatchSizeFinder` writes it (`batch_arg_name` on the module, its `hparams`, or the datamodule).
Everything is read from the module: the model (a copy, never modified), `configure_optimizers()`
as Lightning parses it, `training_step` and the batch hooks (`lightning_loop.py`), and the batch
from `train_dataloader()` (`lightning_batches.py`). Known limitations: the batch is grown from
the loader's first few rows, so a collator that pads each batch to its longest sample is sized
at the first samples' length; `accumulate_grad_batches` is not read, as it changes no peak
(Lightning holds a step's gradients through the next forward either way).

Must not know: how memory is counted or replayed, which batch sizes are tried, or how anything
is shown; nor does it train: the module keeps its weights, only `batch_arg_name` changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as exc:  # Lightning is an optional extra (pyproject's `lightning`)
    raise ImportError(
        "memorymark.integrations.lightning needs Lightning: pip install lightning "
        "(or pip install 'memorymark[lightning]')"
    ) from exc

from lightning.pytorch.utilities.model_helpers import is_overridden

from memorymark import Report, Session, Settings
from memorymark.integrations import lightning_batches, lightning_loop
from memorymark.integrations.lightning_loop import StepContext
from memorymark.step.user_job import Training, compile_refusal
from memorymark.step.user_step import compiled_part, copy_module


@dataclass(frozen=True, slots=True)
class LightningBatch:
    """What `find_batch_size` found: the batch size it set (`report.optimal`), or None when
    not even batch 1 fits (the attribute is left as it was; `report.fixes` lists what would)."""

    report: Report
    batch_size: int | None


def find_batch_size(
    module: pl.LightningModule,
    datamodule: pl.LightningDataModule | None = None,
    gpu: str | None = "a10",
    batch_arg_name: str = "batch_size",
    *,
    precision: str | int = "32-true",
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: str = "norm",
    **search_settings: Any,
) -> LightningBatch:
    """The largest batch that trains `module` on `gpu`, simulated with no GPU (or measured on
    this machine's GPU with `backend="cuda"`), set on `batch_arg_name` where Lightning's
    `BatchSizeFinder` sets it. The datamodule and the module get `prepare_data()` and
    `setup("fit")` first, as from `trainer.fit`. `precision` and the clipping are the
    Trainer's arguments of the same names; `search_settings` are the Session's search and
    hardware settings (`max_batch`, `margin`, `gpu_memory_gib`, `strategy`...), and the
    current value of `batch_arg_name` is the report's current batch.

    Example (a small conv net, a second or two on a laptop):

        >>> result = find_batch_size(module, gpu="a10", max_batch=4096)
        >>> module.batch_size == result.report.optimal.batch_size
        True
    """
    _check_module(module)
    # As trainer.fit does before reading a loader (trainer.py `_run`: the data connector's
    # prepare_data, then `_call_setup_hook`); the module's copy gets `configure_model()`.
    owners = [owner for owner in (datamodule, module) if owner is not None]
    for owner in owners:
        owner.prepare_data()
    for owner in owners:
        owner.setup("fit")
    training = as_training(
        module,
        datamodule,
        batch_arg_name,
        precision=precision,
        gradient_clip_val=gradient_clip_val,
        gradient_clip_algorithm=gradient_clip_algorithm,
    )
    return _size(module, datamodule, batch_arg_name, training, gpu, search_settings)


def as_training(
    module: pl.LightningModule,
    datamodule: pl.LightningDataModule | None = None,
    batch_arg_name: str = "batch_size",
    *,
    precision: str | int = "32-true",
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: str | None = "norm",
    trainer: pl.Trainer | None = None,
) -> Training:
    """The module's training step as a `memorymark.Training`, for a Session of one's own. The
    loader is read here, before any sizing (read under the simulation, it would hand back fake
    samples). `trainer`, when there is one, answers the `self.trainer.*` reads the stand-in
    does not (`estimated_stepping_batches`, `max_epochs`)."""
    _check_module(module)
    if datamodule is None:
        datamodule = _trainer_datamodule(module)
    dtype, autocast = StepContext.precision(precision)
    context = StepContext(
        trainer=trainer,
        datamodule=datamodule,
        dtype=dtype,
        autocast=autocast,
        gradient_clip_val=gradient_clip_val,
        gradient_clip_algorithm=gradient_clip_algorithm or "norm",
    )
    cast = None if autocast else dtype  # true half precision casts the batch's floats too
    step = lightning_loop.automatic_step
    if not module.automatic_optimization:
        step = lightning_loop.manual_step
    return Training(
        model=lambda: lightning_loop.attach(copy_module(module), context),
        batch=lightning_batches.batches(module, datamodule, batch_arg_name, cast),
        step=lambda copy, batch, optimizers: step(copy, batch, optimizers, context),
        optimizer=lightning_loop.configure_optimizers,
        name=type(module).__name__,
        optimizer_takes="model",
        # trainer.fit empties the cache after setting up, checkpoint or not
        # (lightning/pytorch/trainer/trainer.py `_run` -> `_CheckpointConnector.resume_end`).
        flush_before_first_step=True,
    )


class MemoryMarkBatchSizeFinder(pl.Callback):
    """Lightning's `BatchSizeFinder`, answered by MemoryMark: at fit start, sizes the module's
    step for `gpu` (simulated: no trial steps on the device) and sets `batch_arg_name` before
    the first batch is loaded. The Trainer's precision and clipping are read; `search_settings`
    are the Session's search and hardware settings.

    Example:

        >>> finder = MemoryMarkBatchSizeFinder(gpu="a100-80gb", max_batch=4096)
        >>> lightning.Trainer(callbacks=[finder]).fit(module, datamodule)
        >>> finder.optimal_batch_size, finder.report.optimal.peak_bytes
    """

    def __init__(
        self, gpu: str | None = "a10", batch_arg_name: str = "batch_size", **search_settings: Any
    ) -> None:
        self.gpu = gpu
        self.batch_arg_name = batch_arg_name
        self.search_settings = search_settings
        self.optimal_batch_size: int | None = None
        """The batch size set (the name Lightning's BatchSizeFinder gives it)."""
        self.report: Report | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Fails before fitting starts, as Lightning's BatchSizeFinder does, for what it
        cannot size: several devices, loaders handed to `fit()`, no batch size to set, a
        compiled module."""
        _check_module(pl_module)
        if isinstance(trainer.strategy, pl.strategies.ParallelStrategy):
            raise ValueError(
                "MemoryMarkBatchSizeFinder sizes one device's step; with "
                f"{type(trainer.strategy).__name__}, call find_batch_size(module) before fit"
            )
        source = getattr(trainer.fit_loop, "_data_source", None)  # what BatchSizeFinder reads
        if stage == "fit" and source is not None and not source.is_module():
            raise ValueError(
                "MemoryMarkBatchSizeFinder cannot resize dataloaders passed to fit(): build them "
                "in the module's or a datamodule's train_dataloader() from the batch size"
            )
        lightning_batches.holders(pl_module, _datamodule(trainer), self.batch_arg_name)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Sizes the step and sets the batch size, then has the fit loop load its data anew."""
        training = as_training(
            pl_module,
            _datamodule(trainer),
            self.batch_arg_name,
            precision=trainer.precision,
            gradient_clip_val=trainer.gradient_clip_val,
            gradient_clip_algorithm=trainer.gradient_clip_algorithm,
            trainer=trainer,
        )
        result = _size(
            pl_module,
            _datamodule(trainer),
            self.batch_arg_name,
            training,
            self.gpu,
            dict(self.search_settings),
        )
        self.report, self.optimal_batch_size = result.report, result.batch_size
        # As Lightning's own finder does (tuner/batch_size_scaling.py `_reset_dataloaders`):
        # a loader built before now (`estimated_stepping_batches` builds one) has the old size.
        if getattr(trainer.fit_loop, "_combined_loader", None) is not None:
            trainer.fit_loop._combined_loader = None


def _size(
    module: pl.LightningModule,
    datamodule: Any,
    name: str,
    training: Training,
    gpu: str | None,
    search_settings: dict[str, Any],
) -> LightningBatch:
    """Sizes `training` and sets the answer on every holder of `name`, as Lightning's
    `lightning_setattr` does; the value Lightning reads (the last holder's) is the current
    batch."""
    if datamodule is None:
        datamodule = _trainer_datamodule(module)
    holders = lightning_batches.holders(module, datamodule, name)
    search_settings.setdefault("current_batch", lightning_batches.read(holders[-1], name))
    report = Session(Settings(gpu=gpu, **search_settings), training=training).analyze()
    if report.optimal is None:
        return LightningBatch(report, None)
    for holder in holders:
        lightning_batches.write(holder, name, report.optimal.batch_size)
    return LightningBatch(report, report.optimal.batch_size)


def _check_module(module: Any) -> None:
    """One-line errors for what cannot be sized, each with the way forward."""
    compiled = compiled_part(module)
    if compiled is not None:
        raise compile_refusal(
            compiled.replace("the model", "the module"),
            "size the module before torch.compile, and compile it for training after",
        )
    if not isinstance(module, pl.LightningModule):
        raise ValueError(
            f"find_batch_size takes a lightning.pytorch.LightningModule, got "
            f"{type(module).__name__}; for a plain nn.Module, describe the step with "
            "memorymark.Training"
        )
    if not is_overridden("training_step", module):
        raise ValueError(
            f"{type(module).__name__} has no training_step(batch, batch_idx): define it, as "
            "Trainer.fit needs it too"
        )


def _trainer_datamodule(module: pl.LightningModule) -> Any:
    trainer = module._trainer  # the attribute: the `trainer` property raises when detached
    return None if trainer is None else _datamodule(trainer)


def _datamodule(trainer: pl.Trainer) -> Any:
    # Set by fit() (its data connector), not declared on the Trainer class.
    return getattr(trainer, "datamodule", None)
