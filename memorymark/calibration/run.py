"""Calibration: the simulation checked against a real CUDA GPU, row by row.

`calibrate` runs each settings combination at several batch sizes for real on this machine's
GPU, a few consecutive steps each (memorymark/calibration/loop.py), and replays the same steps
in the simulation of the same GPU; it yields one `CalibrationRow` per batch: the loop's measured
peaks and allocator counters, step by step, beside the prediction, stamped with the environment.
With `emulate`, the process is capped at a catalog GPU's capacity (the simulation runs this
GPU's kernels at that capacity: `as_run`) and the simulation's boundary for the catalog GPU is
checked: its largest running batch must run here, one search step more must not.
This module composes the engine (backends, the sweep, the fit policy); it measures nothing
itself, and reaches the GPU only through the `torch.cuda`-like module it is handed.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

import torch

from memorymark import gpus, models
from memorymark.accounting import allocator
from memorymark.backends.base import Backend
from memorymark.backends.resolve import cuda_available, detect_cuda_gpu
from memorymark.calibration import ballast
from memorymark.calibration.loop import LOOP_STEPS, Loop, run_loop, simulated_loop
from memorymark.calibration.record import (
    BOUNDARY_MAX,
    BOUNDARY_PAST_MAX,
    BOUNDARY_RECOMMENDED,
    CalibrationRow,
)
from memorymark.engine import Session
from memorymark.environment import GpuEnvironment, gpu_environment
from memorymark.settings import Search, Settings
from memorymark.settings.choices import PROTOCOLS

DEFAULT_BATCH_SIZES = (4, 8, 16)
CAP_FRACTION = "fraction"
"""Capped with `torch.cuda.set_per_process_memory_fraction`: PyTorch's allocator alone."""
CAP_BALLAST = "ballast"
"""Capped by holding the rest of the card with raw `cudaMalloc` (memorymark/calibration/
ballast.py): `cudaMemGetInfo` and every library that reads it see the smaller card."""
CAPS = (CAP_FRACTION, CAP_BALLAST)

BackendFactory = Callable[[Settings, gpus.GPU], Backend]
"""Settings and the GPU whose capacity judges the verdicts -> a backend."""
BoundaryPredictor = Callable[[Settings, gpus.GPU], tuple[int, ...]]
"""Settings and a catalog GPU -> (largest batch the simulation says runs, search step[, the
batch it recommends])."""
RECOMMENDED_MARGIN = Search().margin
"""The margin a recommendation keeps: the CLI's and the app's default."""


class NoGpuError(RuntimeError):
    """Calibration compares against a real GPU, and there is none."""


def settings_grid(
    model_names: Iterable[str],
    *,
    precisions: Iterable[str] = ("32-true",),
    optimizers: Iterable[str] = ("adamw",),
    grad_checkpointing: Iterable[bool] = (False,),
    protocols: Iterable[str] = PROTOCOLS,
    **common: Any,
) -> tuple[Settings, ...]:
    """Every combination, each once (inference-style ignores the optimizer: it has none), with
    no margin: calibration asks whether a step runs, not what to recommend. `common` holds the
    other `Settings` fields (seq_len, image_size, lora_rank, step)."""
    grid: list[Settings] = []
    combos = itertools.product(model_names, precisions, optimizers, grad_checkpointing, protocols)
    for model, precision, optimizer, checkpointing, protocol in combos:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)} (got {protocol!r})")
        settings = Settings(
            model=model,
            precision=precision,
            optimizer=optimizer,
            grad_checkpointing=checkpointing,
            margin="0%",
            **common,
        )
        if protocol == "inference-style":
            settings = settings.with_protocol(protocol)
        if settings not in grid:
            grid.append(settings)
    return tuple(grid)


