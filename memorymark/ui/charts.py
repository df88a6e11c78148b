"""Plotly figures built from engine results: pure functions, no Streamlit, unit-testable.

Owns how a sweep, a report, a GPU comparison and a backward-pass proof look: traces, colours,
axis ranges, labels (every figure says whether its memory was measured or simulated). Must not
know where the numbers came from or how a page lays them out. Memory is plotted in GiB (2**30).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from memorymark.compare import GpuFit
from memorymark.gpus import GPU
from memorymark.measurement import CATEGORIES, Breakdown, Measurement
from memorymark.proof import BackwardProof
from memorymark.report import GIB, Report

GREEN = "#00ff88"
RED = "#ff4b4b"
AMBER = "#ffb000"
GREY = "#8a8f98"
WHITE = "#e8e8e8"
CATEGORY_COLOURS = {
    "parameters": "#4c9aff",
    "gradients": "#b388ff",
    "optimizer_state": AMBER,
    "activations": GREEN,
    "temporary": GREY,
}
# Before two batches have fitted there is no slope to extrapolate: show this many batches.
INITIAL_X_MAX = 64
LAYOUT = dict(
    margin=dict(l=10, r=10, t=50, b=10),
    legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0),
)


def source_label(memory_source: str) -> str:
    """How a memory figure was obtained, in the words every chart and card uses."""
    return "measured on the GPU" if memory_source == "measured" else "simulated (fake tensors)"


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is at least `value` (axis ends people read)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= value)


def affine_fit(measurements: Sequence[Measurement]) -> tuple[float, float] | None:
    """Least-squares (intercept_bytes, bytes_per_sample) through the fitting probes, if 2+ batches."""
    points = [(m.batch_size, m.peak_bytes) for m in measurements if m.fits]
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return mean_y - slope * mean_x, slope


def axis_ranges(
    measurements: Sequence[Measurement], gpu: GPU, max_batch: int
) -> tuple[list[float], list[float]]:
    """Batch and GiB ranges that stay put while probes land (Streamlit re-mounts every update).

    y runs to just above the GPU's total. x runs to where the line through the first two fitting
    probes (in the order tried) crosses the total, capped at max_batch: fixed once two batches
    have fitted, and widened only if a probe lands beyond it.
    """
    y_max = gpu.total_bytes / GIB * 1.08
    first_two = [m for m in measurements if m.fits][:2]
    fit = affine_fit(first_two)
    if fit is None or fit[1] <= 0:
        reach = float(INITIAL_X_MAX)
    else:
        reach = min((gpu.total_bytes - fit[0]) / fit[1], float(max_batch))
    widest = max((m.batch_size for m in measurements), default=0)
    x_max = nice_ceiling(max(reach, widest) * 1.05)
    return [0.0, x_max], [0.0, y_max]


def _hline(name: str, y_gib: float, x_range: list[float], colour: str, dash: str) -> go.Scatter:
    return go.Scatter(
        x=x_range, y=[y_gib, y_gib], mode="lines", name=name, hoverinfo="name",
        line=dict(color=colour, dash=dash, width=1.5),
    )  # fmt: skip


def _points(name: str, ms: list[Measurement], colour: str, symbol: str, size: int) -> go.Scatter:
    return go.Scatter(
        x=[m.batch_size for m in ms],
        y=[m.peak_bytes / GIB for m in ms],
        mode="markers",
        name=name,
        marker=dict(color=colour, symbol=symbol, size=size, line=dict(width=1, color=WHITE)),
        text=[m.error or f"{m.peak_bytes / GIB:.2f} GiB" for m in ms],
        hovertemplate="batch %{x}<br>%{text}<extra>" + name + "</extra>",
    )


def sweep_figure(
    measurements: Sequence[Measurement],
    gpu: GPU,
    *,
    memory_source: str,
    max_batch: int,
    optimal: Measurement | None = None,
) -> go.Figure:
    """Peak memory vs batch size: probes, OOMs (red), the fit, usable and total lines."""
    x_range, y_range = axis_ranges(measurements, gpu, max_batch)
    ordered = sorted(measurements, key=lambda m: m.batch_size)
    fig = go.Figure()
    fig.add_trace(_hline(f"usable ({gpu.usable_gib:.2f} GiB)", gpu.usable_gib, x_range, AMBER, "dash"))
    fig.add_trace(_hline(f"GPU total ({gpu.total_gib:.2f} GiB)", gpu.total_gib, x_range, GREY, "solid"))
    fit = affine_fit(ordered)
    if fit is not None:
        xs = [x_range[0], x_range[1]]
        fig.add_trace(go.Scatter(
            x=xs, y=[(fit[0] + fit[1] * x) / GIB for x in xs], mode="lines", name="fit",
            line=dict(color=GREEN, dash="dot", width=1), opacity=0.6,
            hovertemplate=f"fit: {fit[1] / 2**20:.1f} MiB per sample<extra></extra>",
        ))  # fmt: skip
    fig.add_trace(_points("fits", [m for m in ordered if m.fits], GREEN, "circle", 9))
    fig.add_trace(_points("OOM", [m for m in ordered if not m.fits], RED, "x", 11))
    if optimal is not None:
        fig.add_trace(_points(f"optimal (batch {optimal.batch_size})", [optimal], GREEN, "star", 18))
    fig.update_layout(
        title=f"Peak memory vs batch size on {gpu.name}: {source_label(memory_source)}",
        xaxis=dict(title="batch size", range=x_range, autorange=False),
        yaxis=dict(title="peak memory (GiB)", range=y_range, autorange=False),
        uirevision="sweep", height=420, **LAYOUT,
    )  # fmt: skip
    return fig


def capacity_bars(report: Report) -> go.Figure:
    """Current batch (red) vs optimal batch (green) as horizontal bars against usable memory."""
    usable = report.gpu.usable_gib
    labels, values, colours, texts = [], [], [], []
    current, optimal = report.current, report.optimal
    b = report.settings.current_batch
    if current is not None and current.fits:
        share = 100 * current.peak_bytes / report.gpu.usable_bytes
        labels.append(f"current (batch {b})")
        values.append(current.peak_bytes / GIB)
        texts.append(f"{current.peak_bytes / GIB:.2f} GiB, {share:.0f}% of usable")
    else:
        labels.append(f"current (batch {b})")
        values.append(usable)
        texts.append("out of memory")
    colours.append(RED)
    if optimal is not None:
        share = 100 * optimal.peak_bytes / report.gpu.usable_bytes
        labels.append(f"optimal (batch {optimal.batch_size})")
        values.append(optimal.peak_bytes / GIB)
        colours.append(GREEN)
        texts.append(f"{optimal.peak_bytes / GIB:.2f} GiB, {share:.0f}% of usable")
    fig = go.Figure(go.Bar(
        x=values, y=labels, orientation="h", marker_color=colours, text=texts,
        textposition="auto", name="peak memory",
    ))  # fmt: skip
    fig.add_vline(x=usable, line=dict(color=AMBER, dash="dash"),
                  annotation_text=f"usable {usable:.2f} GiB", annotation_position="top")
    fig.update_layout(
        title=f"Memory at current vs optimal batch ({report.memory_source})",
        xaxis=dict(title="peak memory (GiB)", range=[0, report.gpu.total_gib * 1.02]),
        yaxis=dict(autorange="reversed"), height=230, showlegend=False, **LAYOUT,
    )  # fmt: skip
    return fig


def breakdown_bar(breakdown: Breakdown, *, batch_size: int, memory_source: str) -> go.Figure:
    """One stacked bar: what the peak at `batch_size` is made of, by category."""
    fig = go.Figure()
    for name in CATEGORIES:
        value = getattr(breakdown, name) / GIB
        fig.add_trace(go.Bar(
            x=[value], y=[f"batch {batch_size}"], orientation="h", name=name.replace("_", " "),
            marker_color=CATEGORY_COLOURS[name],
            hovertemplate=f"{name.replace('_', ' ')}: {value:.3f} GiB<extra></extra>",
        ))  # fmt: skip
    fig.update_layout(
        barmode="stack", height=200,
        title=f"Memory breakdown at the optimal batch ({memory_source})",
        xaxis=dict(title="GiB at the peak"), **LAYOUT,
    )  # fmt: skip
    return fig


def compare_figure(rows: Sequence[GpuFit], *, chosen: str | None = None) -> go.Figure:
    """Max batch (simulated) and cost per training run (estimated) for every GPU."""
    names = [r.gpu.name for r in rows]
    colours = [GREEN if n == chosen else "#2e8b57" for n in names]
    fig = make_subplots(
        rows=1, cols=2,
        subplot_titles=("Max batch that trains (simulated)", "Cost per training run (estimated)"),
    )  # fmt: skip
    fig.add_trace(go.Bar(
        x=names, y=[r.max_batch or 0 for r in rows], name="max batch", marker_color=colours,
        text=[str(r.max_batch) if r.max_batch else "none" for r in rows], textposition="outside",
    ), row=1, col=1)  # fmt: skip
    fig.add_trace(go.Bar(
        x=names, y=[r.est_cost_per_run_usd for r in rows], name="$ per run (est.)",
        marker_color=AMBER, text=[f"${r.est_cost_per_run_usd:.2f}" for r in rows],
        textposition="outside",
    ), row=1, col=2)  # fmt: skip
    fig.update_layout(height=420, showlegend=False, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def proof_figure(proof: BackwardProof, gpu: GPU) -> go.Figure:
    """Peak of each protocol at one batch, with its ratio to forward-only and its max batch."""
    base = proof.peak("forward_only") or 1
    colours = [GREY, AMBER, "#2e8b57", GREEN]
    texts = [
        f"{r.peak_bytes / GIB:.2f} GiB, {r.peak_bytes / base:.2f}x forward"
        + (f", max batch {r.max_batch}" if r.max_batch is not None else "")
        for r in proof.results
    ]
    fig = go.Figure(go.Bar(
        x=[r.label for r in proof.results], y=[r.peak_bytes / GIB for r in proof.results],
        marker_color=colours[: len(proof.results)], text=texts, textposition="outside",
        name="peak memory",
    ))  # fmt: skip
    fig.add_hline(y=gpu.usable_gib, line=dict(color=AMBER, dash="dash"),
                  annotation_text=f"usable on {gpu.name}: {gpu.usable_gib:.2f} GiB")
    top = max([r.peak_bytes / GIB for r in proof.results] + [0.0])
    fig.update_layout(
        title=f"Peak at batch {proof.batch_size} by protocol ({proof.memory_source})",
        yaxis=dict(title="peak memory (GiB)", range=[0, max(top * 1.25, 0.01)]),
        height=440, showlegend=False, **LAYOUT,
    )  # fmt: skip
    return fig
