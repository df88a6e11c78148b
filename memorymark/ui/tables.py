"""Tables the pages show: rows of plain values from engine results, pure functions, no Streamlit.

Column names carry units and say which figures are simulated or estimated. Must not know how a
page lays the table out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memorymark.compare import GpuFit
from memorymark.proof import BackwardProof
from memorymark.report import gib


def rescale_hours(rows: Sequence[GpuFit], hours_per_run: float) -> list[GpuFit]:
    """The rows priced for a run of `hours_per_run` on the chosen GPU (no new probes)."""
    return [r.with_hours(hours_per_run) for r in rows]


def compare_table(rows: Sequence[GpuFit]) -> list[dict[str, Any]]:
    """One row per GPU: memory, max batch (simulated), price, time and cost per run (estimated)."""
    return [
        {
            "GPU": r.gpu.name,
            "Total (GiB)": round(r.gpu.total_gib, 2),
            "Usable (GiB)": round(r.gpu.usable_gib, 2),
            "Max batch (simulated)": r.max_batch,
            "Peak at max batch (GiB, simulated)": gib(r.peak_bytes) if r.peak_bytes else None,
            "$ per hour (catalog)": r.usd_per_hour,
            "Hours per run (estimated)": round(r.est_hours_per_run, 2),
            "$ per run (estimated)": r.est_cost_per_run_usd,
        }
        for r in rows
    ]


def proof_table(proof: BackwardProof) -> list[dict[str, Any]]:
    """One row per protocol: peak, ratio to forward-only, and the max batch it would recommend."""
    base = proof.peak("forward_only") or 1
    return [
        {
            "Protocol": r.label,
            f"Peak at batch {proof.batch_size} (GiB, {proof.memory_source})": gib(r.peak_bytes),
            "x forward-only": round(r.peak_bytes / base, 2),
            "Fits": r.fits,
            "Max batch it recommends": r.max_batch,
        }
        for r in proof.results
    ]


def proof_summary(proof: BackwardProof) -> str:
    """One sentence: what the inference-style protocol recommends vs what training allows."""
    by_key = {r.key: r for r in proof.results}
    style, full = by_key["forward_backward"], by_key["full_step"]
    peaks = f"peaks {gib(full.peak_bytes):.2f} GiB vs {gib(style.peak_bytes):.2f} GiB"
    if style.max_batch is None or full.max_batch is None:
        return f"At batch {proof.batch_size} the full training step {peaks} for inference-style."
    if style.max_batch > full.max_batch:
        return (
            f"Inference-style measuring recommends batch {style.max_batch}, but the full "
            f"training step trains only up to batch {full.max_batch}: the larger batch would "
            f"run out of memory at the first optimizer step ({peaks} at batch "
            f"{proof.batch_size})."
        )
    return (
        f"Both protocols allow batch {full.max_batch} here, yet the full "
        f"step {peaks} at batch {proof.batch_size}."
    )
