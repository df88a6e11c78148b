"""Scale out: the sidebar's model on N GPUs for several N, per-rank memory, batch and cost.

A thin page: sidebar -> Settings (with a distributed strategy) -> `Session.scale_out` in a
worker (one sweep per count, streamed, cached) -> figure and table (memorymark.ui.scale_out_view);
then the parallel layouts of one count (`Session.layouts`, FSDP x TP x PP), best first.
"""

from __future__ import annotations

import streamlit as st

from memorymark.service.jobs import layouts, scale_out
from memorymark.ui import page_runs, scale_out_view, sidebar, views
from memorymark.units import plural

st.set_page_config(page_title="Scale out · MemoryMark", layout="wide")
st.title("Scale out")
st.caption(
    "The same training step on N GPUs of the kind chosen, simulated for rank 0 with PyTorch's "
    "own DDP, ZeroRedundancyOptimizer or FSDP2 on a fake process group: per-rank memory and "
    "the largest per-GPU batch against N, the smallest N that trains, and the cost of a run."
)
# The title first: the sidebar may wait for a worker's first answer (app.py).
settings, costs = sidebar.settings_sidebar(check_gpu=True)
if settings is None:
    st.stop()
if settings.hardware.dist == "none":
    st.info("Pick a distributed strategy under **Many GPUs** in the sidebar (fsdp, ddp, ...).")
    st.stop()
with st.expander("Parallel layouts of one GPU count (FSDP x tensor x pipeline)"):
    layout_gpus = st.selectbox(
        "GPUs", scale_out_view.COUNT_CHOICES, index=scale_out_view.COUNT_CHOICES.index(64),
        help="The layouts of this many GPUs: data parallel over what TP and PP leave",
        key="layout_gpus",
    )  # fmt: skip
    layout_base = settings.replace(gpus=str(layout_gpus), nodes=None, tp=1, cp=1, pp=1)
    layout_key = ("layouts", layout_base, costs.usd_per_hour)
    if page_runs.cached_result(layout_key) is not None or st.button("Search layouts"):
        search, layout_error = page_runs.run_cached(
            layout_key, layouts, (costs, 1e6), settings=layout_base,
            spinner="Sweeping each layout that fits (memory simulated)...",
        )  # fmt: skip
        if layout_error is not None:
            views.show_error(layout_error)
        elif search is not None:
            st.write(scale_out_view.layout_summary(search))
            st.dataframe(scale_out_view.layout_table(search), hide_index=True, width="stretch")
            st.caption(
                "Memory simulated; time estimated: compute from the step's FLOPs over (1 - the "
                "pipeline bubble), plus tensor-parallel all-reduces and pipeline sends, with "
                "FSDP's traffic overlapping. Layouts the engine does not simulate yet are "
                "listed as refused. `memorymark layouts` prints the same table."
            )
counts = st.multiselect(
    "GPU counts", scale_out_view.COUNT_CHOICES, default=scale_out_view.DEFAULT_COUNTS
)
samples = st.number_input(
    "Samples per training run", min_value=1, value=1_000_000, step=100_000,
    help="A run is this many samples; its time and cost are estimated at each count's batch",
)  # fmt: skip
if not counts:
    st.stop()
counts = tuple(sorted(counts))
base = settings.replace(gpus="1", nodes=None, current_batch=1)
key = ("scale_out", base, counts, samples, costs.usd_per_hour)
if page_runs.cached_result(key) is None and not st.button("Scale out", type="primary"):
    st.info(f"Click **Scale out** to sweep {len(counts)} GPU counts (one sweep each).")
    st.stop()
rows, error = page_runs.run_streamed(
    key,
    scale_out,
    (counts, costs, float(samples)),
    settings=base,
    steps=[plural(n, "GPU") for n in counts],
    describe=lambda r: f"{plural(r.gpus, 'GPU')}: per-GPU batch {r.per_gpu_batch or 'none'}",
    build=list,
)
if error is not None:
    views.show_error(error)
    st.stop()
smallest = scale_out_view.smallest(rows)
st.metric(
    "Smallest count that trains (of those swept, simulated)",
    "none" if smallest is None else plural(smallest, "GPU"),
)
st.plotly_chart(scale_out_view.figure(rows), key="scale_out_chart", width="stretch")
st.dataframe(scale_out_view.table(rows), hide_index=True, width="stretch")
st.caption(
    "Memory simulated on fake tensors (rank 0 stands for every rank; FSDP2 pads shards "
    "evenly). NCCL's buffers are an estimate. Time is estimated: compute from the step's FLOPs "
    "and bytes on the GPU's roofline, communication from the bytes the strategy moves per step "
    "over the catalog's NVLink/PCIe and network bandwidths, overlapping with compute. Cost = "
    "GPUs x price per GPU-hour x hours for the run. `--gpus auto` in the CLI searches every "
    "count a cluster offers for the smallest."
)
