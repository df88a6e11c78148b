"""Which backend runs a measurement, and on which GPU's numbers; the real-device backends.

The only module that asks torch which accelerator this machine has. The CUDA and MPS backends
are thin: they reach the device through its torch module (`torch.cuda`, `torch.mps`), which tests
replace with a fake one, so all their logic outside the kernels runs in the CPU test suite.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from memorymark import gpus, throughput
from memorymark.backend import Backend
from memorymark.settings import Settings
from memorymark.sim import SimBackend
from memorymark.workload import Workload


class DeviceBackend(Backend):
    """A real accelerator: the step runs for real and the device reports its own peak."""

    measured = True

    def __init__(
        self,
        workload: Workload,
        *,
        capacity_bytes: int,
        name: str,
        device_module: Any,
        peak_stats: bool,
        timed_steps: int = 3,
    ) -> None:
        super().__init__(workload, capacity_bytes=capacity_bytes)
        self.name = self.device = name
        self._module = device_module
        # torch.cuda keeps peak statistics; torch.mps does not, so there the tracker's peak
        # (live tensor bytes on the device) is the measurement.
        self._peak_stats = peak_stats
        self.timed_steps = timed_steps
        """Steps timed (after one warm-up) for the median step time of a probe that fit."""

    def _reset_device_peak(self) -> None:
        if self._peak_stats:
            self._module.reset_peak_memory_stats()

    def _device_peak(self) -> tuple[int, int | None] | None:
        if not self._peak_stats:
            return None
        return self._module.max_memory_allocated(), self._module.max_memory_reserved()

    def _synchronize(self) -> None:
        self._module.synchronize()

    def _time_steps(self, batch_size: int) -> float:
        # Untracked steps: the tracker's Python work per operator would slow the timed ones.
        def step() -> None:
            self.workload.run_step(self._model, self._optimizer, batch_size, self.device)

        self._timing = True
        try:
            return throughput.time_step(step, self._synchronize, steps=self.timed_steps)
        finally:
            self._timing = False

    def _empty_cache(self) -> None:
        self._module.empty_cache()


class CpuBackend(Backend):
    """Real CPU kernels under the same tracker as `sim`: checks the simulation on small models."""

    name = "cpu"
    measured = False
    device = "cpu"

    def __init__(self, workload: Workload, *, capacity_bytes: int) -> None:
        super().__init__(workload, capacity_bytes=capacity_bytes, budget_bytes=capacity_bytes)


def cuda_available(cuda: ModuleType = torch.cuda) -> bool:
    """True when a CUDA GPU can run the step here."""
    return bool(cuda.is_available())


def mps_available() -> bool:
    """True on an Apple GPU that PyTorch can use."""
    return bool(torch.backends.mps.is_available())


def detect_cuda_gpu(cuda: ModuleType = torch.cuda) -> gpus.GPU:
    """The catalog view of CUDA device 0, with the total memory PyTorch reports for it."""
    props = cuda.get_device_properties(0)
    return gpus.detected_gpu(props.name, int(props.total_memory), (props.major, props.minor))


def resolve_backend_name(settings: Settings, cuda: ModuleType = torch.cuda) -> str:
    """The backend `auto` means here: the local GPU when it is the one asked about, else sim."""
    if settings.backend != "auto":
        return settings.backend
    asks_other_gpu = settings.gpu is not None or settings.gpu_memory_gib is not None
    if cuda_available(cuda):
        if not asks_other_gpu:
            return "cuda"
        local = detect_cuda_gpu(cuda)
        if settings.gpu is not None and gpus.find_gpu(settings.gpu).name == local.name:
            return "cuda"
        return "sim"
    if mps_available() and not asks_other_gpu:
        return "mps"
    return "sim"


def resolve_gpu(settings: Settings, backend_name: str, cuda: ModuleType = torch.cuda) -> gpus.GPU:
    """The GPU whose memory the run is measured or simulated against."""
    if backend_name == "cuda":
        if not cuda_available(cuda):
            raise ValueError(
                "backend cuda asked for, but PyTorch sees no CUDA GPU; use --backend sim"
            )
        return detect_cuda_gpu(cuda)
    if backend_name == "mps":
        if not mps_available():
            raise ValueError(
                "backend mps asked for, but PyTorch sees no Apple GPU; use --backend sim"
            )
        total = int(torch.mps.recommended_max_memory())
        return gpus.custom_gpu(total / gpus.GIB, name="Apple GPU (MPS)")
    if settings.gpu_memory_gib is not None:
        return gpus.custom_gpu(settings.gpu_memory_gib)
    if settings.gpu is not None:
        return gpus.find_gpu(settings.gpu)
    if cuda_available(cuda):
        return detect_cuda_gpu(cuda)
    return gpus.find_gpu(DEFAULT_SIMULATED_GPU)


def local_gpu(cuda: ModuleType = torch.cuda) -> gpus.GPU | None:
    """The CUDA GPU in this machine, or None (the app offers it as the "measured" choice)."""
    return detect_cuda_gpu(cuda) if cuda_available(cuda) else None


# The GPU simulated when none is named and none is present: the most common cloud fine-tuning GPU.
DEFAULT_SIMULATED_GPU = "A10"


def capacity_bytes(settings: Settings, gpu: gpus.GPU) -> int:
    """Usable memory less the margin: the limit the search (and the simulated OOM) work to, so
    the recommended batch never sits on the edge of an out-of-memory error."""
    return gpu.usable_bytes - settings.margin_bytes(gpu.usable_bytes)


def simulated_backend(settings: Settings, gpu: gpus.GPU, name: str = "sim") -> Backend:
    """A `sim` (fake tensors) or `cpu` (real CPU kernels) backend answering for `gpu`."""
    workload = Workload(settings)
    capacity = capacity_bytes(settings, gpu)
    if name == "sim":  # kernels chosen as on this GPU's compute capability
        backend: Backend = SimBackend(workload, capacity_bytes=capacity, gpu=gpu)
    else:
        backend = CpuBackend(workload, capacity_bytes=capacity)
    # The step's time is estimated for the GPU simulated, not this machine's CPU.
    backend.roofline = throughput.Roofline.for_gpu(gpu)
    return backend


def open_backend(settings: Settings, cuda: ModuleType = torch.cuda) -> tuple[Backend, gpus.GPU]:
    """The backend for `settings` and the GPU it answers for."""
    name = resolve_backend_name(settings, cuda)
    gpu = resolve_gpu(settings, name, cuda)
    if name in ("sim", "cpu"):
        return simulated_backend(settings, gpu, name), gpu
    workload = Workload(settings)
    capacity = capacity_bytes(settings, gpu)
    if name == "cuda":
        backend = DeviceBackend(
            workload, capacity_bytes=capacity, name="cuda", device_module=cuda, peak_stats=True
        )
        return backend, gpu
    mps = DeviceBackend(
        workload, capacity_bytes=capacity, name="mps", device_module=torch.mps, peak_stats=False
    )
    return mps, gpu