def calibrate(
    grid: Iterable[Settings],
    batch_sizes: Iterable[int] = DEFAULT_BATCH_SIZES,
    *,
    emulate: gpus.GPU | None = None,
    steps: int = LOOP_STEPS,
    cuda: Any = torch.cuda,
    real: BackendFactory | None = None,
    simulated: BackendFactory | None = None,
    boundary: BoundaryPredictor | None = None,
    nvml: Any = None,
    on_skip: Callable[[Settings, str], None] | None = None,
    cap: str = CAP_FRACTION,
    runtime: ballast.Runtime | None = None,
    boundary_rows: bool = True,
    start: allocator.LoopStart = allocator.TRAINING_LOOP,
) -> Iterator[CalibrationRow]:
    """Yield one row per settings combination and batch size as each pair of loops lands
    (`steps` consecutive steps measured, the same steps replayed), then, with `emulate`, the
    boundary rows of each combination.

    `cuda` is torch.cuda (a fake in tests); `real` builds the measured backend for a
    combination and the GPU whose capacity judges it (this one, or `emulate`), `simulated` the
    simulated one for the GPU that ran (`as_run`: this GPU's kernels at that capacity);
    `boundary` gives the simulated boundary on the catalog GPU (default: a simulated sweep);
    `nvml` replaces pynvml for the driver stamp. A combination the model cannot build (a
    ValueError before its first step: checkpointing on ResNet, say) is passed to `on_skip`
    with the reason and the grid goes on; without `on_skip` the error is raised.

    With `emulate`, `cap` says how the capacity is capped (`capped`): CAP_FRACTION or
    CAP_BALLAST (`runtime`: the CUDA runtime the ballast is taken with, a fake in tests);
    `boundary_rows=False` measures the batch sizes asked only. `start`: how each loop reaches
    step 1 (`allocator.PROBE` re-runs a row committed before loops were measured as it ran).
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1 (got {steps})")
    if not cuda_available(cuda):
        raise NoGpuError("calibrate needs a CUDA GPU and PyTorch sees none")
    device_gpu = detect_cuda_gpu(cuda)
    target = emulate or device_gpu
    env = gpu_environment(cuda, emulate.name if emulate else "", nvml=nvml)
    # Both judged against `target`'s capacity: the detected GPU, or the one the capped process
    # emulates; the simulation runs the kernels the steps ran, this GPU's.
    real = real or (lambda settings, gpu: _session(settings, gpu, "cuda", cuda).open_backend())
    simulated = simulated or (lambda settings, gpu: _session(settings, gpu, "sim").open_backend())
    boundary = boundary or predicted_boundary
    batch_sizes = tuple(batch_sizes)
    sim_gpu = as_run(device_gpu, target.usable_bytes, target.name)
    with capped(cuda, emulate, device_gpu, cap, runtime):
        for settings in grid:
            try:
                # One backend per combination: model and optimizer state stay resident across
                # batch sizes, as in training; the session frees them before the next one.
                with (
                    real(settings, target).session() as device,
                    simulated(settings, sim_gpu).session() as sim,
                ):
                    checks = [(batch, "") for batch in batch_sizes]
                    if emulate is not None and boundary_rows:
                        checks += boundary_checks(*boundary(settings, target))
                    for batch, label in checks:
                        measured = run_loop(device, batch, steps, cuda, start)
                        predicted = simulated_loop(sim, batch, steps, start)
                        row = _row(env, settings, target, batch, measured, predicted, label)
                        yield replace(row, cap_method=cap if emulate is not None else "")
            except ValueError as exc:
                if on_skip is None:
                    raise
                on_skip(settings, str(exc))


def as_run(device_gpu: gpus.GPU, capacity_bytes: int, capped_as: str = "") -> gpus.GPU:
    """The GPU a capped run really is, for the simulation: `device_gpu`'s kernels (compute
    capability: attention backend, cuBLAS workspaces) with `capacity_bytes` usable (what the
    cap left the allocator; `capped_as` names the GPU it emulated). `device_gpu` itself when
    nothing was capped."""
    if capacity_bytes == device_gpu.usable_bytes:
        return device_gpu
    return replace(
        device_gpu,
        name=f"{device_gpu.name} as {capped_as or 'capped'}",
        total_bytes=capacity_bytes + device_gpu.context_bytes + device_gpu.nccl_bytes,
        measured=False,
    )


def _session(settings: Settings, gpu: gpus.GPU, backend: str, cuda: Any = None) -> Session:
    return Session(settings.replace(backend=backend), gpu=gpu, cuda=cuda)


def predicted_boundary(settings: Settings, gpu: gpus.GPU) -> tuple[int, int, int]:
    """What a simulated sweep on catalog GPU `gpu` says: the largest batch that runs (judged
    against the whole capacity, whatever the margin), the sweep's step, and the batch
    MemoryMark recommends (the default margin, no allocation retry); 0 for a batch when there
    is none."""
    session = Session(settings.replace(backend="sim", gpu=gpu.name, margin=RECOMMENDED_MARGIN))
    report = session.analyze(fixes=False, plan=False)
    best, optimal = report.max_fit, report.optimal
    return (
        best.batch_size if best is not None else 0,
        settings.search.step,
        optimal.batch_size if optimal is not None else 0,
    )


def boundary_checks(max_batch: int, step: int, recommended: int = 0) -> list[tuple[int, str]]:
    """(batch, boundary_check) pairs to measure: the recommended batch must fit, the predicted
    maximum must run and one step past it must not; when nothing is predicted to run, batch 1
    must not."""
    if max_batch < 1:
        return [(1, BOUNDARY_PAST_MAX)]
    checks = [(recommended, BOUNDARY_RECOMMENDED)] if 0 < recommended < max_batch else []
    return [*checks, (max_batch, BOUNDARY_MAX), (max_batch + step, BOUNDARY_PAST_MAX)]


@contextlib.contextmanager
def capped(
    cuda: Any,
    emulated: gpus.GPU | None,
    device_gpu: gpus.GPU,
    how: str = CAP_FRACTION,
    runtime: ballast.Runtime | None = None,
) -> Iterator[None]:
    """Within the block, the caching allocator on device 0 reserves at most `emulated`'s
    capacity (nothing changes without `emulated`); the cap is lifted on the way out.

    `how` is CAP_FRACTION (below) or CAP_BALLAST: the rest of the card held by raw
    `cudaMalloc` through `runtime` (memorymark/calibration/ballast.py; libcudart by default),
    after the cache is emptied, so that `cudaMemGetInfo`, which cuDNN sizes its workspaces from,
    reports the emulated capacity free, as the smaller card would.

    `set_per_process_memory_fraction(fraction, device)` makes the allocator refuse a new segment
    once its reserved bytes would pass fraction x the device's total (the total
    `cudaMemGetInfo` reports: `allowed_memory_maximum = fraction * device_total` in
    c10/cuda/CUDACachingAllocator.cpp), raising an out-of-memory error as a full GPU would. The
    cap counts only what the caching allocator reserves: this process's CUDA context sits
    outside it. So the fraction is the emulated GPU's *capacity* (its total less its CUDA
    context, what the simulation judges against) over this GPU's total, not its total.

    What the cap does NOT emulate: the other GPU's CUDA context (its size is the catalog's
    estimate, taken as given here, not checked), and its architecture's kernels (the attention
    backend chosen per compute capability, cuBLAS workspace sizes, cuDNN algorithms: the steps
    measured run this GPU's); nor its speed.
    """
    if emulated is None:
        yield
        return
    if how not in CAPS:
        raise ValueError(f"cap must be one of {', '.join(CAPS)} (got {how!r})")
    fraction = cap_fraction(cuda, emulated, device_gpu)  # refuses a larger GPU either way
    if how == CAP_BALLAST:
        cuda.empty_cache()
        with ballast.held(runtime or ballast.CudaRuntime(), emulated.usable_bytes):
            yield
        return
    cuda.set_per_process_memory_fraction(fraction, 0)
    try:
        yield
    finally:
        cuda.set_per_process_memory_fraction(1.0, 0)


def cap_fraction(cuda: Any, emulated: gpus.GPU, device_gpu: gpus.GPU) -> float:
    """The memory fraction of device 0 that leaves the allocator `emulated`'s capacity."""
    if emulated.usable_bytes > device_gpu.usable_bytes:
        raise ValueError(
            f"cannot emulate {emulated.name} ({emulated.usable_gib:.2f} GiB usable) on "
            f"{device_gpu.name} ({device_gpu.usable_gib:.2f} GiB usable): a cap can only shrink "
            "a GPU"
        )
    _, total_bytes = cuda.mem_get_info(0)
    return float(emulated.usable_bytes / total_bytes)


