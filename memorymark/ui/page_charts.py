"""Plotly figures of the Compare GPUs and Backward-pass proof pages: pure functions, no Streamlit.

Owns how a GPU comparison (max batch simulated, cost per run estimated) and a backward-pass proof
(each protocol's peak, ratio and max batch) look. Must not know how the numbers were obtained.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from memorymark.analyses.compare import GpuFit
from memorymark.analyses.proof import BackwardProof
from memorymark.gpus import GPU
from memorymark.ui.charts import AMBER, GREEN, GREY, LAYOUT, titled
from memorymark.units import GIB, gib_text


def compare_figure(rows: Sequence[GpuFit], *, chosen: str | None = None) -> go.Figure:
    """Max batch (simulated) and cost per training run (estimated) for every GPU."""
    names = [r.gpu.name for r in rows]
    colours = [GREEN if n == chosen else "#2e8b57" for n in names]
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(
            "Max batch that trains (simulated)",
            "Cost per training run (estimated from peak TFLOP/s)",
        ),
    )
    fig.add_trace(
        go.Bar(
            x=names,
            y=[r.max_batch or 0 for r in rows],
            name="max batch",
            marker_color=colours,
            text=[str(r.max_batch) if r.max_batch else "none" for r in rows],
            textposition="outside",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Bar(
            x=names,
            y=[r.est_cost_per_run_usd for r in rows],
            name="$ per run (est.)",
            marker_color=AMBER,
            text=[f"${r.est_cost_per_run_usd:.2f}" for r in rows],
            textposition="outside",
        ),
        row=1,
        col=2,
    )
    fig.update_layout(height=420, showlegend=False, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def proof_figure(proof: BackwardProof, gpu: GPU) -> go.Figure:
    """Peak of each protocol at one batch, with its ratio to forward-only and its max batch."""
    base = proof.peak("forward_only") or 1
    colours = [GREY, AMBER, "#2e8b57", GREEN]
    texts = [
        f"{gib_text(r.peak_bytes)}, {r.peak_bytes / base:.2f}x forward"
        + (f", max batch {r.max_batch}" if r.max_batch is not None else "")
        for r in proof.results
    ]
    fig = go.Figure(
        go.Bar(
            x=[r.label for r in proof.results],
            y=[r.peak_bytes / GIB for r in proof.results],
            marker_color=colours[: len(proof.results)],
            text=texts,
            textposition="outside",
            name="peak memory",
        )
    )
    fig.add_hline(
        y=gpu.usable_gib,
        line=dict(color=AMBER, dash="dash"),
        annotation_text=f"usable on {gpu.name}: {gpu.usable_gib:.2f} GiB",
    )
    top = max([r.peak_bytes / GIB for r in proof.results] + [0.0])
    fig.update_layout(
        yaxis=dict(title="peak memory (GiB)", range=[0, max(top * 1.25, 0.01)]),
        height=440,
        showlegend=False,
        **titled(LAYOUT, "Peak by protocol", f"batch {proof.batch_size}, {proof.memory_source}"),
    )
    return fig
