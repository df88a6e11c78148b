"""Which backend runs a measurement, on which GPU's numbers, judged by which fit policy.

The only module that asks torch which accelerator this machine has (through `torch.cuda`, which
tests replace with a fake module); what the answer means for a `Settings` is decided, without
torch, in memorymark/backends/selection.py. Must not know which batch sizes are tried, what a
report says, or how anything is shown.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from memorymark import gpus
from memorymark.accounting import throughput
from memorymark.backends import depth_worker, selection
from memorymark.backends.base import Backend
from memorymark.backends.device import CpuBackend, DeviceBackend
from memorymark.backends.sim import SimBackend
from memorymark.cuda_rules import versions
from memorymark.fit import FitPolicy
from memorymark.settings import Settings
from memorymark.step.catalog import CatalogStep
from memorymark.step.protocol import TrainingStep
from memorymark.step.user_job import Training
from memorymark.step.user_step import UserStep
from memorymark.units import GIB

_PP_SIMULATED = (
    "--pp runs simulated (--backend sim) or under torchrun on CPU (--backend cpu), not on a GPU yet"
)


def _cuda(cuda: ModuleType | None) -> Any:
    """The CUDA device module: `torch.cuda`, unless a test hands in a fake."""
    return torch.cuda if cuda is None else cuda


def cuda_available(cuda: ModuleType | None = None) -> bool:
    """True when a CUDA GPU can run the step here."""
    return bool(_cuda(cuda).is_available())


def mps_available() -> bool:
    """True on an Apple GPU that PyTorch can use."""
    return bool(torch.backends.mps.is_available())


def detect_cuda_gpu(cuda: ModuleType | None = None) -> gpus.GPU:
    """The catalog view of CUDA device 0, with the total memory PyTorch reports for it."""
    props = _cuda(cuda).get_device_properties(0)
    return gpus.detected_gpu(props.name, int(props.total_memory), (props.major, props.minor))


def resolve_backend_name(settings: Settings, cuda: ModuleType | None = None) -> str:
    """The backend `auto` means here: the local GPU when it is the one asked about, else sim."""
    return selection.backend_name(settings, _TorchGPUs(cuda))


def resolve_gpu(settings: Settings, backend_name: str, cuda: ModuleType | None = None) -> gpus.GPU:
    """The GPU whose memory the run is measured or simulated against."""
    return selection.run_gpu(settings, backend_name, _TorchGPUs(cuda))


def local_gpu(cuda: ModuleType | None = None) -> gpus.GPU | None:
    """The CUDA GPU in this machine, or None (the app offers it as the "measured" choice)."""
    return detect_cuda_gpu(cuda) if cuda_available(cuda) else None


def apple_gpu() -> gpus.GPU | None:
    """The Apple GPU in this machine, with the memory PyTorch recommends as its most, or None."""
    if not mps_available():
        return None
    total = int(torch.mps.recommended_max_memory())
    return gpus.custom_gpu(total / GIB, name="Apple GPU (MPS)")


class _TorchGPUs:
    """`selection.Accelerators` asked of torch, each only when the decision reads it: a
    simulation of a named GPU never initialises CUDA."""

    def __init__(self, cuda: ModuleType | None) -> None:
        self._cuda = cuda

    @functools.cached_property
    def cuda_gpu(self) -> gpus.GPU | None:
        return local_gpu(self._cuda)

    @functools.cached_property
    def mps_gpu(self) -> gpus.GPU | None:
        return apple_gpu()


@dataclass(frozen=True, slots=True)
class Resolution:
    """What one `Settings` means on this machine, decided once: the backend that runs its step,
    the GPU every figure answers for (as one rank of a many-GPU run sees it), and the fit policy
    every verdict is judged by. `open_backend` builds backends from it and decides nothing."""

    settings: Settings
    backend_name: str
    """cuda, mps, sim or cpu."""
    gpu: gpus.GPU
    policy: FitPolicy
    cuda: ModuleType | None = None
    """The CUDA device module real runs go through (`torch.cuda` unless a test passes a fake)."""
    training: Training | None = None
    """The user's own training code, when it is what runs (else the step the settings say)."""

    def open_backend(self, settings: Settings | None = None) -> Backend:
        """A fresh backend for `settings` (these by default: a variant such as the accumulation
        check's keeps this GPU and policy) on this resolution's GPU and policy."""
        s = settings or self.settings
        step = training_step(s, self.training)
        if self.backend_name in ("sim", "cpu"):
            return simulated_backend(s, self.gpu, self.policy, self.backend_name, step)
        return device_backend(s, self.policy, self.backend_name, self.cuda, step)


def training_step(settings: Settings, training: Training | None = None) -> TrainingStep:
    """The step that runs: the user's `training`, or the catalog's step for `settings`."""
    return CatalogStep(settings) if training is None else UserStep(training, settings)


def resolve(
    settings: Settings,
    cuda: ModuleType | None = None,
    gpu: gpus.GPU | None = None,
    training: Training | None = None,
) -> Resolution:
    """Resolve `settings` once: the backend `auto` means here, the GPU (the one they name or
    this machine's; `gpu` judges against another, such as calibrate's emulated GPU) as one
    rank sees it, and the fit policy on it. `training` is the user's code, when it runs."""
    name, ranked = selection.decide(settings, _TorchGPUs(cuda), gpu)
    if name == "sim" and training is None and settings.search.depth == "replay":
        depth_worker.warm(settings)
    return Resolution(settings, name, ranked, FitPolicy.on(settings, ranked), cuda, training)