def _row(
    env: GpuEnvironment,
    settings: Settings,
    gpu: gpus.GPU,
    batch_size: int,
    measured: Loop,
    predicted: Loop,
    boundary_check: str,
) -> CalibrationRow:
    text = models.find_model(settings.workload.model).input_kind == "text"
    return CalibrationRow(
        environment=env,
        model=settings.workload.model,
        task=settings.workload.resolved_task,
        precision=settings.workload.precision,
        optimizer=settings.workload.optimizer,
        grad_checkpointing=settings.workload.grad_checkpointing,
        lora_rank=settings.workload.lora_rank,
        protocol=settings.workload.protocol,
        seq_len=settings.workload.seq_len if text else None,
        image_size=None if text else settings.workload.image_size,
        batch_size=batch_size,
        grad_accum=settings.workload.grad_accum,
        boundary_check=boundary_check,
        capacity_bytes=gpu.usable_bytes,
        measured_allocated_bytes=measured.allocated_bytes,
        measured_reserved_bytes=measured.reserved_bytes,
        measured_fits=measured.runs,
        alloc_retries=measured.retries,
        num_ooms=measured.ooms,
        # Like for like: what CUDA's allocator would count (512-byte blocks) over the same steps.
        predicted_allocated_bytes=predicted.allocated_bytes or 0,
        predicted_reserved_bytes=predicted.reserved_bytes,
        predicted_fits=predicted.runs,
        loop_steps=measured.asked,
        measured_oom_step=measured.oom_step,
        measured_allocated_per_step=_bytes(measured, "allocated_bytes"),
        measured_reserved_per_step=_bytes(measured, "reserved_bytes"),
        measured_retries_per_step=tuple(s.retries for s in measured.steps),
        predicted_retries=predicted.retries,
        predicted_oom_step=predicted.oom_step,
        predicted_allocated_per_step=_bytes(predicted, "allocated_bytes"),
        predicted_reserved_per_step=_bytes(predicted, "reserved_bytes"),
        predicted_retries_per_step=tuple(s.retries for s in predicted.steps),
        loop_start=measured.start,
        quantization=quantization_label(settings),
        kernels="" if settings.workload.kernels == "none" else settings.workload.kernels,
        compile=settings.workload.compile,
        float8=settings.workload.float8,
    )


def quantization_label(settings: Settings) -> str:
    """The `quantization` column: "none", "nf4", or "nf4 double-quant" and the like."""
    w = settings.workload
    return w.quantization + (" double-quant" if w.double_quant else "")


def _bytes(loop: Loop, name: str) -> tuple[int, ...]:
    """One peak of each step that finished."""
    return tuple(getattr(s, name) or 0 for s in loop.finished)
