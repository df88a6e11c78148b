"""The app's side of the history: saving each finished analysis, and what the History page shows.

Owns when the main page saves (once per finished sweep, unless the user or the server turned
saving off), which history a session sees (on a hosted server, `MEMORYMARK_HOSTED`, each browser
session has its own, in memory: no visitor sees another's runs or a path on the server), the run
table's columns (each memory figure says measured or simulated), the labels runs are picked by,
and reopening saved runs as Reports (a `file:` run's saved config written where this app reads
configs). Reading and writing the database is memorymark/history/store.py's; drawing a reopened
report is `views` and `results`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import streamlit as st

from memorymark import history
from memorymark.history import History, HistoryError, RunSummary
from memorymark.models import sources
from memorymark.report import Report
from memorymark.settings import Costs
from memorymark.ui import sweep_runner
from memorymark.ui.literal import literal
from memorymark.ui.sweep_runner import SweepJob
from memorymark.units import gib

SAVE_KEY = "mm_save_history"
"""Whether this session saves its analyses: not a widget's key, so it survives a visit to a
page without the checkbox (Streamlit forgets a widget's state on a page that does not draw it)."""
SAVE_BOX_KEY = "mm_save_history_box"
"""The main page's "Save to history" checkbox."""
SAVED_KEY = "mm_saved_job"
"""The last job this session saved: each finished sweep is saved once, not on every rerun."""
PRIVATE_KEY = "mm_private_history"
"""A hosted visitor's own history (History.of_this_session), gone with the session."""


def enabled() -> bool:
    """False when the server turned saving off (`MEMORYMARK_HISTORY=off`)."""
    return history.saving_enabled()


def save_toggle(container: Any) -> None:
    """The checkbox that lets a user keep this session's analyses out of the history."""
    if enabled():
        container.checkbox(
            "Save to history", value=st.session_state.get(SAVE_KEY, True), key=SAVE_BOX_KEY,
            on_change=_remember_choice,
            help="Save each finished analysis (settings, costs, probes, report, versions) to "
            "the History page and `memorymark history`.",
        )  # fmt: skip


def _remember_choice() -> None:
    st.session_state[SAVE_KEY] = st.session_state[SAVE_BOX_KEY]


def save_finished(job: SweepJob | None, costs: Costs) -> int | None:
    """Save the session's finished sweep once, priced with `costs`; its run id, else None."""
    if job is None or job.report is None or job.state != "done":
        return None
    if st.session_state.get(SAVED_KEY) is job:
        return None
    st.session_state[SAVED_KEY] = job
    if not enabled() or not st.session_state.get(SAVE_KEY, True):
        return None
    try:
        with open_history() as db:
            run_id = db.save(job.report.with_costs(costs), source="app")
    except HistoryError as exc:
        st.warning(f"This analysis was not saved to the history: {literal(exc)}")
        return None
    st.toast(f"Saved as run {run_id}: see the History page")
    return run_id


def _warn(message: str) -> None:
    st.warning(literal(message))


def private() -> bool:
    """True on a hosted server: each browser session keeps a history of its own."""
    return sweep_runner.server_config().hosted


def open_history() -> History:
    """This session's history: on a hosted server its own, in memory; else the database every
    run of this user goes to, warning on the page if a damaged file had to be moved aside."""
    if not private():
        return History(warn=_warn)
    if PRIVATE_KEY not in st.session_state:
        st.session_state[PRIVATE_KEY] = History.of_this_session()
    return st.session_state[PRIVATE_KEY]


def label(run: RunSummary) -> str:
    """How a run is named in pickers and legends: `#3 bert on A10, 2026-01-02 03:04`."""
    when = run.created_utc.replace("T", " ")[:16]
    return f"#{run.id} {run.model} on {run.gpu}, {when}"


def run_rows(runs: Sequence[RunSummary]) -> list[dict[str, Any]]:
    """The run table: one row per saved run, newest first."""
    return [
        {
            "ID": r.id,
            "Finished (UTC)": r.created_utc.replace("T", " ").rstrip("Z"),
            "Model": r.model,
            "GPU": r.gpu,
            "Memory": r.memory_source,
            "Precision": r.precision,
            "Seq len": r.seq_len,
            "Current batch": r.current_batch,
            "Optimal batch": r.optimal_batch,
            "Max batch": r.max_batch,
            "Peak at optimal (GiB)": None
            if r.optimal_peak_bytes is None
            else gib(r.optimal_peak_bytes),
            "Probes": r.probes,
            "Saved by": r.source,
        }
        for r in runs
    ]


def reopen(
    history_db: History, run_ids: Sequence[int]
) -> tuple[dict[int, Report], list[str], list[str]]:
    """The saved Reports of `run_ids` (no re-run), one line for each that cannot reopen, and
    one for each that reopened with the copy of its config saved with it: this app reads config
    files only from its upload folder, so a CLI `--config-file` run's copy is written there."""
    reports, errors, notes = {}, [], []
    for run_id in run_ids:
        try:
            reports[run_id], note = history_db.get(run_id).reopen(sources.UPLOAD_DIR)
        except (HistoryError, ValueError) as exc:
            errors.append(f"run {run_id}: {exc}")
            continue
        if note and private():  # a hosted server names no path of its own
            note = "its config file is gone: it reopened with the copy saved with it"
        if note:
            notes.append(f"Run {run_id}: {note}")
    return reports, errors, notes
