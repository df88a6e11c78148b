"""How the Scale out page shows its rows: a figure and a table, pure functions, no Streamlit.

Owns per-rank memory and the largest per-GPU batch against the GPU count (simulated), and
time and cost per run (estimated). Must not know how the rows were obtained; imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from memorymark.analyses.layouts import LayoutSearch
from memorymark.analyses.scale_out import ScaleOutRow
from memorymark.ui.charts import AMBER, GREEN
from memorymark.units import GIB

DEFAULT_COUNTS = (1, 2, 4, 8, 16, 32)
COUNT_CHOICES = (1, 2, 3, 4, 6, 8, 16, 24, 32, 64, 128, 256, 512, 1024)


def figure(rows: Sequence[ScaleOutRow]) -> go.Figure:
    """Per-rank peak (simulated), max per-GPU batch (simulated) and cost per run (estimated)."""
    x = [str(r.gpus) for r in rows]
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=(
            "Rank 0 peak, GiB (simulated)",
            "Largest per-GPU batch (simulated)",
            "Cost per run, $ (estimated)",
        ),
    )
    peaks = [None if r.peak_bytes is None else r.peak_bytes / GIB for r in rows]
    fig.add_trace(go.Bar(x=x, y=peaks, marker_color=GREEN, name="peak"), row=1, col=1)
    batches = [r.per_gpu_batch or 0 for r in rows]
    labels = [str(b) if b else "none" for b in batches]
    fig.add_trace(
        go.Bar(x=x, y=batches, text=labels, textposition="outside", marker_color=GREEN),
        row=1,
        col=2,
    )
    costs = [r.usd_per_run for r in rows]
    fig.add_trace(go.Bar(x=x, y=costs, marker_color=AMBER, name="$ per run"), row=1, col=3)
    fig.update_xaxes(title_text="GPUs", type="category")
    fig.update_layout(height=380, showlegend=False, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def table(rows: Sequence[ScaleOutRow]) -> list[dict[str, Any]]:
    """One line per GPU count: memory simulated, time and cost estimated."""
    return [
        {
            "GPUs": r.gpus,
            "nodes": r.nodes,
            "per-GPU batch": r.per_gpu_batch,
            "global batch": r.global_batch,
            "rank 0 peak GiB (sim.)": _gib(r.peak_bytes),
            "states GiB (sim.)": _gib(r.states_bytes),
            "NCCL GiB (est.)": _gib(r.nccl_bytes),
            "compute s/step (est.)": _round(r.compute_seconds),
            "comm s/step (est.)": _round(r.comm_seconds),
            "samples/s (est.)": _round(r.samples_per_second, 1),
            "$ per run (est.)": _round(r.usd_per_run, 2),
        }
        for r in rows
    ]


def layout_table(search: LayoutSearch) -> list[dict[str, Any]]:
    """One line per parallel layout, best first: memory simulated, time and cost estimated."""
    lines = []
    for r in search.rows:
        per_gpu = None if r.samples_per_second is None else r.samples_per_second / search.gpus
        lines.append(
            {
                "layout": r.candidate.describe(),
                "status": r.status if r.note is None else f"{r.status}: {r.note}",
                "per-GPU batch": r.per_gpu_batch,
                "accumulation": r.accumulation if r.fits else None,
                "global batch": r.global_batch,
                "peak GiB (sim.)": _gib(r.peak_bytes),
                "worst rank": r.worst_rank,
                "bubble (est.)": round(r.bubble_fraction, 3) if r.fits else None,
                "s/step (est.)": _round(r.step_seconds),
                "samples/s per GPU (est.)": _round(per_gpu, 2),
                "$ per run (est.)": _round(r.usd_per_run, 2),
            }
        )
    return lines


def layout_summary(search: LayoutSearch) -> str:
    """What the search did, in one line: the count, the best layout, steps traced, pruned."""
    best = "none trains" if search.best is None else f"best: {search.best.candidate.describe()}"
    return (
        f"{search.gpus} GPUs, {best}; {search.traced_steps} steps traced, {search.pruned} "
        f"layouts pruned (their states alone pass a GPU), {search.elapsed_seconds:.1f} s"
    )


def smallest(rows: Sequence[ScaleOutRow]) -> int | None:
    """The smallest count among `rows` on which batch 1 trains."""
    return min((r.gpus for r in rows if r.per_gpu_batch), default=None)


def _gib(n: int | None) -> float | None:
    return None if n is None else round(n / GIB, 2)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
