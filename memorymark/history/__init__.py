"""History: every finished analysis, in an embedded SQLite database, and read back.

Owns what a saved run holds, how runs are listed, reopened and deleted (`store`), the copy of a
`file:` run's config kept with it (`configs`), and where the file lives and how several
processes open it safely (`db_file`).

Must not know: torch, how a run was measured, or how it is shown (the CLI and the app render it).
"""

from memorymark.history.db_file import HistoryError
from memorymark.history.store import (
    History,
    HistoryWarning,
    RunSummary,
    SavedRun,
    save,
    saving_enabled,
)

__all__ = [
    "History",
    "HistoryError",
    "HistoryWarning",
    "RunSummary",
    "SavedRun",
    "save",
    "saving_enabled",
]
