"""One model across the whole GPU catalog, from one set of probes rather than a sweep per GPU.

A simulated step's peak does not depend on the GPU it is compared against, so one measurement
at batch B answers "does B fit?" for every GPU at once. Two traced batches predict each GPU's
boundary (the fast strategy's timeline extrapolation); each prediction is then checked by
measuring the boundary and the grid point above it, and every measurement is shared by all GPUs.
This module composes the engine; it knows nothing about how a step is measured.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memorymark import gpus
from memorymark.devices import capacity_bytes, open_backend, resolve_gpu
from memorymark.gpus import GPU
from memorymark.measurement import Measurement
from memorymark.settings import Costs, Settings
from memorymark.sweep import predict_max_batch


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuFit:
    """The largest batch that trains on one GPU, and the estimated cost of a run there."""

    gpu: GPU
    max_batch: int | None
    """Largest grid batch measured as fitting (None: not even the smallest probe fits)."""
    peak_bytes: int | None
    """Peak at max_batch (simulated)."""
    usd_per_hour: float
    relative_speed: float
    """Estimated: this GPU's peak TFLOP/s at the run's precision over the chosen GPU's."""
    est_hours_per_run: float
    """Estimated: the user's hours per run (on the chosen GPU) divided by relative_speed."""

    @property
    def est_cost_per_run_usd(self) -> float:
        """Estimated cost of one training run on this GPU."""
        return round(self.usd_per_hour * self.est_hours_per_run, 2)

    def with_hours(self, hours_per_run: float) -> GpuFit:
        """The same fit priced for another run length on the chosen GPU (no new probes)."""
        return replace(self, est_hours_per_run=hours_per_run / self.relative_speed)


def peak_tflops(gpu: GPU, precision: str) -> float:
    """The peak rate a run at `precision` can use: tensor-core bf16/fp16, else plain FP32
    (PyTorch keeps TF32 off for matmuls by default, so fp32 training runs at the FP32 rate)."""
    return gpu.fp32_tflops if precision == "32-true" else gpu.bf16_tflops


def compare_gpus(
    settings: Settings,
    costs: Costs | None = None,
    catalog: tuple[GPU, ...] = gpus.CATALOG,
) -> tuple[list[GpuFit], list[Measurement]]:
    """Each catalog GPU's max batch for `settings`, and every measurement it took."""
    costs = costs or Costs()
    largest = max(catalog, key=lambda g: g.usable_bytes)
    # Simulate against the largest GPU: every smaller GPU's answer lies below its budget.
    base = replace(
        settings,
        backend="sim" if settings.backend != "cpu" else "cpu",
        gpu=largest.name,
        gpu_memory_gib=None,
    )
    backend, _ = open_backend(base)
    # Run times are scaled against the GPU the user chose (their hours-per-run figure is for it).
    reference = resolve_gpu(settings, "sim")
    step = settings.step
    probes: dict[int, Measurement] = {}

    def peak(batch: int) -> Measurement:
        if batch not in probes:
            probes[batch] = backend.measure(batch)
        return probes[batch]

    def fits(batch: int, gpu: GPU) -> bool:
        m = peak(batch)
        # The same quantity the simulated OOM tests: what the caching allocator would reserve
        # (replayed against the largest GPU's budget, so a smaller GPU's answer is conservative:
        # its allocator would hand cached segments back before failing).
        return m.fits and m.required_bytes <= capacity_bytes(settings, gpu)

    rows = []
    precision = settings.precision
    with backend.session():
        first, second = max(step, 2), 2 * max(step, 2)
        small, large = peak(first), peak(second)
        for gpu in catalog:
            limit = capacity_bytes(settings, gpu)
            best = _boundary(gpu, small, large, step, settings.max_batch, fits, limit)
            speed = peak_tflops(gpu, precision) / peak_tflops(reference, precision)
            rows.append(
                GpuFit(
                    gpu=gpu,
                    max_batch=best,
                    peak_bytes=probes[best].peak_bytes if best else None,
                    usd_per_hour=gpu.usd_per_hour,
                    relative_speed=round(speed, 4),
                    est_hours_per_run=costs.hours_per_run / speed,
                )
            )
    return rows, sorted(probes.values(), key=lambda m: m.batch_size)


def _boundary(gpu, small, large, step, max_batch, fits, limit) -> int | None:  # noqa: ANN001
    if not fits(small.batch_size, gpu):
        below = [b for b in range(step - 1 if step > 1 else 1, 0, -1)]
        return next((b for b in below if fits(b, gpu)), None)
    if small.fits and large.fits:
        guess = predict_max_batch(small, large, limit)
    else:
        guess = small.batch_size
    top = max_batch // step * step
    batch = min(top, max(step, int(min(guess, top)) // step * step))
    # Walk from the prediction to the boundary; with an exact prediction this is two probes.
    while batch > step and not fits(batch, gpu):
        batch -= step
    while batch + step <= top and fits(batch + step, gpu):
        batch += step
    return batch if fits(batch, gpu) else None
