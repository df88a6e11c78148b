"""Compare GPUs: one model and its settings across the whole GPU catalog, without a sweep per GPU.

A thin page: sidebar -> Settings -> `Session.compare` in a worker (cached) -> table and chart
(memorymark.ui).
"""

from __future__ import annotations

import streamlit as st

from memorymark.analyses.compare import without_precision
from memorymark.service.jobs import compare_gpus
from memorymark.settings import Costs
from memorymark.ui import compare_view, page_charts, page_runs, sidebar, tables, views
from memorymark.ui.compare_view import COLUMN_HELP

st.set_page_config(page_title="Compare GPUs · MemoryMark", layout="wide")
settings, costs = sidebar.settings_sidebar()
st.title("Compare GPUs")
st.caption(
    "The largest batch that trains on every catalog GPU, the same answer Analyze gives for "
    "it. Two traced batches per GPU architecture predict every GPU's boundary; each is then "
    "checked on that GPU: no sweep per GPU."
)
if settings is None:
    st.stop()

# Priced for a 1-hour run, then scaled: the hours slider never re-runs the probes.
key = ("compare", settings.replace(current_batch=1))
if page_runs.cached_result(key) is None and not st.button("Compare every GPU", type="primary"):
    st.info("Click **Compare every GPU** to simulate this model across the catalog.")
    st.stop()
found, error = page_runs.run_cached(
    key,
    compare_gpus,
    (Costs(hours_per_run=1.0),),
    settings=settings,
    spinner="Simulating every GPU from shared traces...",
)
if error is not None:
    views.show_error(error)
    st.stop()
rows, probes = found
rows = tables.rescale_hours(rows, costs.hours_per_run)
chosen = page_runs.gpu_for(settings).name
st.plotly_chart(
    page_charts.compare_figure(rows, chosen=chosen), key="compare_chart", width="stretch"
)
st.dataframe(
    compare_view.table(rows, settings),
    hide_index=True,
    width="stretch",
    height="content",
    column_config={name: st.column_config.Column(help=text) for name, text in COLUMN_HELP.items()},
)
note = compare_view.tf32_note(settings)
if note is not None:
    st.info(note)
st.caption(
    f"Memory simulated on fake tensors: {len(probes)} probes for {len(rows)} GPUs. Relative "
    "speed is estimated as Analyze estimates speedup (each operator's FLOPs and bytes on the "
    "GPU's roofline): samples/s at each GPU's max batch over samples/s at your current batch "
    f"on {chosen}. Your {costs.hours_per_run:g} h per run there, divided by it, gives hours "
    "and cost per run. Prices are catalog on-demand defaults."
)
left_out = without_precision(settings)
if left_out:
    names = ", ".join(g.name for g in left_out)
    st.caption(f"Left out: {names}, which have no bf16 (use 16-mixed to size them).")
