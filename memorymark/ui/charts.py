"""Plotly figures of one sweep and its report: pure functions, no Streamlit, unit-testable.

Owns how a sweep and a report look (traces, colours, fixed axis ranges, the least-squares fit,
labels: every figure says whether its memory was measured or simulated) and the colours the
other pages share. Must not know where the numbers came from or how a page lays them out.
Memory is plotted in GiB (2**30 bytes).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from memorymark.gpus import GPU
from memorymark.measurement import CATEGORIES, Breakdown, Measurement
from memorymark.report import Report
from memorymark.units import GIB, gib_text

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
    "logits": "#ff7a59",
    "temporary": GREY,
}
# Before two batches have fitted there is no slope to extrapolate: show this many batches.
INITIAL_X_MAX = 64
# Title on top, legend under the plot: a long legend above it would run into the title.
LAYOUT: dict[str, Any] = dict(
    margin=dict(l=10, r=10, t=40, b=10),
    legend=dict(orientation="h", yanchor="top", y=-0.22, x=0),
)
# The memory and throughput charts sit side by side: legends in two columns, and a bottom margin
# that holds the longer legend, so both plot areas (and their batch axes) line up.
PAIR_LAYOUT = dict(
    LAYOUT,
    margin=dict(LAYOUT["margin"], b=155),
    legend=dict(
        orientation="h", yref="container", yanchor="bottom", y=0, x=0,
        entrywidth=0.5, entrywidthmode="fraction",
    ),
)  # fmt: skip


TITLE_DETAIL_CHARS = 52
"""Characters per line of a title's small second line. Plotly never wraps a title, and a chart
in half of a 1024-pixel-wide page (sidebar open) holds about this many (seen in screenshots)."""


def titled(layout: dict[str, Any], headline: str, detail: str) -> dict[str, Any]:
    """`layout` with a title that fits a half-width chart: a short headline and, in small type
    below, the GPU and where the figures came from, wrapped by hand (a long one-line title was
    cut off at the chart's edge), and a top margin that holds every line."""
    lines = textwrap.wrap(detail, TITLE_DETAIL_CHARS)
    text = f"{headline}<br><sup>{'<br>'.join(lines)}</sup>"
    return dict(
        layout, title=dict(text=text), margin=dict(layout["margin"], t=44 + 16 * len(lines))
    )


def source_label(memory_source: str) -> str:
    """How a memory figure was obtained, in the words every chart and card uses."""
    return "measured on the GPU" if memory_source == "measured" else "simulated (fake tensors)"


def nice_ceiling(value: float) -> float:
    """The smallest round number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k) >= `value`."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * power >= value)


def affine_fit(measurements: Sequence[Measurement]) -> tuple[float, float] | None:
    """Least squares (intercept_bytes, bytes_per_sample) over the fitting probes (2+ batches)."""
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
        x=x_range,
        y=[y_gib, y_gib],
        mode="lines",
        name=name,
        hoverinfo="name",
        line=dict(color=colour, dash=dash, width=1.5),
    )


def _points(
    name: str,
    ms: list[Measurement],
    colour: str,
    symbol: str,
    size: int,
    ceiling_gib: float = math.inf,
) -> go.Scatter:
    # A simulated step past the capacity traced to its end; its peak may lie far above the axis,
    # so its marker sits at the top edge and the hover text says what it needs.
    return go.Scatter(
        x=[m.batch_size for m in ms],
        y=[min(m.peak_bytes / GIB, ceiling_gib) for m in ms],
        mode="markers",
        name=name,
        marker=dict(color=colour, symbol=symbol, size=size, line=dict(width=1, color=WHITE)),
        text=[m.error or gib_text(m.peak_bytes) for m in ms],
        hovertemplate="batch %{x}<br>%{text}<extra>" + name + "</extra>",
    )


def _capacity_lines(gpu: GPU, x_range: list[float], limit_bytes: int | None) -> list[go.Scatter]:
    lines = [
        _hline(f"usable ({gpu.usable_gib:.2f} GiB)", gpu.usable_gib, x_range, AMBER, "dash"),
        _hline(f"GPU total ({gpu.total_gib:.2f} GiB)", gpu.total_gib, x_range, GREY, "solid"),
    ]
    if limit_bytes is not None and limit_bytes < gpu.usable_bytes:
        limit = limit_bytes / GIB
        name = f"usable less margin ({limit:.2f} GiB)"
        lines.append(_hline(name, limit, x_range, AMBER, "dot"))
    return lines


def _fit_line(fit: tuple[float, float], x_range: list[float]) -> go.Scatter:
    intercept, slope = fit
    return go.Scatter(
        x=x_range, y=[(intercept + slope * x) / GIB for x in x_range], mode="lines", name="fit",
        line=dict(color=GREEN, dash="dot", width=1), opacity=0.6,
        hovertemplate=f"fit: {slope / 2**20:.1f} MiB per sample<extra></extra>",
    )  # fmt: skip


def sweep_figure(
    measurements: Sequence[Measurement],
    gpu: GPU,
    *,
    memory_source: str,
    max_batch: int,
    optimal: Measurement | None = None,
    limit_bytes: int | None = None,
) -> go.Figure:
    """Peak memory vs batch size: probes that fit, that run but are not recommended (amber:
    inside the margin, or only after a cache flush), or that ran out of memory (red, at what the
    step reached, or the top edge); the fit, usable and total lines.

    `limit_bytes` (usable less the safety margin: what the search works to) adds a third line
    when it lies below usable.
    """
    x_range, y_range = axis_ranges(measurements, gpu, max_batch)
    ordered = sorted(measurements, key=lambda m: m.batch_size)
    fig = go.Figure(_capacity_lines(gpu, x_range, limit_bytes))
    fit = affine_fit(ordered)
    if fit is not None:
        fig.add_trace(_fit_line(fit, x_range))
    fig.add_trace(_points("fits", [m for m in ordered if m.fits], GREEN, "circle", 9))
    inside = [m for m in ordered if m.runs and not m.fits]
    if inside:
        fig.add_trace(_points("runs, not recommended", inside, AMBER, "diamond", 10))
    ooms = [m for m in ordered if not m.runs]
    fig.add_trace(_points("OOM", ooms, RED, "x", 11, ceiling_gib=0.97 * y_range[1]))
    if optimal is not None:
        name = f"optimal (batch {optimal.batch_size})"
        fig.add_trace(_points(name, [optimal], GREEN, "star", 18))
    fig.update_layout(
        xaxis=dict(title="batch size", range=x_range, autorange=False),
        yaxis=dict(title="peak memory (GiB)", range=y_range, autorange=False),
        uirevision="sweep", height=440,
        **titled(PAIR_LAYOUT, "Peak memory vs batch size",
                 f"{gpu.name}: {source_label(memory_source)}"),
    )  # fmt: skip
    return fig


def _bar(label: str, m: Measurement | None, gpu: GPU) -> tuple[str, float, str]:
    """(label, GiB, text) of one capacity bar; a batch that ran out of memory fills usable.
    A bar is what the GPU holds for the step (reserved), the basis the fit policy judges against
    usable memory and the verdict's "uses N%" reads: one share per batch, not two."""
    if m is None or not m.runs:
        need = (
            "" if m is None or m.required_bytes is None else f": needs {gib_text(m.required_bytes)}"
        )
        return label, gpu.usable_gib, "out of memory" + need
    held = m.required_bytes if m.required_bytes is not None else m.peak_bytes
    share = 100 * held / gpu.usable_bytes
    return label, held / GIB, f"{gib_text(held)}, {share:.0f}%"


def capacity_bars(report: Report) -> go.Figure:
    """Current batch (red) vs optimal batch (green) as horizontal bars against usable memory."""
    gpu, optimal = report.gpu, report.optimal
    bars = [_bar(f"current (batch {report.settings.search.current_batch})", report.current, gpu)]
    if optimal is not None:
        bars.append(_bar(f"optimal (batch {optimal.batch_size})", optimal, gpu))
    labels, values, texts = (list(column) for column in zip(*bars, strict=True))
    fig = go.Figure(go.Bar(
        x=values, y=labels, orientation="h", marker_color=[RED, GREEN][: len(bars)], text=texts,
        textposition="auto", name="reserved memory",
    ))  # fmt: skip
    fig.add_vline(x=gpu.usable_gib, line=dict(color=AMBER, dash="dash"),
                  annotation_text=f"usable {gpu.usable_gib:.2f} GiB",
                  annotation_position="top left")  # fmt: skip
    fig.update_layout(
        xaxis=dict(title="GiB reserved", range=[0, gpu.total_gib * 1.02]),
        yaxis=dict(autorange="reversed"), height=280, showlegend=False,
        **titled(LAYOUT, "Current vs optimal batch",
                 f"reserved (what the GPU holds), % of usable; {report.memory_source}"),
    )  # fmt: skip
    return fig


def breakdown_bar(breakdown: Breakdown, *, batch_size: int, memory_source: str) -> go.Figure:
    """One stacked bar: what the peak at `batch_size` is made of, by category."""
    fig = go.Figure()
    for name in CATEGORIES:
        value = getattr(breakdown, name) / GIB
        fig.add_trace(
            go.Bar(
                x=[value],
                y=[f"batch {batch_size}"],
                orientation="h",
                name=name.replace("_", " "),
                marker_color=CATEGORY_COLOURS[name],
                hovertemplate=f"{name.replace('_', ' ')}: {value:.3f} GiB<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        height=280,
        **titled(LAYOUT, "What the peak is made of", f"GiB at batch {batch_size}, {memory_source}"),
    )
    return fig
