"""The batch an HF Trainer's run is sized at: its collator over its longest samples.

Dynamic padding pads each batch to its longest sample, so the batch that decides the run's peak
is made of the longest ones: `batches(trainer)` finds them within a bounded scan and collates N
of them, as the Trainer's own loader would (with its unused-column removal). Must not know how
memory is counted, which batch sizes are tried, or how the step runs.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import transformers


def batches(trainer: transformers.Trainer, scan_samples: int) -> Callable[[int], Any]:
    """batch(N): the Trainer's collator (with its unused-column removal) over the N longest of
    the first `scan_samples` samples, repeated when there are fewer than N."""
    view = copy.copy(trainer)  # the column removal caches the model's signature on `self`
    dataset, collate = trainer.train_dataset, trainer.data_collator
    if hasattr(dataset, "column_names") and hasattr(view, "_remove_unused_columns"):
        dataset = view._remove_unused_columns(dataset, description="training")
    elif hasattr(view, "_get_collator_with_removed_columns"):
        collate = view._get_collator_with_removed_columns(collate, description="training")
    samples = sorted(_first(dataset, scan_samples), key=_length, reverse=True)
    if not samples:
        raise ValueError("the Trainer's train_dataset is empty: give it the samples it trains on")

    def batch(batch_size: int) -> Any:
        collated = collate([samples[i % len(samples)] for i in range(batch_size)])
        # a plain dict: collators return BatchEncoding (a UserDict), and compute_loss may pop
        # from what it is given
        return dict(collated) if isinstance(collated, Mapping) else collated

    return batch


def _first(dataset: Any, count: int) -> list[Any]:
    """The first `count` samples: by index when the dataset has a length, else as a stream."""
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
        return list(itertools.islice(iter(dataset), count))
    return [dataset[i] for i in range(min(len(dataset), count))]


def _length(value: Any) -> int:
    """Elements of a sample's sequences (token ids, masks, labels, pixels); text and numbers
    count none, as the collator pads what the model takes."""
    if isinstance(value, Mapping):
        return sum(_length(v) for v in value.values())
    if isinstance(value, torch.Tensor):
        return value.numel()
    if hasattr(value, "shape") and isinstance(getattr(value, "size", None), int):
        return int(value.size)  # a numpy array
    if isinstance(value, (list, tuple)):
        return sum(max(_length(v), 1) for v in value) if _nested(value) else len(value)
    return 0


def _nested(value: Iterable[Any]) -> bool:
    return any(isinstance(v, (list, tuple, Mapping, torch.Tensor)) for v in value)
