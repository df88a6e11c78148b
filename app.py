"""MemoryMark's main page: pick a model and a GPU, watch the sweep live, see waste and savings.

`streamlit run app.py` starts here. A thin page: sidebar widgets -> Settings/Costs (under the
server's ceilings) -> a sweep on the server's worker processes -> views; it also names the pages
in the navigation. Everything it draws comes from `memorymark.ui`; it never touches tensors or
torch.cuda.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from memorymark.ui import history_views, results, sidebar, sweep_runner, views
from memorymark.ui.literal import literal

# Found from this file, not from the entrypoint Streamlit ran: hosted/streamlit_app.py runs this
# file from another folder.
PAGES_DIR = Path(__file__).resolve().parent / "pages"


def analyze_page() -> None:
    """Settings in the sidebar, Analyze / Cancel, the live sweep, then the results."""
    # Drawn first: after a server start the sidebar waits for a worker to load torch (about
    # half a minute on 2 cores), and the title with the spinner below says the page is alive.
    st.title("MemoryMark")
    st.caption(
        "The largest batch size that really trains: a full training step (forward, loss, "
        "backward, optimizer) at increasing batch sizes, measured on this GPU or simulated "
        "for a catalog GPU."
    )
    sweep_runner.start_workers()  # warm while the user picks settings
    settings, costs = sidebar.settings_sidebar(check_gpu=True)
    requested = sidebar.analysis_requested()  # a fix applied with one click
    if settings is None:
        return
    if settings.search.find == "seq-len":
        st.info("Searching for the longest sequence: the Longest sequence page runs that search.")
        st.page_link(PAGES_DIR / "4_Longest_sequence.py", label="Longest sequence")
        return
    try:
        _, lowered = sweep_runner.within_server_limits(settings)  # runs under them; links don't
    except ValueError as exc:
        views.show_error(str(exc))
        return
    for note in lowered:
        st.caption(f"{literal(note)}: this server's ceiling is used.")
    job = sweep_runner.current_job()
    if requested and job is not None and job.running:
        job.cancel()  # a way out applied while the search still runs: that analysis runs now
    running = job is not None and job.running
    # Slots sized to their labels, in a row that wraps: fixed columns cut "Analyze" to "An..."
    # on a 1024-pixel-wide page.
    row = st.container(horizontal=True, vertical_alignment="center")
    analyze_col, cancel_col, save_col = (row.container(width="content") for _ in range(3))
    history_views.save_toggle(save_col)
    clicked = analyze_col.button("Analyze", type="primary", disabled=running, key="analyze")
    mine = job is not None and job.settings == settings
    # A new global batch for settings already swept re-plans from those measurements by itself.
    replan = not running and not mine and sweep_runner.can_replan(settings)
    replan = replan and sweep_runner.cached_report(settings) is None
    if (clicked or requested or replan) and not running:
        sweep_runner.start_sweep(settings)
        st.rerun()
    if cancel_col.button("Cancel", disabled=not running, key="cancel") and job is not None:
        job.cancel()  # the worker is killed now; the page shows it at once
        st.rerun()

    report = sweep_runner.cached_report(settings)
    if report is None and mine and job.state == "done":
        report = job.report  # a partial answer (a limit stopped it) is not cached
    if not running:
        history_views.save_finished(job, costs)  # once per finished sweep
    if running:
        if job.settings != settings:
            job.changed_while_running = True
            st.caption("Showing the sweep in progress: it runs the settings before your change.")
        views.live_sweep(job, costs)
    elif report is not None:
        views.finished_sweep(report, job)  # first: in the live panel's place (see views)
        if report.partial_note:
            st.warning(report.partial_note)
        results.results(report.with_costs(costs))
    elif job is not None and job.changed_while_running and job.report is not None:
        # The settings changed while this sweep ran: its result is still worth seeing.
        st.info(
            "These results are for the settings before your change; click **Analyze** to run "
            "the new ones."
        )
        views.finished_sweep(job.report, job)
        results.results(job.report.with_costs(costs))
    elif (
        job is not None
        and job.state in ("failed", "cancelled")
        and (mine or job.changed_while_running)
    ):
        views.live_sweep(job)  # the log of what was measured stays
        if job.state == "failed":
            views.show_error(job.error or "unknown error")
        else:
            st.warning("Sweep cancelled. Click Analyze to run it again.")
    else:
        st.info("Choose a model, a GPU and your current batch size in the sidebar, then click "
                "**Analyze**.")  # fmt: skip


st.set_page_config(page_title="MemoryMark", page_icon=":material/memory:", layout="wide")
PAGES = [
    st.Page(analyze_page, title="Analyze", icon=":material/memory:", default=True),
    st.Page(PAGES_DIR / "1_Compare_GPUs.py", title="Compare GPUs", icon=":material/compare:"),
    st.Page(PAGES_DIR / "2_Backward_pass_proof.py", title="Backward-pass proof",
            icon=":material/functions:"),
    st.Page(PAGES_DIR / "3_History.py", title="History", icon=":material/history:"),
    st.Page(PAGES_DIR / "4_Longest_sequence.py", title="Longest sequence",
            icon=":material/straighten:"),
    st.Page(PAGES_DIR / "5_Scale_out.py", title="Scale out", icon=":material/hub:"),
]  # fmt: skip
# Our own links, drawn by the first run: the built-in menu would first list pages/ by file name
# and, clicked in that first second, switch the session to that stale menu for good.
current = st.navigation(PAGES, position="hidden")
for page in PAGES:
    st.sidebar.page_link(page)
st.sidebar.divider()
current.run()
