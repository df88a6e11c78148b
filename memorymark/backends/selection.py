"""Which backend `auto` means and which GPU a `Settings` answers for, given this machine's GPUs.

The decision alone, with no torch: the engine (memorymark/backends/resolve.py) hands it the GPUs
torch sees, asked only as the decision needs them, and the app's server the ones a worker
reported (memorymark/service/questions.py), so both resolve a `Settings` to the same `GPU`
record from one place. Must not know torch, devices, which batch sizes are tried or how anything
is shown.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from memorymark import gpus
from memorymark.distributed import topology
from memorymark.fit import FitPolicy
from memorymark.settings import Settings


class Accelerators(Protocol):
    """This machine's GPUs as PyTorch sees them (None where there is none)."""

    @property
    def cuda_gpu(self) -> gpus.GPU | None:
        """CUDA device 0, with the total memory PyTorch reports for it."""
        ...

    @property
    def mps_gpu(self) -> gpus.GPU | None:
        """The Apple GPU, with the memory PyTorch recommends as its most."""
        ...


@dataclass(frozen=True, slots=True)
class LocalGPUs:
    """`Accelerators` as plain values: what a worker reports to a process that has no torch."""

    cuda_gpu: gpus.GPU | None = None
    mps_gpu: gpus.GPU | None = None


def backend_name(settings: Settings, here: Accelerators) -> str:
    """The backend `auto` means here: the local GPU when it is the one asked about, else sim."""
    if settings.hardware.backend != "auto":
        return settings.hardware.backend
    asks_other_gpu = (
        settings.hardware.gpu is not None or settings.hardware.gpu_memory_gib is not None
    )
    local = here.cuda_gpu
    if local is not None:
        if not asks_other_gpu:
            return "cuda"
        if (
            settings.hardware.gpu is not None
            and gpus.find_gpu(settings.hardware.gpu).name == local.name
        ):
            return "cuda"
        return "sim"
    if not asks_other_gpu and here.mps_gpu is not None:
        return "mps"
    return "sim"


def run_gpu(settings: Settings, backend: str, here: Accelerators) -> gpus.GPU:
    """The GPU whose memory the run is measured (a real device: that device) or simulated
    against (the custom size, else the named GPU, else this machine's, else the default)."""
    if backend == "cuda":
        if here.cuda_gpu is None:
            raise ValueError(
                "backend cuda asked for, but PyTorch sees no CUDA GPU; use --backend sim"
            )
        return here.cuda_gpu
    if backend == "mps":
        if here.mps_gpu is None:
            raise ValueError(
                "backend mps asked for, but PyTorch sees no Apple GPU; use --backend sim"
            )
        return here.mps_gpu
    if settings.hardware.gpu_memory_gib is not None:
        return gpus.custom_gpu(settings.hardware.gpu_memory_gib)
    if settings.hardware.gpu is not None:
        return gpus.find_gpu(settings.hardware.gpu)
    if here.cuda_gpu is not None:
        return here.cuda_gpu
    return gpus.find_gpu(gpus.DEFAULT_SIMULATED_GPU)


def rank_gpu(settings: Settings, gpu: gpus.GPU) -> gpus.GPU:
    """`gpu` as one rank of the settings' distributed run sees it: less NCCL's buffers, which
    live outside the caching allocator (memorymark/distributed/topology.py); itself on one GPU."""
    count = settings.hardware.gpu_count
    nccl = 0
    hw = settings.hardware
    groups = (hw.tp > 1) + (hw.cp > 1)
    if (hw.dist != "none" or groups) and count is not None:
        nccl = topology.nccl_bytes(hw.dist, count, hw.node_count, groups)
    if nccl >= gpu.total_bytes - gpu.context_bytes:
        raise ValueError(f"the {gpu.name} has no memory left once NCCL's buffers are taken")
    return gpu if nccl == gpu.nccl_bytes else replace(gpu, nccl_bytes=nccl)


def fit_policy(settings: Settings, gpu: gpus.GPU) -> FitPolicy:
    """The fit policy of a run of `settings` on `gpu` (a whole GPU, ranked here): what every
    verdict of such a run is judged against."""
    return FitPolicy.on(settings, rank_gpu(settings, gpu))


def decide(
    settings: Settings, here: Accelerators, gpu: gpus.GPU | None = None
) -> tuple[str, gpus.GPU]:
    """The backend `auto` means here, and the GPU every figure answers for as one rank sees
    it: the settings' (`run_gpu`), or `gpu` when the caller judges against another (calibrate's
    emulated GPU, a compared catalog GPU)."""
    name = backend_name(settings, here)
    return name, rank_gpu(settings, gpu or run_gpu(settings, name, here))


def answering_gpu(settings: Settings, here: Accelerators) -> gpus.GPU:
    """The GPU every figure of a `Session(settings)` answers for, as one rank sees it."""
    return decide(settings, here)[1]
