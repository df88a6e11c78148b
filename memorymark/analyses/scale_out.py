"""Scaling out: the same step on N GPUs for several N, and each count's memory, time and cost.

`scale_out` sweeps each count in full and turns its report into a `ScaleOutRow`: per-rank
memory, the largest per-GPU batch, the global batch, and the step's time and cost, estimated
(compute from the simulated step's FLOPs and bytes on the GPU's roofline, communication from
the bytes the strategy moves over the catalog's NVLink/PCIe and network bandwidths, assumed
to overlap with compute as FSDP2's prefetching and DDP's bucketing aim for). The smallest
count that trains is memorymark/search/gpu_count.py's search.

Reaches the engine through its door (memorymark/analyses/bench.py) only; imports no torch, so
the app's pages can import it.
Must not know how anything is displayed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memorymark.distributed import topology
from memorymark.search.gpu_count import with_gpus
from memorymark.settings import Settings
from memorymark.units import gib

if TYPE_CHECKING:
    from memorymark.analyses.bench import Bench
    from memorymark.measurement import Measurement
    from memorymark.report import Report


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleOutRow:
    """One GPU count's answer (memory simulated; time and cost estimated)."""

    gpus: int
    nodes: int
    per_gpu_batch: int | None
    """The largest per-GPU batch that fits (recommended); None when batch 1 does not."""
    global_batch: int | None
    """Samples per optimizer step over every rank: per-GPU batch x GPUs x accumulation."""
    peak_bytes: int | None
    """Rank 0's peak live bytes at that batch (or what batch 1 needs when nothing fits)."""
    states_bytes: int | None
    """Rank 0's parameters, gradients and optimizer state at that peak."""
    nccl_bytes: int
    """NCCL's buffers per rank (estimated), outside the caching allocator."""
    compute_seconds: float | None
    comm_seconds: float | None
    step_seconds: float | None
    """max(compute, communication): the two overlap."""
    samples_per_second: float | None
    usd_per_run: float | None
    """GPUs x price x hours for `samples_per_run` samples."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, memory in GiB."""
        return {
            "gpus": self.gpus,
            "nodes": self.nodes,
            "per_gpu_batch": self.per_gpu_batch,
            "global_batch": self.global_batch,
            "peak_gb": None if self.peak_bytes is None else gib(self.peak_bytes),
            "states_gb": None if self.states_bytes is None else gib(self.states_bytes),
            "nccl_gb": gib(self.nccl_bytes),
            "compute_seconds": _round(self.compute_seconds),
            "comm_seconds": _round(self.comm_seconds),
            "step_seconds": _round(self.step_seconds),
            "samples_per_second": _round(self.samples_per_second),
            "usd_per_run": _round(self.usd_per_run),
            "time_source": "estimated",
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def states_bytes(m: Measurement | None) -> int | None:
    """Parameters, gradients and optimizer state in a measurement's peak breakdown."""
    if m is None or m.breakdown is None:
        return None
    b = m.breakdown
    return b.parameters + b.gradients + b.optimizer_state


def row_from_report(
    report: Report, param_count: int, samples_per_run: float, usd_per_hour: float
) -> ScaleOutRow:
    """A count's row from its sweep's report (`param_count`: the model's parameters)."""
    s = report.settings
    gpus, nodes = s.hardware.gpu_count or 1, s.hardware.node_count if s.hardware.gpu_count else 1
    best = report.optimal
    shown = best or next((m for m in report.measurements if m.batch_size == 1), None)
    nccl = topology.nccl_bytes(s.hardware.dist, gpus, nodes)
    if best is None or best.samples_per_second is None:
        return ScaleOutRow(
            gpus=gpus, nodes=nodes, per_gpu_batch=None, global_batch=None,
            peak_bytes=shown.required_bytes if shown else None,
            states_bytes=states_bytes(shown), nccl_bytes=nccl, compute_seconds=None,
            comm_seconds=None, step_seconds=None, samples_per_second=None, usd_per_run=None,
        )  # fmt: skip
    samples = best.batch_size * s.workload.grad_accum
    compute = samples / best.samples_per_second
    traffic = topology.step_traffic(
        s.hardware.dist,
        gpus,
        nodes,
        param_count,
        element_bytes(s, compute=True),
        element_bytes(s, compute=False),
    )
    comm = topology.comm_seconds(
        traffic, report.gpu.intra_node_bytes_per_s, report.gpu.inter_node_bytes_per_s
    )
    step = max(compute, comm)
    # The tensor and context parallel ranks of one data-parallel rank share its samples.
    data_parallel = s.hardware.layout(gpus).dp
    throughput = samples * data_parallel / step
    hours = samples_per_run / throughput / 3600
    return ScaleOutRow(
        gpus=gpus,
        nodes=nodes,
        per_gpu_batch=best.batch_size,
        global_batch=samples * data_parallel,
        peak_bytes=best.peak_bytes,
        states_bytes=states_bytes(best),
        nccl_bytes=nccl,
        compute_seconds=compute,
        comm_seconds=comm,
        step_seconds=step,
        samples_per_second=throughput,
        usd_per_run=gpus * usd_per_hour * hours,
    )


def element_bytes(settings: Settings, *, compute: bool) -> int:
    """Bytes per element gathered (compute dtype) or reduced (fp32 under the default policy)."""
    if settings.workload.precision == "bf16-true":
        return 2
    lower = (
        settings.workload.precision in ("bf16-mixed", "16-mixed")
        and settings.hardware.mp_policy == "auto"
    )
    if compute and lower and settings.hardware.dist in topology.SHARDED:
        return 2
    return 4


def scale_out(
    settings: Settings,
    bench: Bench,
    counts: tuple[int, ...],
    param_count: int,
    samples_per_run: float,
    usd_per_hour: float,
) -> Iterator[ScaleOutRow]:
    """One row per GPU count, as each count's sweep (`bench.analyze(settings)`) finishes.
    A row reads the answer and batch 1 alone (`answer_only`)."""
    for n in counts:
        report = bench.analyze(with_gpus(settings, n), answer_only=True)
        yield row_from_report(report, param_count, samples_per_run, usd_per_hour)
