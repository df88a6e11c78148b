"""Where the evidence run's steps run: the CUDA GPU, or a dry stand-in on CPU.

`Device` is what every chunk asks: the `torch.cuda`-like module (`cuda`), the GPU it is, the
backend that measures a step for real (`real`), the one that simulates it (`simulated`), the
CUDA runtime a ballast is taken with, and the environment stamp. `gpu_device()` is the machine's
CUDA GPU; `dry_device()` stands in for it on CPU: a fake `torch.cuda` module (`DryCuda`) whose
device is named "DRY RUN ..." (so every file name and row says it is no measurement), real CPU
kernels for the measured side where they can run the step, and the simulation where only CUDA
could (bitsandbytes' 4-bit and paged kernels, Liger's Triton kernels, torchao's Float8 matmuls,
Inductor's compiled step), each saying why.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from memorymark import gpus
from memorymark.backends.base import Backend
from memorymark.backends.device import DeviceBackend
from memorymark.backends.resolve import detect_cuda_gpu
from memorymark.calibration.run import as_run
from memorymark.engine import Session
from memorymark.environment import GpuEnvironment, gpu_environment
from memorymark.fit import FitPolicy
from memorymark.settings import Settings
from memorymark.step.catalog import CatalogStep

DRY_NAME = "DRY RUN simulated H100"
"""The dry device's name: file names start `dry-run-`, and no row can pass for a measurement."""
DRY_TOTAL_BYTES = 4 * 2**30
"""The dry device's memory: small, so the tiny models' boundaries are small batches on CPU."""


@dataclass
class Device:
    """The GPU an evidence run measures on (or its dry stand-in), and how to reach it."""

    cuda: Any
    """torch.cuda, or DryCuda."""
    dry: bool
    runtime: Any = None
    """The CUDA runtime a ballast is taken with; None: libcudart (calibration/ballast.py)."""
    notes: list[str] = field(default_factory=list)
    """Why a dry run's measured side is not what a GPU run's is, one line each."""

    @property
    def gpu(self) -> gpus.GPU:
        """The catalog view of this device."""
        return detect_cuda_gpu(self.cuda)

    def environment(self, emulated: str = "") -> GpuEnvironment:
        """The stamp every row carries."""
        return gpu_environment(self.cuda, emulated)

    def real(self, settings: Settings, gpu: gpus.GPU) -> Backend:
        """The backend that runs `settings`' step for real, judged against `gpu`'s capacity."""
        if not self.dry:
            return Session(settings.replace(backend="cuda"), gpu=gpu, cuda=self.cuda).open_backend()
        reason = cuda_only(settings)
        if reason:
            # The simulation of the device that "ran": its kernels at `gpu`'s capacity.
            self.notes.append(f"{settings.workload.model}: measured side simulated ({reason})")
            return self.simulated(settings, as_run(self.gpu, gpu.usable_bytes, gpu.name))
        return DeviceBackend(
            CatalogStep(settings),
            policy=FitPolicy(capacity_bytes=gpu.usable_bytes),
            name="cpu",
            device_module=self.cuda,
            peak_stats=True,
        )

    def simulated(self, settings: Settings, gpu: gpus.GPU) -> Backend:
        """The backend that simulates `settings`' step on `gpu`."""
        return Session(settings.replace(backend="sim"), gpu=gpu).open_backend()

    @property
    def torch_device(self) -> str:
        """Where a user's own step puts its tensors here."""
        return "cpu" if self.dry else "cuda"


def cuda_only(settings: Settings) -> str:
    """Why `settings`' step cannot run on CPU kernels (empty when it can)."""
    w = settings.workload
    if w.quantization != "none":
        return f"bitsandbytes' {w.quantization} kernels need CUDA"
    if w.optimizer.startswith("paged") or "8bit" in w.optimizer:
        return f"bitsandbytes' {w.optimizer} needs CUDA"
    if w.kernels == "liger":
        return "Liger's Triton kernels need CUDA"
    if w.float8 != "none":
        return "torchao's Float8 matmuls (torch._scaled_mm) need an sm_89 or newer GPU"
    if w.compile:
        # Inductor builds each graph with a C++ compiler on CPU: minutes, not a dry run's seconds.
        return "Inductor's CPU build of the compiled step is too slow for a dry run"
    return ""


def missing(module: str) -> str:
    """A line saying `module` is not importable here, or empty when it is."""
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed here"
    return ""


def gpu_device() -> Device:
    """This machine's CUDA GPU (torch.cuda)."""
    import torch

    return Device(cuda=torch.cuda, dry=False)


def dry_device() -> Device:
    """The dry stand-in: a DryCuda module and a DryRuntime for its ballast."""
    cuda = DryCuda()
    return Device(cuda=cuda, dry=True, runtime=DryRuntime(cuda))


class DryCuda:
    """The `torch.cuda` calls an evidence run makes, answered on CPU for a device named
    DRY_NAME: memory statistics stay at zero (nothing is measured), OOM counters too; the memory
    fraction and what a ballast holds lower what `mem_get_info` reports, as on a GPU."""

    def __init__(self, total_bytes: int = DRY_TOTAL_BYTES) -> None:
        self.total_bytes = total_bytes
        self.held_bytes = 0
        self.fractions: list[float] = []

    def is_available(self) -> bool:
        return True

    def get_device_properties(self, index: int) -> Any:
        return SimpleNamespace(name=DRY_NAME, total_memory=self.total_bytes, major=9, minor=0)

    def mem_get_info(self, device: int | None = None) -> tuple[int, int]:
        return self.total_bytes - self.held_bytes, self.total_bytes

    def set_per_process_memory_fraction(self, fraction: float, device: int | None = None) -> None:
        self.fractions.append(fraction)

    def memory_stats(self) -> dict[str, int]:
        return {
            "allocated_bytes.all.peak": 0,
            "reserved_bytes.all.peak": 0,
            "num_alloc_retries": 0,
            "num_ooms": 0,
        }

    def max_memory_allocated(self) -> int:
        return 0

    def max_memory_reserved(self) -> int:
        return 0

    def reset_peak_memory_stats(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def empty_cache(self) -> None:
        pass


class DryRuntime:
    """`ballast.Runtime` on a DryCuda: cudaMalloc takes from its free bytes, cudaFree gives back."""

    def __init__(self, cuda: DryCuda) -> None:
        self.cuda = cuda
        self.sizes: dict[int, int] = {}
        self.taken: list[int] = []
        """Every size asked for, in order (what a test reads)."""

    def mem_get_info(self) -> tuple[int, int]:
        return self.cuda.mem_get_info()

    def malloc(self, nbytes: int) -> int:
        if nbytes > self.cuda.mem_get_info()[0]:
            raise MemoryError(f"cudaMalloc({nbytes}) failed with cudaError 2")
        pointer = len(self.taken) + 1
        self.sizes[pointer] = nbytes
        self.taken.append(nbytes)
        self.cuda.held_bytes += nbytes
        return pointer

    def free(self, pointer: int) -> None:
        self.cuda.held_bytes -= self.sizes.pop(pointer)