def simulated_backend(
    settings: Settings,
    gpu: gpus.GPU,
    policy: FitPolicy,
    name: str = "sim",
    step: TrainingStep | None = None,
) -> Backend:
    """A `sim` (fake tensors) or `cpu` (real CPU kernels) backend answering for `gpu` (as one
    rank sees it), judged by `policy`, running `step` (the catalog's for `settings` unless
    given)."""
    step = step or CatalogStep(settings)
    workspace = gpus.thread_workspace(gpu.compute_capability, versions.release())
    backend: Backend
    spread = settings.hardware.dist != "none" or settings.hardware.tp * settings.hardware.cp > 1
    if name == "cpu" and settings.hardware.pp > 1:
        backend = _ranked_pipeline(settings, policy, workspace)
    elif name == "cpu" and spread:
        ranked = _ranked(CpuBackend, settings, "cpu")
        backend = ranked(step, policy=policy, thread_workspace=workspace)
    elif name == "sim" and settings.hardware.pp > 1:
        return _pipeline_backend(settings, gpu, policy, workspace)
    elif name == "sim" and spread:
        from memorymark.backends.dist_sim import DistSimBackend  # torch.distributed loads only here

        backend = DistSimBackend(step, gpu=gpu, policy=policy, thread_workspace=workspace)
    elif name == "sim":  # kernels chosen as on this GPU's compute capability
        backend = SimBackend(step, gpu=gpu, policy=policy, thread_workspace=workspace)
    else:
        backend = CpuBackend(step, policy=policy, thread_workspace=workspace)
    # The step's time is estimated for the GPU simulated, not this machine's CPU.
    backend.roofline = throughput.Roofline.for_gpu(gpu, tf32=settings.workload.tf32)
    if isinstance(backend, SimBackend) and settings.search.depth == "replay":
        backend.replay_depth()
    return backend


def _pipeline_backend(
    settings: Settings, gpu: gpus.GPU, policy: FitPolicy, workspace: tuple[int, ...]
) -> Backend:
    """The pipeline's distinct ranks, each simulated on its own fake process group."""
    from memorymark.backends import pipeline_sim  # torch.distributed loads only here
    from memorymark.step.pipeline import PipelineStep

    def open_stage(step: PipelineStep) -> pipeline_sim.StageSimBackend:
        stage = pipeline_sim.StageSimBackend(
            step, gpu=gpu, policy=policy, thread_workspace=workspace
        )
        stage.roofline = throughput.Roofline.for_gpu(gpu, tf32=settings.workload.tf32)
        if settings.search.depth == "replay":
            stage.replay_depth()
        return stage

    return pipeline_sim.PipelineSimBackend(settings, open_stage)


def _ranked_pipeline(settings: Settings, policy: FitPolicy, workspace: tuple[int, ...]) -> Backend:
    """This process's pipeline rank of a torchrun job on CPU (gloo): real kernels, tracked."""
    from memorymark.backends import pipeline_sim, torchrun
    from memorymark.step.pipeline import PipelineStep

    pipeline_sim.check(settings)
    _ranked(CpuBackend, settings, "cpu")  # refuses outside torchrun; joins the process group
    step = PipelineStep(settings, torchrun.pipeline_rank(settings))
    kind = torchrun.ranked_pipeline(CpuBackend)
    return kind(step, policy=policy, thread_workspace=workspace)


def _ranked(kind: type[Backend], settings: Settings, device: str) -> Any:
    """`kind` as one rank of a torchrun job: real many-GPU runs need one process per rank."""
    from memorymark.backends import torchrun

    if device == "mps" or not torchrun.under_torchrun():
        raise ValueError(
            f"measuring {settings.hardware.gpus} GPUs for real takes one process per GPU: torchrun "
            f"--nproc-per-node {settings.hardware.gpus} -m memorymark analyze ... (cuda or cpu); "
            "or --backend sim to simulate them"
        )
    torchrun.check_world(settings)
    torchrun.ensure_process_group(device)
    return torchrun.ranked(kind)


def device_backend(
    settings: Settings,
    policy: FitPolicy,
    name: str,
    cuda: ModuleType | None = None,
    step: TrainingStep | None = None,
) -> DeviceBackend:
    """A real-device backend (`cuda`, through the `cuda` module, or `mps`) judged by `policy`:
    the detected GPU's, or that of the one a capped process emulates (calibrate); it runs
    `step` (the catalog's for `settings` unless given)."""
    if settings.hardware.pp > 1:
        raise ValueError(_PP_SIMULATED)
    module = _cuda(cuda) if name == "cuda" else torch.mps
    kind = (
        DeviceBackend
        if settings.hardware.dist == "none"
        else _ranked(DeviceBackend, settings, name)
    )
    return kind(
        step or CatalogStep(settings),
        policy=policy,
        name=name,
        device_module=module,
        # torch.mps keeps no peak statistics: there the tracker's live bytes are the peak.
        peak_stats=name == "cuda",
    )
