"""Engine objects with known numbers for the app's builder tests: pure, no Streamlit.

Not a test module: `test_app_charts.py` and `test_app_parts.py` import it.
"""

from __future__ import annotations

from memorymark import gpus
from memorymark.analyses.compare import GpuFit
from memorymark.analyses.proof import BackwardProof, ProtocolResult
from memorymark.measurement import Breakdown, Measurement
from memorymark.report import Report
from memorymark.settings import Costs, Settings
from memorymark.units import GIB

A10 = gpus.find_gpu("A10")
MIB = 2**20


def probe(batch: int, *, fits: bool = True, per_sample: int = 100 * MIB) -> Measurement:
    """A measurement whose peak is 1 GiB + per_sample * batch (an exactly affine model)."""
    peak = GIB + per_sample * batch
    breakdown = Breakdown(parameters=GIB // 2, optimizer_state=GIB // 2, activations=peak - GIB)
    return Measurement(
        batch_size=batch,
        fits=fits,
        peak_bytes=peak,
        backend="sim",
        measured=False,
        breakdown=breakdown if fits else None,
        error=None if fits else "simulated out of memory",
    )


def by_name(fig, name: str):  # a plotly figure and its trace
    return next(t for t in fig.data if t.name == name)


def sample_report(batches=(8, 16, 192, 200), current: int = 16) -> Report:
    ms = tuple(probe(b, fits=b < 200) for b in batches)
    settings = Settings(model="tiny-bert", gpu="A10", current_batch=current)
    return Report(settings=settings, costs=Costs(), gpu=A10, backend="sim", measurements=ms,
                  elapsed_seconds=1.5)  # fmt: skip


def gpu_fit(name: str, max_batch: int | None, hours: float) -> GpuFit:
    gpu = gpus.find_gpu(name)
    return GpuFit(gpu=gpu, max_batch=max_batch, peak_bytes=GIB if max_batch else None,
                  usd_per_hour=gpu.usd_per_hour, relative_speed=1.0,
                  est_hours_per_run=hours)  # fmt: skip


def sample_proof() -> BackwardProof:
    peaks = {"forward_only": 1, "forward_backward": 3, "full_step_eval": 4, "full_step": 6}
    max_batches = {"forward_only": 4096, "forward_backward": 272, "full_step_eval": 264,
                   "full_step": 176}  # fmt: skip
    results = tuple(
        ProtocolResult(
            key=k,
            label=k.replace("_", " "),
            peak_bytes=v * GIB // 2,
            fits=True,
            max_batch=max_batches[k],
        )  # fmt: skip
        for k, v in peaks.items()
    )
    return BackwardProof(batch_size=16, results=results)
