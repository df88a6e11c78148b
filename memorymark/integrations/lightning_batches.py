"""The batch a LightningModule trains on, at any batch size, read as Lightning reads it.

Where the batch size lives (`batch_arg_name` on the module, its `hparams`, the datamodule or
its `hparams`: the places Lightning's `lightning_setattr` writes), whose `train_dataloader()`
and batch hooks run, and `batches(...)`: the loader's first batch at `SAMPLE_ROWS`, grown row
by row to any size. Imported through `memorymark.integrations.lightning`, which says how to
install Lightning when it is missing.

Must not know: how the step runs, how memory is counted, or which batch sizes are tried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden

SAMPLE_ROWS = (2, 3)
"""The batch sizes the loader is read at, once each: what grows from one to the other is a row."""


def holders(module: pl.LightningModule, datamodule: Any, name: str) -> list[Any]:
    """The objects or hparams dicts holding `name`, in the order Lightning's
    `_lightning_get_all_attr_holders` finds them (utilities/parsing.py): the module, its
    hparams, the datamodule, its hparams. Lightning's helpers see the datamodule only through
    an attached Trainer; this one also takes it as an argument."""
    found = []
    for owner in (module, datamodule):
        if owner is None:
            continue
        if hasattr(owner, name):
            found.append(owner)
        if hasattr(owner, "hparams") and name in owner.hparams:
            found.append(owner.hparams)
    if not found:
        raise ValueError(
            f"no {name!r} on {type(module).__name__}, its hparams or a datamodule: set "
            f"self.{name} in __init__ and build train_dataloader() from it, or pass "
            "batch_arg_name= the attribute that holds the batch size"
        )
    return found


def read(holder: Any, name: str) -> Any:
    """`name` from one holder (an object, or an hparams dict)."""
    return holder[name] if isinstance(holder, dict) else getattr(holder, name)


def write(holder: Any, name: str, value: Any) -> None:
    """Set `name` on one holder (an object, or an hparams dict)."""
    if isinstance(holder, dict):
        holder[name] = value
    else:
        setattr(holder, name, value)


def loader_owner(module: pl.LightningModule, datamodule: Any) -> Any:
    """What `train_dataloader()` is called on: the datamodule when it has one, as Trainer.fit
    prefers it, else the module."""
    if datamodule is not None and is_overridden("train_dataloader", datamodule):
        return datamodule
    if is_overridden("train_dataloader", module):
        return module
    raise ValueError(
        f"{type(module).__name__} has no train_dataloader() and no datamodule with one was "
        "given: define it, or pass datamodule="
    )


def hook_owner(module: Any, datamodule: Any, hook: str) -> Any:
    """Whose batch hook runs: the datamodule's when it overrides it, else the module's
    (trainer/connectors/data_connector.py `_DataHookSelector`)."""
    if datamodule is not None and is_overridden(hook, datamodule):
        return datamodule
    return module


def batches(
    module: pl.LightningModule, datamodule: Any, name: str, cast: torch.dtype | None = None
) -> Callable[[int], Any]:
    """`batch(n)`: the loader's first batch read at each of `SAMPLE_ROWS` (the batch size set
    to it, then set back), every part that grew between the two (a tensor's first dimension,
    a list's items) repeated to n rows, floats cast to `cast`. Reading a few rows once keeps a
    sweep to batch 65536 from loading 65536 real samples per probe; the rows repeat, and no
    memory figure depends on their values. A collator that pads each batch to its longest
    sample pads to the first samples' longest."""
    small, large = (_first_batch(module, datamodule, name, rows) for rows in SAMPLE_ROWS)
    if not _has_rows(small, large):
        raise ValueError(
            f"train_dataloader() of {type(loader_owner(module, datamodule)).__name__} gives "
            f"the same batch whatever {name!r} is: build its DataLoader with "
            f"batch_size=self.{name} (or pass batch_arg_name=)"
        )

    def batch(batch_size: int) -> Any:
        return grow(small, large, batch_size, cast)

    return batch


def _first_batch(module: pl.LightningModule, datamodule: Any, name: str, rows: int) -> Any:
    """The loader's first batch with `name` set to `rows`, and `on_before_batch_transfer`
    (which runs on the host, before the batch reaches the GPU)."""
    found = holders(module, datamodule, name)
    before = [read(holder, name) for holder in found]
    for holder in found:
        write(holder, name, rows)
    try:
        batch = next(iter(loader_owner(module, datamodule).train_dataloader()))
    finally:
        for holder, value in zip(found, before, strict=True):
            write(holder, name, value)
    return hook_owner(module, datamodule, "on_before_batch_transfer").on_before_batch_transfer(
        batch, 0
    )


def _row_count(value: Any) -> int | None:
    if isinstance(value, torch.Tensor):
        return value.shape[0] if value.dim() > 0 else None
    if isinstance(value, (list, tuple)):
        return len(value)
    return None


def _is_rows(small: Any, large: Any) -> bool:
    return (_row_count(small), _row_count(large)) == SAMPLE_ROWS


def _has_rows(small: Any, large: Any) -> bool:
    if _is_rows(small, large):
        return True
    if isinstance(large, Mapping) and isinstance(small, Mapping):
        return any(_has_rows(small[key], large[key]) for key in large if key in small)
    if isinstance(large, (list, tuple)) and isinstance(small, (list, tuple)):
        return any(_has_rows(s, item) for s, item in zip(small, large, strict=False))
    return False


def grow(small: Any, large: Any, rows: int, cast: torch.dtype | None = None) -> Any:
    """`large` (read at `SAMPLE_ROWS[1]`) with each part that has more rows than in `small`
    (read at `SAMPLE_ROWS[0]`) at `rows` rows, its floats cast to `cast`."""
    if isinstance(large, torch.Tensor):
        if _is_rows(small, large):
            # An index, not expand(): a stride-0 view would hold one row's bytes, not n.
            index = torch.arange(rows, device=large.device) % large.shape[0]
            large = large.index_select(0, index)
        return large.to(cast) if cast is not None and large.is_floating_point() else large
    if isinstance(large, Mapping) and isinstance(small, Mapping):
        grown = {key: grow(small.get(key), item, rows, cast) for key, item in large.items()}
        return _rebuild(large, grown)
    if isinstance(large, (list, tuple)) and isinstance(small, (list, tuple)):
        if _is_rows(small, large):
            items = [large[i % len(large)] for i in range(rows)]
        else:
            items = [grow(s, item, rows, cast) for s, item in zip(small, large, strict=False)]
        return _rebuild(large, items)
    return large


def _rebuild(like: Any, items: Any) -> Any:
    """`items` in the container type of `like` (a namedtuple, a dict subclass), else plain."""
    kind = type(like)
    if hasattr(like, "_fields"):
        return kind(*items)
    try:
        return kind(items)
    except TypeError:  # a container whose constructor takes other arguments
        return dict(items) if isinstance(like, Mapping) else list(items)
