"""The History page's figure: several saved runs' memory curves on one chart. Pure, no Streamlit.

Owns how saved runs are overlaid: one colour per run, its probes that ran joined by a line, its
out-of-memory probes as crosses at the top of the chart, and its usable memory as a dashed line
of the same colour (runs on different GPUs have different ceilings). Every trace names its run
and says whether its memory was measured or simulated. Must not know where the runs came from.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.colors import qualitative

from memorymark.report import Report
from memorymark.ui.charts import LAYOUT
from memorymark.units import GIB, gib_text

COLOURS = qualitative.Plotly


def overlay_figure(runs: Sequence[tuple[str, Report]]) -> go.Figure:
    """Peak memory vs batch size of each (label, report), overlaid."""
    fig = go.Figure()
    top = max(r.gpu.total_bytes for _, r in runs) / GIB * 1.08
    widest = max((m.batch_size for _, r in runs for m in r.measurements), default=1)
    for i, (label, report) in enumerate(runs):
        colour = COLOURS[i % len(COLOURS)]
        name = f"{label} ({report.memory_source})"
        ran = sorted((m for m in report.measurements if m.runs), key=lambda m: m.batch_size)
        fig.add_trace(go.Scatter(
            x=[m.batch_size for m in ran], y=[m.peak_bytes / GIB for m in ran],
            mode="lines+markers", name=name, legendgroup=name, line=dict(color=colour),
            text=[gib_text(m.peak_bytes) for m in ran],
            hovertemplate="batch %{x}: %{text}<extra>" + label + "</extra>",
        ))  # fmt: skip
        ooms = sorted((m for m in report.measurements if not m.runs), key=lambda m: m.batch_size)
        if ooms:
            fig.add_trace(go.Scatter(
                x=[m.batch_size for m in ooms], y=[0.97 * top] * len(ooms), mode="markers",
                name=f"{label}: out of memory", legendgroup=name,
                marker=dict(color=colour, symbol="x", size=11),
                hovertemplate="batch %{x}: out of memory<extra>" + label + "</extra>",
            ))  # fmt: skip
        usable = report.gpu.usable_bytes / GIB
        fig.add_trace(go.Scatter(
            x=[0, widest * 1.05], y=[usable, usable], mode="lines",
            name=f"{label}: usable ({usable:.2f} GiB)", legendgroup=name,
            line=dict(color=colour, dash="dash", width=1), hoverinfo="name",
        ))  # fmt: skip
    fig.update_layout(
        title=f"Peak memory vs batch size: {len(runs)} saved runs",
        xaxis=dict(title="batch size", rangemode="tozero"),
        yaxis=dict(title="peak memory (GiB)", range=[0, top]),
        height=460, **LAYOUT,
    )  # fmt: skip
    return fig
