"""One model across the whole GPU catalog, without a full sweep per GPU.

Each GPU's answer must be the one `analyze --gpu` gives, and two things make a step GPU-specific:
the kernels CUDA picks (attention, cuBLAS's workspace: by compute capability) and what the
caching allocator reserves (it hands cached segments back only when the GPU's own limit is
near). So the step is traced once per compute capability, on its largest GPU, and every GPU of
that capability is judged against its own capacity: with the symbolic strategy, by replaying the
step confirmed there (memorymark/search/symbolic.py; a GPU replayed never builds its model), else
by the fast strategy's search handed the borrowed traces, about two probes per GPU. The user's
current batch on their GPU, the baseline of every speed, is replayed too where it can be. This
module composes the engine through its door (memorymark/analyses/bench.py); it knows nothing
about how a step is built or measured.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memorymark import gpus
from memorymark.accounting.symbolic import Replays
from memorymark.analyses.bench import Bench
from memorymark.gpus import GPU
from memorymark.measurement import Measurement
from memorymark.search.pick import pick_strategy
from memorymark.search.sweep import best_fit, sweep
from memorymark.search.symbolic import SymbolicStrategy
from memorymark.settings import Costs, Settings
from memorymark.units import GIB


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
    """Estimated, with the model Analyze's speedup uses (each operator's FLOPs and bytes on the
    GPU's roofline): samples/s at this GPU's max batch over samples/s at the user's current
    batch on the chosen GPU. Where either is unknown (nothing fits), the ratio of peak TFLOP/s
    at the run's precision."""
    est_hours_per_run: float
    """Estimated: the user's hours per run (on the chosen GPU) divided by relative_speed."""

    @property
    def est_cost_per_run_usd(self) -> float:
        """Estimated cost of one training run on this GPU."""
        return round(self.usd_per_hour * self.est_hours_per_run, 2)

    def to_dict(self, precision: str, *, tf32: bool = False) -> dict[str, Any]:
        """The `compare --json` row: memory simulated, rates from the catalog, the rest
        estimated."""
        return {
            "gpu": self.gpu.name,
            "usable_gb": round(self.gpu.usable_gib, 2),
            "max_batch": self.max_batch,
            "peak_gb": None if self.peak_bytes is None else round(self.peak_bytes / GIB, 3),
            "peak_tflops": peak_tflops(self.gpu, precision, tf32=tf32),
            "usd_per_hour": self.usd_per_hour,
            "relative_speed": self.relative_speed,
            "est_hours_per_run": round(self.est_hours_per_run, 3),
            "est_cost_per_run_usd": self.est_cost_per_run_usd,
        }

    def with_hours(self, hours_per_run: float) -> GpuFit:
        """The same fit priced for another run length on the chosen GPU (no new probes)."""
        return replace(self, est_hours_per_run=hours_per_run / self.relative_speed)


def peak_tflops(gpu: GPU, precision: str, *, tf32: bool = False) -> float:
    """The peak rate a run at `precision` can use: tensor-core bf16/fp16, else plain FP32
    (PyTorch keeps TF32 off for matmuls by default, so fp32 training runs at the FP32 rate),
    or TF32 where `tf32` turns it on and the GPU has it."""
    if precision != "32-true":
        return gpu.half_tflops
    return (gpu.tf32_tflops or gpu.fp32_tflops) if tf32 else gpu.fp32_tflops


def without_precision(settings: Settings, catalog: tuple[GPU, ...] = gpus.CATALOG) -> list[GPU]:
    """The GPUs of `catalog` that cannot train at the settings' precision (bf16 before Ampere)."""
    if settings.workload.precision not in gpus.BF16_PRECISIONS:
        return []
    return [g for g in catalog if not g.supports_bf16]


