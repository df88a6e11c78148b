"""Plotly figure of training throughput vs batch size, drawn next to the memory chart.

A pure function of measurements, no Streamlit. Owns how throughput looks: samples/s of each
probe that fitted and carries one, labelled estimated (FLOPs and bytes on the GPU's roofline,
in simulation) or measured (timed steps on the GPU); the current and optimal batches; the batches
that ran out of memory; and where larger batches stop paying off. Must not know how the numbers
were obtained.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from memorymark.gpus import GPU
from memorymark.measurement import Measurement
from memorymark.ui.charts import AMBER, GREEN, PAIR_LAYOUT, RED, WHITE, nice_ceiling, titled

SOURCE_WORDS = {
    "measured": "measured on the GPU",
    "estimated": "estimated from FLOPs and bytes",
}


def throughput_source(measurements: Sequence[Measurement]) -> str | None:
    """'measured', 'estimated', or None when no probe carries a throughput."""
    sources = {m.throughput_source for m in measurements} - {None}
    return "measured" if "measured" in sources else next(iter(sources), None)


def source_words(source: str | None) -> str:
    """How a throughput was obtained, in the words the chart and the cards use."""
    return SOURCE_WORDS.get(source or "", "not known for this backend")


def timed(measurements: Sequence[Measurement]) -> list[Measurement]:
    """The probes that ran (inside the margin too) and carry a throughput, by batch size."""
    return sorted(
        (m for m in measurements if m.runs and m.samples_per_second),
        key=lambda m: m.batch_size,
    )


def _how(points: list[Measurement], measurements: Sequence[Measurement]) -> str:
    """The title's account of where the samples/s came from, or why there are none."""
    if points:
        return source_words(throughput_source(points))
    if not measurements:
        return "waiting for the first probe"
    if any(m.runs for m in measurements):
        return source_words(None)
    return "no batch fitted, so none was timed"


def _marker(name: str, m: Measurement, colour: str, symbol: str, size: int) -> go.Scatter:
    return go.Scatter(
        x=[m.batch_size], y=[m.samples_per_second], mode="markers", name=name,
        marker=dict(color=colour, symbol=symbol, size=size, line=dict(width=1, color=WHITE)),
        hovertemplate="batch %{x}<br>%{y:,.1f} samples/s<extra>" + name + "</extra>",
    )  # fmt: skip


def _marks(fig: go.Figure, points: list[Measurement], current: int | None, optimal: int | None):
    by_batch = {m.batch_size: m for m in points}
    if current in by_batch:
        fig.add_trace(_marker(f"current (batch {current})", by_batch[current], RED, "diamond", 12))
    if optimal in by_batch:
        fig.add_trace(_marker(f"optimal (batch {optimal})", by_batch[optimal], GREEN, "star", 18))


def _oom_region(fig: go.Figure, measurements: Sequence[Measurement], x_range: list[float]) -> None:
    """Shade the batches from the first out-of-memory probe on."""
    first_oom = min((m.batch_size for m in measurements if not m.runs), default=None)
    if first_oom is not None and first_oom < x_range[1]:
        fig.add_vrect(
            x0=first_oom, x1=x_range[1], fillcolor=RED, opacity=0.12, line_width=0,
            annotation_text="out of memory", annotation_position="top left",
        )  # fmt: skip


def throughput_figure(
    measurements: Sequence[Measurement],
    gpu: GPU,
    *,
    x_range: list[float],
    current_batch: int | None = None,
    optimal_batch: int | None = None,
    knee_batch: int | None = None,
) -> go.Figure:
    """Samples/s vs batch size on the memory chart's batch axis.

    Batches from the first out-of-memory probe on are shaded red; `knee_batch` (where larger
    batches stop paying off, shown only when it lies below the optimal batch) gets a line.
    """
    points = timed(measurements)
    source = throughput_source(points)
    rates = [m.samples_per_second or 0.0 for m in points]
    fig = go.Figure(go.Scatter(
        x=[m.batch_size for m in points], y=rates, mode="lines+markers",
        name=f"samples/s ({source or 'n/a'})", line=dict(color=GREEN, width=2),
        marker=dict(color=GREEN, size=8), hovertemplate="batch %{x}<br>%{y:,.1f} samples/s",
    ))  # fmt: skip
    _marks(fig, points, current_batch, optimal_batch)
    _oom_region(fig, measurements, x_range)
    if knee_batch is not None and (optimal_batch is None or knee_batch < optimal_batch):
        fig.add_vline(
            x=knee_batch, line=dict(color=AMBER, dash="dot"),
            annotation_text=f"stops paying off at batch {knee_batch}",
            annotation_position="bottom right",
        )  # fmt: skip
    top = nice_ceiling(max(rates) * 1.2) if rates else 1.0
    fig.update_layout(
        xaxis=dict(title="batch size", range=x_range, autorange=False),
        yaxis=dict(title="samples per second", range=[0.0, top], autorange=False),
        uirevision="throughput", height=440,
        **titled(PAIR_LAYOUT, "Throughput vs batch size",
                 f"{gpu.name}: {_how(points, measurements)}"),
    )  # fmt: skip
    return fig
