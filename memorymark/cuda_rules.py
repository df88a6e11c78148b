"""The rules by which a training step on CUDA differs from the same step on CPU, in one place.

The simulation runs on CPU fake tensors, and the CPU backend runs real CPU kernels; both must
allocate what CUDA would. Each rule here names the PyTorch behaviour it copies. The workload asks
this module which implementation to pick; it never asks which device it is on.
"""

from __future__ import annotations

from typing import Any


def optimizer_kwargs(name: str) -> dict[str, Any]:
    """Constructor arguments that make an optimizer run as it does by default on CUDA.

    torch/optim/optimizer.py `_default_to_fused_or_foreach` picks `foreach=True` when every
    parameter is a CUDA tensor (and for-loop on CPU). The foreach kernels allocate temporaries as
    large as all parameters of a dtype group, so the choice moves the optimizer-step peak by a
    whole model's worth of bytes. Fused stays opt-in on CUDA, as in PyTorch.
    """
    if name in ("adamw", "sgd"):
        return {"foreach": True}
    if name == "adamw-fused":
        return {"fused": True}
    raise ValueError(f"no CUDA rule for optimizer {name!r}")
