"""History: every finished analysis the app and the CLI saved, reopened without a re-run.

A thin page: the history database -> filters and a run table -> one run reopened with the main
page's charts and results, or several runs' memory curves overlaid -> delete. Everything it
draws comes from memorymark.ui; it runs nothing.
"""

from __future__ import annotations

import streamlit as st

from memorymark.history import HistoryError
from memorymark.ui import history_charts, history_views, results, sidebar, views
from memorymark.ui.literal import literal

PICK_KEY = "mm_history_pick"

st.set_page_config(page_title="History · MemoryMark", layout="wide")
sidebar.keep_settings()
st.title("History")
if history_views.private():
    st.caption(
        "Your finished analyses in this browser session: kept in this server's memory until "
        "you close the tab, and seen by no other visitor. Reopen one without re-running it, "
        "overlay several runs' memory curves, or delete runs."
    )
else:
    st.caption(
        "Every finished analysis, saved by the app and by `memorymark analyze` (`memorymark "
        "history` lists the same runs). Reopen one without re-running it, overlay several "
        "runs' memory curves, or delete runs."
    )
if not history_views.enabled():
    st.info("The history is turned off on this server (MEMORYMARK_HISTORY=off).")
    st.stop()

with history_views.open_history() as db:
    try:
        runs = db.runs()
    except HistoryError as exc:
        st.error(f"The history cannot be read: {literal(exc)}")
        st.stop()
    if not db.private:  # a hosted server shows no path of its own
        st.caption(f"Database: {literal(db.path)}")
    if not runs:
        # A hosted visitor has no command line: the main page is their only way in.
        cli = "" if db.private else ", or run `memorymark analyze`"
        st.info(f"No saved analyses yet: click **Analyze** on the main page{cli}.")
        st.stop()

    model_col, gpu_col = st.columns(2)
    models = model_col.multiselect("Model", sorted({r.model for r in runs}), key="mm_history_model")
    gpus = gpu_col.multiselect("GPU", sorted({r.gpu for r in runs}), key="mm_history_gpu")
    shown = [r for r in runs if (not models or r.model in models) and (not gpus or r.gpu in gpus)]
    st.dataframe(history_views.run_rows(shown), hide_index=True, width="stretch")
    labels = {r.id: history_views.label(r) for r in shown}
    picked = st.multiselect(
        "Runs to reopen (one) or overlay (two or more)",
        list(labels),
        format_func=labels.__getitem__,
        key=PICK_KEY,
    )
    if not picked:
        st.info("Pick a run to reopen it with its charts, or several to overlay their memory.")
        st.stop()
    with st.popover(f"Delete {len(picked)} selected run{'s' if len(picked) > 1 else ''}"):
        st.caption("Deleted runs and their probes cannot be brought back.")
        if st.button("Delete for good", type="primary", key="mm_history_delete"):
            db.delete(picked)
            st.session_state.pop(PICK_KEY, None)
            st.rerun()
    reports, errors, notes = history_views.reopen(db, picked)

for error in errors:
    st.warning(f"Cannot reopen {literal(error)}")
for note in notes:
    st.info(literal(note))
if len(reports) >= 2:
    overlay = [
        (f"#{run_id} {report.settings.workload.model} on {report.gpu.name}", report)
        for run_id, report in reports.items()
    ]
    fig = history_charts.overlay_figure(overlay)
    st.plotly_chart(fig, key="history_overlay", width="stretch")
if reports:
    choices = list(reports)
    opened = choices[0]
    if len(choices) > 1:
        opened = st.selectbox("Open run", choices, format_func=labels.__getitem__)
    report = reports[opened]
    st.subheader(literal(labels[opened]))
    saved = report.stamp.finished_utc if report.stamp else None
    views.finished_sweep(report, None, saved_utc=saved)
    results.results(report)
