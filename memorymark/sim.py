"""The simulated backend: a real training step on fake tensors, with no GPU and no memory.

The model is built on the meta device (outside fake mode, so models that compute Python numbers
from tensors in `__init__` still build), then each parameter and buffer becomes a fake CPU tensor
of the same shape, dtype and strides, keeping tied weights tied. The step then runs under
`FakeTensorMode`: shapes and dtypes flow, nothing is allocated, and the tracker counts the bytes
every storage would take. Where CUDA kernels allocate differently from CPU ones, `cuda_rules`
decides; this module only wires fake tensors in.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from memorymark.backend import Backend
from memorymark.workload import Workload


def to_fake(module: nn.Module, fake_mode: FakeTensorMode) -> nn.Module:
    """Replace every parameter and buffer of `module` with a fake tensor, in place."""
    replaced: dict[int, torch.Tensor] = {}

    def fake_like(t: torch.Tensor) -> torch.Tensor:
        # One replacement per original tensor, so weights tied by identity stay tied.
        if id(t) not in replaced:
            with fake_mode:
                fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
            if isinstance(t, nn.Parameter):
                fake = nn.Parameter(fake, requires_grad=t.requires_grad)
            replaced[id(t)] = fake
        return replaced[id(t)]

    for sub in module.modules():
        for name, param in sub._parameters.items():
            if param is not None:
                sub._parameters[name] = fake_like(param)
        for name, buffer in sub._buffers.items():
            if buffer is not None:
                sub._buffers[name] = fake_like(buffer)
    return module


class SimBackend(Backend):
    """Simulates the step for a target GPU: the budget is that GPU's usable memory."""

    name = "sim"
    measured = False
    device = "cpu"

    def __init__(self, workload: Workload, *, capacity_bytes: int) -> None:
        super().__init__(workload, capacity_bytes=capacity_bytes, budget_bytes=capacity_bytes)
        self._fake_mode = FakeTensorMode()

    def _step_context(self) -> contextlib.AbstractContextManager[object]:
        return self._fake_mode

    def _build_model(self) -> nn.Module:
        with torch.device("meta"):
            model = self.workload.build_model()
        return to_fake(model, self._fake_mode)
