"""Backward-pass proof: why inference-style numbers crash real training, on one batch size.

A thin page: sidebar -> Settings -> `Session.proof` in a worker (streamed, cached) -> chart and
table from memorymark.ui.
"""

from __future__ import annotations

import streamlit as st

from memorymark.analyses.proof import EXPECTED, PROOF_STEPS, BackwardProof
from memorymark.service.jobs import backward_proof
from memorymark.ui import charts, page_charts, page_runs, sidebar, tables, views

st.set_page_config(page_title="Backward-pass proof · MemoryMark", layout="wide")
settings, _ = sidebar.settings_sidebar(costs=False)
st.title("Backward-pass proof")
st.caption(
    "Four steps at your current batch size: forward only, forward + backward with no "
    "optimizer (what simpler tools measure), the full step in eval mode, and the full "
    "training step. Each bar says the largest batch that protocol would recommend."
)
if settings is None:
    st.stop()

batch = settings.search.current_batch
key = ("proof", settings, batch)
button = st.empty()  # gone while the proof runs: a second click would start it over
if page_runs.cached_result(key) is None and not button.button("Run the proof", type="primary"):
    st.info(
        f"Click **Run the proof** to measure the four protocols at batch {batch} "
        "(the sidebar's current batch size), and sweep each one for its max batch."
    )
    st.stop()
button.empty()
proof, error = page_runs.run_streamed(
    key,
    backward_proof,
    (batch,),
    settings=settings,
    steps=[label for _, label, _ in PROOF_STEPS],
    describe=lambda r: tables.protocol_line(r, batch),
    build=lambda results: BackwardProof(batch_size=batch, results=tuple(results)),
)
if error is not None:
    views.show_error(error)
    st.stop()
st.metric(
    f"Forward+backward / forward-only ({proof.memory_source})",
    f"{proof.ratio:.2f}x",
    delta=f"{proof.verdict}: {EXPECTED}",
    delta_color="normal" if proof.verdict == "PASS" else "inverse",
    delta_arrow="off",
)
if proof.verdict != "PASS":  # why the ratio is off, and what to try
    st.warning(f"{proof.verdict}: {proof.verdict_note}.")
gpu = page_runs.gpu_for(settings)
st.plotly_chart(page_charts.proof_figure(proof, gpu), key="proof_chart", width="stretch")
st.dataframe(tables.proof_table(proof), hide_index=True, width="stretch")
st.info(tables.proof_summary(proof))
st.caption(f"Memory {charts.source_label(proof.memory_source)}; max batches against {gpu.name}.")
