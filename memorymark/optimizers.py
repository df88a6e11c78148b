"""Building the optimizer a setting names, the way a training script on CUDA would.

adamw and sgd (momentum 0.9) take PyTorch's CUDA default implementation (foreach, from
`cuda_rules`); the -forloop variants ask for the per-tensor loop; adamw-fused asks for the fused
kernel, which on real hardware needs CUDA (or a recent CPU build); adafactor is transformers'
Adafactor with its default relative-step schedule, keeping factored second moments (a row and a
column vector per matrix) instead of AdamW's two full buffers. This module knows nothing about
measurement, except one accommodation noted below.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch._subclasses.fake_tensor import is_fake

from memorymark import cuda_rules
from memorymark.settings import OPTIMIZERS


def _adafactor_class() -> type[torch.optim.Optimizer]:
    from transformers.optimization import Adafactor

    class _Adafactor(Adafactor):
        @staticmethod
        def _get_lr(param_group: dict, param_state: dict) -> float:
            # Adafactor compares a float with the parameter RMS tensor (`max(eps, rms)`), which
            # needs the tensor's value. A fake tensor has none, and the learning rate moves no
            # memory, so a simulated step uses RMS = 1; a real step keeps Adafactor's own rule.
            if is_fake(param_state.get("RMS")):
                param_state = {**param_state, "RMS": 1.0}
            return Adafactor._get_lr(param_group, param_state)

    return _Adafactor


def build_optimizer(
    name: str, params: Iterable[torch.nn.Parameter]
) -> torch.optim.Optimizer | None:
    """The optimizer for `name` over `params`; None for `none`."""
    params = list(params)
    if name == "none":
        return None
    if name == "adafactor":
        return _adafactor_class()(
            params, lr=None, relative_step=True, scale_parameter=True, warmup_init=False
        )
    kwargs = cuda_rules.optimizer_kwargs(name)
    if name.startswith("adamw"):
        return torch.optim.AdamW(params, lr=1e-4, **kwargs)
    if name.startswith("sgd"):
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **kwargs)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)} (got {name!r})")
