"""The transformer blocks of a built model: the units FSDP2 wraps one by one and tensor
parallelism splits. Knows nothing about how they are spread."""

from __future__ import annotations

from torch import nn


def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks FSDP2 wraps one by one: the classes a transformers model lists in
    `_no_split_modules` (what Accelerate's transformer auto-wrap policy reads); none for other
    models, which are then sharded as one unit at the root."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names and m is not model]
