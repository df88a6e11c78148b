"""Longest sequence: the longest sequence that trains at the sidebar's current batch size.

A thin page: sidebar -> Settings -> `Session.stream_seq_len` in a worker (the same sweep and
strategies as Analyze, over sequence length; cached) -> each probe as it lands, then the answer
and a table.
"""

from __future__ import annotations

import streamlit as st

from memorymark import models
from memorymark.service.jobs import longest_sequence
from memorymark.ui import charts, page_runs, sidebar, tables, views
from memorymark.units import plural

st.set_page_config(page_title="Longest sequence · MemoryMark", layout="wide")
st.title("Longest sequence")
st.caption(
    "Long-context fine-tunes fix the batch (often 1) and ask how long a sequence trains. The "
    "same full training step as Analyze, searched over sequence length at your current batch "
    "size, in steps of the sidebar's sequence step (Advanced), up to the model's positions. "
    "Checkpointing, LoRA, bf16, FlashAttention-2 and Liger's kernels move it most."
)
# The title first: the sidebar may wait for a worker's first answer (app.py).
settings, _ = sidebar.settings_sidebar(costs=False, check_gpu=True)
if settings is None:
    st.stop()
if models.find_model(settings.workload.model).input_kind != "text":
    st.info("Choose a text model: image models have no sequence length.")
    st.stop()

settings = settings.replace(find="seq-len")
batch = settings.search.current_batch
key = ("seq-len", settings)
button = st.empty()  # gone while the search runs: a second click would start it over
if page_runs.cached_result(key) is None and not button.button(
    "Find the longest sequence", type="primary"
):
    st.info(f"Click **Find the longest sequence** to search at batch {batch}.")
    st.stop()
button.empty()
usable = page_runs.gpu_for(settings).usable_bytes


def describe(item: object) -> str:
    """A probe's line; the answer that ends the stream says so."""
    return tables.seq_len_line(item, usable) if isinstance(item, tuple) else "search finished"


answer, error = page_runs.run_streamed(
    key,
    longest_sequence,
    (),
    settings=settings,
    steps=["sequence lengths"],
    describe=describe,
    build=lambda items: items[-1],  # longest_sequence ends with the answer
    ends_with_result=True,
)
if error is not None:
    views.show_error(error)
    st.stop()
st.metric(
    f"Longest sequence at batch {batch} ({answer.memory_source})",
    "none" if answer.optimal_seq_len is None else f"{answer.optimal_seq_len:,} tokens",
)
st.info(answer.verdict())
st.dataframe(
    tables.seq_len_table(answer),
    hide_index=True,
    width="stretch",
    # The reason is a sentence ("needs a cache flush (allocation retry) at 19.43 GiB"): at the
    # default width it was cut to "needs a cache fl...".
    column_config={"Why not": st.column_config.TextColumn(width="large")},
)
st.caption(
    f"Memory {charts.source_label(answer.memory_source)} against {answer.gpu_name}; "
    f"{plural(len(answer.probes), 'probe')} in {answer.elapsed_seconds:.1f} s. CLI: "
    f"`{settings.to_command_line()}`"
)
