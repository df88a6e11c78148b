"""The history: every finished analysis, saved in an embedded SQLite database, and read back.

Owns what a saved run holds and how it is found: its settings (`Settings.to_dict`), costs, the
environment stamp (versions, backend, device, time), every probe as a row, the `analyze --json`
report, and the full record that reopens it as a `Report` without re-running anything
(memorymark/reporting/record.py), with a copy of a `file:` model's config (`configs`). The
CLI (`memorymark history ...`, and `analyze`, which saves each finished run unless `--no-save`)
and the app (its History page, and the main page, which saves each finished analysis) both come
through here. Where the file lives and how it is
opened safely by several processes at once is memorymark/history/db_file.py's job.

Imports no torch and no Streamlit. Saving can be turned off for a whole server or shell with
`MEMORYMARK_HISTORY=off`.

Example:

    >>> from memorymark.history import History
    >>> with History() as history:  # MEMORYMARK_DB, else the per-user default path
    ...     runs = history.runs(model="bert", limit=5)
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memorymark import gpus
from memorymark.environment import stamp as make_stamp
from memorymark.history import configs
from memorymark.history.db_file import (
    HistoryError,
    connect,
    connect_private,
    db_path,
    transaction,
)
from memorymark.report import Report
from memorymark.reporting.json_form import report_to_dict
from memorymark.reporting.record import record_to_report, report_to_record

__all__ = ["History", "HistoryError", "HistoryWarning", "SavedRun", "saving_enabled"]

SAVE_ENV = "MEMORYMARK_HISTORY"
"""Set to "off" (or 0, false, no) to save nothing: a hosted app shared by strangers."""

# Forward migrations, applied in order: a database at version N runs steps N+1, N+2, ... Never
# edit a released step; add one.
MIGRATIONS: list[tuple[str, ...]] = [
    (  # 1: runs, and one row per probe
        """CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            created_utc TEXT NOT NULL,
            source TEXT NOT NULL,
            model TEXT NOT NULL,
            gpu TEXT NOT NULL,
            backend TEXT NOT NULL,
            memory_source TEXT NOT NULL,
            precision TEXT NOT NULL,
            seq_len INTEGER NOT NULL,
            image_size INTEGER NOT NULL,
            current_batch INTEGER NOT NULL,
            optimal_batch INTEGER,
            max_batch INTEGER,
            optimal_peak_bytes INTEGER,
            probes INTEGER NOT NULL,
            elapsed_seconds REAL NOT NULL,
            command_line TEXT NOT NULL,
            settings_json TEXT NOT NULL,
            costs_json TEXT NOT NULL,
            environment_json TEXT NOT NULL,
            report_json TEXT NOT NULL,
            record_json TEXT NOT NULL
        )""",
        """CREATE TABLE probes (
            run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            plan_probe INTEGER NOT NULL,
            batch_size INTEGER NOT NULL,
            fits INTEGER NOT NULL,
            runs INTEGER NOT NULL,
            peak_bytes INTEGER NOT NULL,
            required_bytes INTEGER,
            samples_per_second REAL,
            measurement_json TEXT NOT NULL,
            PRIMARY KEY (run_id, position)
        )""",
        "CREATE INDEX runs_model ON runs (model COLLATE NOCASE)",
        "CREATE INDEX runs_gpu ON runs (gpu COLLATE NOCASE)",
    ),
]

_SUMMARY_COLUMNS = (
    "id", "created_utc", "source", "model", "gpu", "backend", "memory_source", "precision",
    "seq_len", "image_size", "current_batch", "optimal_batch", "max_batch",
    "optimal_peak_bytes", "probes", "elapsed_seconds", "command_line",
)  # fmt: skip


class HistoryWarning(UserWarning):
    """A damaged history file was moved aside (the default way a warning is given)."""


def saving_enabled() -> bool:
    """False when `MEMORYMARK_HISTORY` turns saving off for this process."""
    return os.environ.get(SAVE_ENV, "").strip().lower() not in ("off", "0", "false", "no")


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One saved run as the list shows it."""

    id: int
    created_utc: str
    source: str
    """cli, app or api: what saved it."""
    model: str
    gpu: str
    backend: str
    memory_source: str
    precision: str
    seq_len: int
    image_size: int
    current_batch: int
    optimal_batch: int | None
    max_batch: int | None
    optimal_peak_bytes: int | None
    probes: int
    elapsed_seconds: float
    command_line: str

    def to_dict(self) -> dict[str, Any]:
        """The row as `history list --json` prints it."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SavedRun:
    """One saved run in full."""

    summary: RunSummary
    settings: dict[str, Any]
    costs: dict[str, Any]
    environment: dict[str, Any]
    report_json: dict[str, Any]
    """The `analyze --json` object as it was when saved."""
    record: dict[str, Any]

    @property
    def id(self) -> int:
        return self.summary.id

    def report(self, config_folder: Path | None = None) -> Report:
        """The Report, rebuilt without a re-run (ValueError when it cannot be)."""
        return self.reopen(config_folder)[0]

    def reopen(self, config_folder: Path | None = None) -> tuple[Report, str]:
        """The Report, and a line when it reopened with the copy of its config kept with the
        run ("" otherwise): a `file:` run's config is written back under `config_folder` (a
        folder this process reads configs from) when the file is gone, changed or not readable
        here (memorymark/history/configs.py). ValueError, one line, when it cannot reopen."""
        record, note = configs.readable(self.record, config_folder)
        try:
            return record_to_report(record), note
        except ValueError as exc:
            if configs.RECORD_KEY in record or not self.summary.model.startswith("file:"):
                raise
            raise ValueError(
                f"{exc}; this run was saved before runs kept a copy of their config: put the "
                f"file back, or see it with `memorymark history show {self.id} --json`"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """`history show --json`: the summary, then what was saved with it."""
        return {
            **self.summary.to_dict(),
            "settings": self.settings,
            "costs": self.costs,
            "environment": self.environment,
            "report": self.report_json,
        }


def _warn(message: str) -> None:
    warnings.warn(message, HistoryWarning, stacklevel=4)


PRIVATE_RUNS_KEPT = 100
"""Runs a private (in-memory) history keeps, oldest dropped first: a hosted visitor's history
lives in the server's memory, and about 100 kB a run bounds it at about 10 MB."""