def compare_gpus(
    settings: Settings,
    costs: Costs | None = None,
    catalog: tuple[GPU, ...] = gpus.CATALOG,
    *,
    reference: GPU,
    bench: Bench,
) -> tuple[list[GpuFit], list[Measurement]]:
    """Each catalog GPU's max batch for `settings`, and every measurement it took; run times
    are scaled against `reference`, the GPU the user chose (their hours-per-run are for it).
    Called through `engine.Session.compare`, which hands it `bench`."""
    costs = costs or Costs()
    # Every GPU of the catalog is simulated (a CPU run keeps its real CPU kernels).
    settings = settings.replace(backend="cpu" if settings.hardware.backend == "cpu" else "sim")
    searches = _Searches(settings, bench)
    measured: list[Measurement] = []
    rows = []
    # A GPU that cannot run the precision (bf16 before Ampere) has no answer to give.
    catalog = tuple(g for g in catalog if g not in without_precision(settings, catalog))
    # Largest first, so each capability's traces come from the GPU most likely to fit them.
    best_by_gpu: dict[str, Measurement | None] = {}
    for gpu in sorted(catalog, key=lambda g: -g.usable_bytes):
        probes = searches.search(gpu)
        measured += probes
        best_by_gpu[gpu.name] = best_fit(probes)
    # What the user's hours per run are for: their current batch on the GPU they chose.
    baseline = searches.one(reference, settings.search.current_batch).samples_per_second
    for gpu in catalog:
        best = best_by_gpu[gpu.name]
        speed = _relative_speed(best, gpu, reference, settings, baseline)
        rows.append(
            GpuFit(
                gpu=gpu,
                max_batch=best.batch_size if best else None,
                peak_bytes=best.peak_bytes if best else None,
                usd_per_hour=gpu.usd_per_hour,
                relative_speed=round(speed, 4),
                est_hours_per_run=costs.hours_per_run / speed,
            )
        )
    return rows, measured


class _Searches:
    """Each GPU's search, sharing what GPUs of one compute capability share: the symbolic
    step, once traced and confirmed on one of them (every other one's answer is then replayed,
    its model never built); or, for the fast and linear strategies, two traces."""

    def __init__(self, settings: Settings, bench: Bench) -> None:
        self.settings = settings
        self.bench = bench
        self.symbolic = settings.search.strategy == "symbolic"
        self.traces: dict[tuple[int, int], tuple[Measurement, Measurement]] = {}
        self.replays: dict[tuple[int, int], Replays] = {}

    def search(self, gpu: GPU) -> list[Measurement]:
        """The probes (traced or replayed) of the search for `gpu`'s recommended batch."""
        s, cc = self.settings, gpu.compute_capability
        backend = self.bench.backend(s, gpu)
        policy = backend.policy
        known = self.replays.get(cc)
        strategy = pick_strategy(
            "symbolic" if self.symbolic else "fast",
            backend,
            step=s.search.step,
            max_batch=s.search.max_batch,
            capacity_bytes=policy.capacity_bytes,
            limit_bytes=policy.limit_bytes,
            confirmed=known.measured_by(backend.measurement_of) if known else None,
            traces=self.traces.get(cc),
            find_max=False,
        )
        probes = list(sweep(backend, strategy))
        if strategy.traces is not None:
            self.traces.setdefault(cc, strategy.traces)
        if isinstance(strategy, SymbolicStrategy) and strategy.trusted:
            self.replays.setdefault(cc, strategy.replayer)  # type: ignore[arg-type]
        return probes

    def one(self, gpu: GPU, batch_size: int) -> Measurement:
        """`batch_size` on `gpu`: replayed where its capability's step is known, else traced."""
        backend = self.bench.backend(self.settings, gpu)
        known = self.replays.get(gpu.compute_capability)
        replayed = known.measured_by(backend.measurement_of).replay(batch_size) if known else None
        if replayed is not None:
            return replayed
        with backend.session():
            return backend.measure(batch_size)


def _relative_speed(
    best: Measurement | None,
    gpu: GPU,
    reference: GPU,
    settings: Settings,
    baseline_samples_per_second: float | None,
) -> float:
    if best is not None and best.samples_per_second and baseline_samples_per_second:
        return best.samples_per_second / baseline_samples_per_second
    return peak_tflops(gpu, settings.workload.precision) / peak_tflops(
        reference, settings.workload.precision
    )
