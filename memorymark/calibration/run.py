"""Calibration: the simulation checked against a real CUDA GPU, row by row.

`calibrate` runs each settings combination at several batch sizes for real on this machine's
GPU and simulated for the same GPU, and yields one `CalibrationRow` per batch: the first step's
measured peaks and allocator counters beside the prediction, stamped with the environment. With
`emulate`, the process is capped at a catalog GPU's capacity and the simulation's boundary for
that GPU is checked: its largest running batch must run here, one search step more must not.
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
from memorymark.backends.base import Backend
from memorymark.backends.resolve import cuda_available, detect_cuda_gpu
from memorymark.calibration.record import (
    BOUNDARY_MAX,
    BOUNDARY_PAST_MAX,
    BOUNDARY_RECOMMENDED,
    CalibrationRow,
)
from memorymark.engine import Session
from memorymark.environment import GpuEnvironment, gpu_environment
from memorymark.measurement import Measurement
from memorymark.settings import Search, Settings
from memorymark.settings.choices import PROTOCOLS

DEFAULT_MODELS = ("bert", "gpt2", "resnet")
DEFAULT_BATCH_SIZES = (4, 8, 16)
# The allocator counters a row reports per probe (names as `torch.cuda.memory_stats()` has them).
_COUNTERS = ("num_alloc_retries", "num_ooms")

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
    cuda: Any = torch.cuda,
    real: BackendFactory | None = None,
    simulated: BackendFactory | None = None,
    boundary: BoundaryPredictor | None = None,
    nvml: Any = None,
    on_skip: Callable[[Settings, str], None] | None = None,
) -> Iterator[CalibrationRow]:
    """Yield one row per settings combination and batch size as each pair of measurements
    lands, then, with `emulate`, the two boundary rows of each combination.

    `cuda` is torch.cuda (a fake in tests); `real` and `simulated` build the measured and the
    simulated backend for a combination and the GPU whose capacity judges them (this one, or
    `emulate`); `boundary` gives the simulated boundary (default: a simulated sweep);
    `nvml` replaces pynvml for the driver stamp. A combination the model cannot build (a
    ValueError before its first step: checkpointing on ResNet, say) is passed to `on_skip`
    with the reason and the grid goes on; without `on_skip` the error is raised.
    """
    if not cuda_available(cuda):
        raise NoGpuError("calibrate needs a CUDA GPU and PyTorch sees none")
    device_gpu = detect_cuda_gpu(cuda)
    target = emulate or device_gpu
    env = gpu_environment(cuda, emulate.name if emulate else "", nvml=nvml)
    # Both judged against `target`: the detected GPU, or the one the capped process emulates.
    real = real or (lambda settings, gpu: _session(settings, gpu, "cuda", cuda).open_backend())
    simulated = simulated or (lambda settings, gpu: _session(settings, gpu, "sim").open_backend())
    boundary = boundary or predicted_boundary
    batch_sizes = tuple(batch_sizes)
    with capped(cuda, emulate, device_gpu):
        for settings in grid:
            try:
                # One backend per combination: model and optimizer state stay resident across
                # batch sizes, as in training; the session frees them before the next one.
                with (
                    real(settings, target).session() as device,
                    simulated(settings, target).session() as sim,
                ):
                    checks = [(batch, "") for batch in batch_sizes]
                    if emulate is not None:
                        checks += boundary_checks(*boundary(settings, target))
                    for batch, label in checks:
                        before = _counters(cuda) if device.measured else None
                        measured, predicted = device.measure(batch), sim.measure(batch)
                        yield _row(env, settings, target, measured, predicted, before, label)
            except ValueError as exc:
                if on_skip is None:
                    raise
                on_skip(settings, str(exc))


def _session(settings: Settings, gpu: gpus.GPU, backend: str, cuda: Any = None) -> Session:
    return Session(replace(settings, backend=backend), gpu=gpu, cuda=cuda)


def predicted_boundary(settings: Settings, gpu: gpus.GPU) -> tuple[int, int, int]:
    """What a simulated sweep on catalog GPU `gpu` says: the largest batch that runs (judged
    against the whole capacity, whatever the margin), the sweep's step, and the batch
    MemoryMark recommends (the default margin, no allocation retry); 0 for a batch when there
    is none."""
    session = Session(replace(settings, backend="sim", gpu=gpu.name, margin=RECOMMENDED_MARGIN))
    report = session.analyze(fixes=False, plan=False)
    best, optimal = report.max_fit, report.optimal
    return (
        best.batch_size if best is not None else 0,
        settings.step,
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
def capped(cuda: Any, emulated: gpus.GPU | None, device_gpu: gpus.GPU) -> Iterator[None]:
    """Within the block, the caching allocator on device 0 reserves at most `emulated`'s
    capacity (nothing changes without `emulated`); the cap is lifted on the way out.

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
    fraction = cap_fraction(cuda, emulated, device_gpu)
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


def _counters(cuda: Any) -> dict[str, int]:
    stats = cuda.memory_stats()
    return {name: int(stats.get(name, 0)) for name in _COUNTERS}


def _row(
    env: GpuEnvironment,
    settings: Settings,
    gpu: gpus.GPU,
    measured: Measurement,
    predicted: Measurement,
    counters_before: dict[str, int] | None,
    boundary_check: str,
) -> CalibrationRow:
    stats = measured.memory_stats
    if stats is not None:  # the first step's own peaks, before any timed step
        allocated = stats.get("allocated_bytes.all.peak")
        reserved = stats.get("reserved_bytes.all.peak")
    else:  # a stand-in backend without the device's statistics
        allocated, reserved = measured.cuda_allocated_bytes, measured.cuda_reserved_bytes
    ran = measured.required_bytes is not None  # None: the step ran out of memory
    text = models.find_model(settings.model).input_kind == "text"

    def during_probe(name: str) -> int | None:
        if stats is None or counters_before is None or name not in stats:
            return measured.alloc_retries if name == "num_alloc_retries" else None
        return stats[name] - counters_before[name]

    return CalibrationRow(
        environment=env,
        model=settings.model,
        task=settings.resolved_task,
        precision=settings.precision,
        optimizer=settings.optimizer,
        grad_checkpointing=settings.grad_checkpointing,
        lora_rank=settings.lora_rank,
        protocol=settings.protocol,
        seq_len=settings.seq_len if text else None,
        image_size=None if text else settings.image_size,
        batch_size=measured.batch_size,
        grad_accum=settings.grad_accum,
        boundary_check=boundary_check,
        capacity_bytes=gpu.usable_bytes,
        measured_allocated_bytes=allocated if ran else None,
        measured_reserved_bytes=reserved if ran else None,
        measured_fits=bool(measured.runs),
        alloc_retries=during_probe("num_alloc_retries"),
        num_ooms=during_probe("num_ooms"),
        # Like for like: what CUDA's allocator would count (512-byte blocks), not tensor bytes.
        predicted_allocated_bytes=predicted.cuda_allocated_bytes,
        predicted_reserved_bytes=predicted.cuda_reserved_bytes,
        predicted_fits=bool(predicted.runs),
    )