class History:
    """The history database at `path` (`MEMORYMARK_DB`, else the per-user default). Opened on
    first use; use it as a context manager, or `close()` it, so the file is left consistent.
    `warn` tells the user about a damaged file moved aside (a HistoryWarning by default).
    `History.of_this_session()` is one visitor's history on a hosted server, in memory."""

    def __init__(
        self, path: str | Path | None = None, *, warn: Callable[[str], None] | None = None
    ) -> None:
        self.path = Path(path) if path is not None else db_path()
        self._warn = warn or _warn
        self._conn: sqlite3.Connection | None = None
        self.private = False
        """True for an in-memory history: `close` keeps it (closing would delete every run),
        and messages name no file."""

    @classmethod
    def of_this_session(cls) -> History:
        """A history in this process's memory, for one visitor of a hosted server: no file, no
        path shown, no other visitor's runs; it lives as long as the object (keep it in the
        visitor's session) and keeps the newest PRIVATE_RUNS_KEPT runs."""
        history = cls(Path(":memory:"))
        history.private = True
        history._conn = connect_private(MIGRATIONS)
        return history

    @property
    def place(self) -> str:
        """Where the runs are, as messages say it: the file, or this session's history."""
        return "this session's history" if self.private else str(self.path)

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (every save is already committed); a private history stays
        open, since it has no file to come back from."""
        if self._conn is not None and not self.private:
            self._conn.close()
            self._conn = None

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = connect(self.path, MIGRATIONS, self._warn)
        return self._conn

    def save(
        self, report: Report, *, source: str = "api", data: dict[str, Any] | None = None
    ) -> int:
        """Save a finished analysis with every probe, in one transaction; returns its id.
        `data` is the report's `analyze --json` object when the caller has built it already.
        A training job's report is refused (HistoryError): its code is not in the history, and
        its settings say nothing of its model, so the run could not be shown or run again."""
        if report.training is not None:
            raise HistoryError(
                f"{report.training} is your own training code, which the history cannot keep "
                "or run again: keep its JSON instead (report_to_dict, or analyze --json)"
            )
        row = _run_row(report, source, data)
        probes = [(m, 0) for m in report.measurements] + [(m, 1) for m in report.plan_probes]
        conn = self.conn
        try:
            with transaction(conn):
                names = ", ".join(row)
                marks = ", ".join("?" for _ in row)
                cur = conn.execute(
                    f"INSERT INTO runs ({names}) VALUES ({marks})", list(row.values())
                )
                run_id = int(cur.lastrowid or 0)
                conn.executemany(
                    "INSERT INTO probes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (run_id, i, plan, m.batch_size, m.fits, bool(m.runs), m.peak_bytes,
                         m.required_bytes, m.samples_per_second, json.dumps(m.to_dict()))
                        for i, (m, plan) in enumerate(probes)
                    ],
                )  # fmt: skip
        except sqlite3.Error as exc:
            raise HistoryError(f"could not save to {self.place}: {exc}") from None
        if self.private:
            self._keep_newest(PRIVATE_RUNS_KEPT)
        return run_id

    def _keep_newest(self, kept: int) -> None:
        old = [r for (r,) in self._read("SELECT id FROM runs ORDER BY id DESC LIMIT -1 OFFSET ?",
                                         [kept])]  # fmt: skip
        if old:
            self.delete(old)

    def runs(
        self, *, model: str | None = None, gpu: str | None = None, limit: int | None = None
    ) -> list[RunSummary]:
        """Saved runs, newest first: `model` matches part of the model's name, `gpu` a GPU's
        name or catalog alias (case-insensitive)."""
        where: list[str] = []
        args: list[object] = []
        if model:
            where.append("model LIKE ? ESCAPE '\\' COLLATE NOCASE")
            args.append(
                "%" + model.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            )
        if gpu:
            try:
                gpu = gpus.find_gpu(gpu).name
            except ValueError:  # not a catalog name: a custom or detected GPU's name
                pass
            where.append("gpu = ? COLLATE NOCASE")
            args.append(gpu)
        sql = f"SELECT {', '.join(_SUMMARY_COLUMNS)} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [RunSummary(*row) for row in self._read(sql, args)]

    def get(self, run_id: int) -> SavedRun:
        """One saved run; HistoryError when there is none with this id."""
        columns = ", ".join(
            (*_SUMMARY_COLUMNS, "settings_json", "costs_json", "environment_json",
             "report_json", "record_json")
        )  # fmt: skip
        rows = self._read(f"SELECT {columns} FROM runs WHERE id = ?", [run_id])
        if not rows:
            raise HistoryError(
                f"no saved run {run_id} in {self.place} (see `memorymark history list`)"
            )
        row = rows[0]
        n = len(_SUMMARY_COLUMNS)
        return SavedRun(RunSummary(*row[:n]), *(json.loads(text) for text in row[n:]))

    def probes(self, run_id: int) -> list[dict[str, Any]]:
        """A run's probes in the order tried (the sweep's first, then the plan's checks), each as
        `measure --json` writes it."""
        rows = self._read(
            "SELECT measurement_json FROM probes WHERE run_id = ? ORDER BY position", [run_id]
        )
        return [json.loads(text) for (text,) in rows]

    def delete(self, run_ids: Iterable[int]) -> list[int]:
        """Delete these runs and their probes; returns the ids that existed."""
        ids = sorted(set(run_ids))
        conn = self.conn
        try:
            with transaction(conn):
                found = [
                    i
                    for i in ids
                    if conn.execute("SELECT 1 FROM runs WHERE id = ?", (i,)).fetchone()
                ]
                conn.executemany("DELETE FROM probes WHERE run_id = ?", [(i,) for i in found])
                conn.executemany("DELETE FROM runs WHERE id = ?", [(i,) for i in found])
        except sqlite3.Error as exc:
            raise HistoryError(f"could not delete from {self.place}: {exc}") from None
        return found

    def count(self) -> int:
        """How many runs are saved."""
        return int(self._read("SELECT count(*) FROM runs", [])[0][0])

    def _read(self, sql: str, args: list[Any]) -> list[tuple[Any, ...]]:
        try:
            return self.conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise HistoryError(f"could not read {self.place}: {exc}") from None


def _run_row(report: Report, source: str, data: dict[str, Any] | None) -> dict[str, Any]:
    """The `runs` row of a report: the columns lists and filters read, then the JSON saved."""
    env = report.stamp
    if env is None:  # built by hand, not by a Session: stamped as saved
        env = make_stamp(
            backend=report.backend, device=report.gpu.name, memory_source=report.memory_source
        )
        report = dataclasses.replace(report, stamp=env)
        data = None  # a dict built before the stamp lacks it
    s = report.settings
    optimal, maximum = report.optimal, report.max_fit
    return {
        "created_utc": env.finished_utc,
        "source": source,
        "model": s.workload.model,
        "gpu": report.gpu.name,
        "backend": report.backend,
        "memory_source": report.memory_source,
        "precision": s.workload.precision,
        "seq_len": s.workload.seq_len,
        "image_size": s.workload.image_size,
        "current_batch": s.search.current_batch,
        "optimal_batch": optimal.batch_size if optimal else None,
        "max_batch": maximum.batch_size if maximum else None,
        "optimal_peak_bytes": optimal.peak_bytes if optimal else None,
        "probes": len(report.measurements),
        "elapsed_seconds": report.elapsed_seconds,
        "command_line": s.to_command_line(),
        "settings_json": json.dumps(s.to_dict()),
        "costs_json": json.dumps(report.costs.to_dict()),
        "environment_json": json.dumps(env.to_dict()),
        "report_json": json.dumps(report_to_dict(report) if data is None else data),
        "record_json": json.dumps(_record(report)),
    }


def _record(report: Report) -> dict[str, Any]:
    """The record that reopens `report`, with a copy of a `file:` model's config."""
    record = report_to_record(report)
    copy = configs.copy_of(report.settings.workload.model)
    return record if copy is None else {**record, configs.RECORD_KEY: copy}


def save(
    report: Report,
    *,
    source: str = "api",
    warn: Callable[[str], None] | None = None,
    data: dict[str, Any] | None = None,
) -> int | None:
    """Save one finished analysis to the default history and close it again; None when
    `MEMORYMARK_HISTORY` turns saving off. `data`: as `History.save` takes it."""
    if not saving_enabled():
        return None
    with History(warn=warn) as history:
        return history.save(report, source=source, data=data)
