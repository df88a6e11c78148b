"""Building the optimizer a setting names, the way a training script on CUDA would.

adamw and sgd (momentum 0.9) take PyTorch's CUDA default implementation (foreach, from
`cuda_rules`); the -forloop variants ask for the per-tensor loop; adamw-fused asks for the fused
kernel, which on real hardware needs CUDA (or a recent CPU build); adafactor is transformers'
Adafactor with its default relative-step schedule, keeping factored second moments (a row and a
column vector per matrix) instead of AdamW's two full buffers. adamw-8bit, paged-adamw-8bit,
paged-adamw-32bit and lion-8bit are bitsandbytes' own optimizers (bitsandbytes/optim/optimizer.py):
8-bit state, one byte per value with an fp32 absmax per 256, only for tensors of at least
`min_8bit_size` = 4096 values, 32-bit below; the paged ones put each state buffer of at least
1e5 values in CUDA unified memory (`get_state_buffer`), which bitsandbytes cannot do on a CPU
tensor: there the buffer is created inside `tracker.unified_memory()`, so it is counted as the
GPU would count it, outside the allocator (memorymark/step/paging.py says what that means for a
fit).
This module knows nothing about measurement, except those accommodations.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

from memorymark import cuda_rules
from memorymark.accounting.tracker import unified_memory
from memorymark.settings.choices import OPTIMIZERS
from memorymark.step import quantization

PAGED_MIN_NUMEL = 100_000
"""bitsandbytes optim/optimizer.py `get_state_buffer`: `if not self.is_paged or p.numel() < 1e5`
the buffer is an ordinary one; above, `F.get_paged` (cudaMallocManaged)."""

# Settings name -> (bitsandbytes class name, constructor kwargs). HF Trainer builds the same:
# transformers/trainer.py `get_optimizer_cls_and_kwargs` maps adamw_bnb_8bit / paged_adamw_8bit /
# paged_adamw_32bit / lion_8bit to bnb.optim.AdamW / Lion with optim_bits and is_paged.
_BNB_OPTIMIZERS = {
    "adamw-8bit": ("AdamW", {"optim_bits": 8, "is_paged": False}),
    "paged-adamw-8bit": ("AdamW", {"optim_bits": 8, "is_paged": True}),
    "paged-adamw-32bit": ("AdamW", {"optim_bits": 32, "is_paged": True}),
    "lion-8bit": ("Lion", {"optim_bits": 8, "is_paged": False}),
}


def _bnb_optimizer(name: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    bnb_optim = quantization.bitsandbytes_module().optim
    class_name, kwargs = _BNB_OPTIMIZERS[name]
    base: Any = getattr(bnb_optim, class_name)  # a class bitsandbytes names

    class _OnAnyDevice(base):
        def get_state_buffer(self, p: torch.Tensor, dtype: torch.dtype = torch.float32):
            if p.device.type != "cpu":
                return super().get_state_buffer(p, dtype=dtype)
            if not self.is_paged or p.numel() < PAGED_MIN_NUMEL:
                return torch.zeros_like(p, dtype=dtype, device=p.device)
            with unified_memory():  # what F.get_paged would allocate on the GPU
                return torch.zeros_like(p, dtype=dtype, device=p.device)

        def init_state(self, group: dict, p: torch.Tensor, gindex: int, pindex: int) -> None:
            super().init_state(group, p, gindex, pindex)
            if not is_fake(p):
                return
            # The 256-value quantization maps are built from real values, once per device
            # (`fill_qmap`); a fake step needs fake ones, shared as bitsandbytes shares them.
            fakes = self.__dict__.setdefault("_fake_qmaps", {})
            state = self.state[p]
            for key in ("qmap1", "qmap2"):
                if key in state and not is_fake(state[key]):
                    real = state[key]
                    if id(real) not in fakes:
                        fakes[id(real)] = torch.empty(real.shape, dtype=real.dtype)
                    state[key] = fakes[id(real)]

    return _OnAnyDevice(params, lr=1e-4, **kwargs)


def _adafactor_class() -> type[Any]:  # transformers' Adafactor, with its own arguments
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
    if name in _BNB_OPTIMIZERS:
        return _bnb_optimizer(name, params)
    kwargs = cuda_rules.optimizer_kwargs(name)
    if name.startswith("adamw"):
        return torch.optim.AdamW(params, lr=1e-4, **kwargs)
    if name.startswith("sgd"):
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **kwargs)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)} (got {name!r})")
