"""The history database: saving, finding and reopening runs, several writers at once, a damaged
file moved aside, and the schema's forward migrations. No torch: reports are built by hand."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import sqlite3
import threading
from pathlib import Path

import pytest
from app_samples import probe, sample_report

from memorymark import gpus, history
from memorymark.environment import Stamp, stamp
from memorymark.history import History, HistoryError, HistoryWarning, db_file, store
from memorymark.measurement import DepthReplay
from memorymark.reporting.json_form import report_to_dict
from memorymark.reporting.record import record_to_report, report_to_record
from memorymark.search.plan import TrainingPlan
from memorymark.settings import Costs, Settings
from memorymark.ways_out import Fix

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)


def stamped(report, when: str = "2026-01-02T03:04:05Z"):
    return dataclasses.replace(
        report,
        stamp=stamp(backend="sim", device="A10", memory_source="simulated", finished_utc=when),
    )


def test_a_saved_run_reopens_as_the_same_report(history_db: Path) -> None:
    report = stamped(sample_report())
    report = dataclasses.replace(
        report,
        plan=TrainingPlan(micro_batch=192, accumulation_steps=1, target_batch=None),
        plan_probes=(probe(96),),
        costs=Costs(usd_per_hour=2.5),
    )
    with History() as h:
        run_id = h.save(report, source="cli")
        saved = h.get(run_id)
        assert h.path == history_db
        probes = h.probes(run_id)
    assert report_to_dict(saved.report()) == report_to_dict(report)
    assert saved.report_json == json.loads(json.dumps(report_to_dict(report)))
    assert saved.settings == report.settings.to_dict()
    assert saved.costs["usd_per_hour"] == 2.5
    assert saved.environment["finished_utc"] == "2026-01-02T03:04:05Z"
    assert saved.environment["python_version"]
    s = saved.summary
    assert (s.model, s.gpu, s.source, s.optimal_batch, s.max_batch, s.probes) == (
        "tiny-bert", "A10", "cli", 192, 192, 4,
    )  # fmt: skip
    assert s.command_line == report.settings.to_command_line()
    # Every probe is a row, the plan's check last.
    assert [p["batch_size"] for p in probes] == [8, 16, 192, 200, 96]


def test_a_record_keeps_fixes_and_a_custom_gpu() -> None:
    gpu = gpus.custom_gpu(6.0)
    fix = Fix(
        label="bf16 weights",
        settings=Settings(model="tiny-bert", precision="bf16-true"),
        gpu=gpu,
        peak_bytes=10,
        required_bytes=20,
        limit_bytes=30,
        lower_bound=True,
    )
    report = dataclasses.replace(
        sample_report(batches=(8,)), gpu=gpu, fixes=(fix,), batch_1_required_bytes=123
    )
    back = record_to_report(json.loads(json.dumps(report_to_record(report))))
    assert back.gpu == gpu
    assert back.fixes == (fix,)
    assert report_to_dict(back) == report_to_dict(report)
    # A record saved before the fix's limit took the fit policy's name still reopens.
    older = report_to_record(report)
    older["fixes"][0]["capacity_bytes"] = older["fixes"][0].pop("limit_bytes")
    assert record_to_report(older).fixes == (fix,)


def test_a_record_keeps_how_the_depth_was_had_and_an_older_one_has_none() -> None:
    depth = DepthReplay(layers=80, traced_depths=(2, 3, 4, 5), traced_steps=14, replayed_steps=6)
    report = dataclasses.replace(sample_report(), depth_replay=depth)
    record = json.loads(json.dumps(report_to_record(report)))
    assert record_to_report(record).depth_replay == depth
    del record["depth_replay"]  # saved before issue 31
    assert record_to_report(record).depth_replay is None


def test_a_record_that_cannot_be_read_back_is_one_value_error() -> None:
    with pytest.raises(ValueError, match="cannot be read back"):
        record_to_report({"settings": {}})


def test_list_filters_by_model_and_gpu_newest_first() -> None:
    with History() as h:
        a = h.save(sample_report())
        b = h.save(dataclasses.replace(sample_report(), settings=Settings(model="tiny-gpt2")))
        t4 = dataclasses.replace(sample_report(), gpu=gpus.find_gpu("T4"))
        c = h.save(t4)
        assert [r.id for r in h.runs()] == [c, b, a]
        assert [r.id for r in h.runs(model="BERT")] == [c, a]
        assert [r.id for r in h.runs(gpu="a10")] == [b, a]
        assert [r.id for r in h.runs(gpu="t4", model="bert")] == [c]
        assert [r.id for r in h.runs(limit=1)] == [c]
        assert h.runs(model="%") == []  # a LIKE wildcard is matched as itself


def test_delete_removes_runs_and_their_probes() -> None:
    with History() as h:
        a, b = h.save(sample_report()), h.save(sample_report())
        assert h.delete([a, 999]) == [a]
        assert [r.id for r in h.runs()] == [b]
        assert h.probes(a) == []
        with pytest.raises(HistoryError, match=f"no saved run {a}"):
            h.get(a)


def test_saving_can_be_turned_off_for_a_whole_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORYMARK_HISTORY", "off")
    assert history.save(sample_report()) is None
    monkeypatch.delenv("MEMORYMARK_HISTORY")
    assert history.save(sample_report()) == 1


def test_the_default_path_is_per_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MEMORYMARK_DB")
    monkeypatch.setattr(db_file.sys, "platform", "linux")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert db_file.db_path() == tmp_path / "memorymark" / "history.sqlite3"
    monkeypatch.delenv("XDG_DATA_HOME")
    expected = Path.home() / ".local" / "share" / "memorymark" / "history.sqlite3"
    assert db_file.db_path() == expected
    monkeypatch.setattr(db_file.sys, "platform", "darwin")
    assert "Application Support" in str(db_file.default_path())
    monkeypatch.setenv("MEMORYMARK_DB", str(tmp_path / "x.db"))
    assert db_file.db_path() == tmp_path / "x.db"


def test_the_database_uses_wal_and_a_busy_timeout(history_db: Path) -> None:
    with History() as h:
        h.save(sample_report())
        assert h.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert h.conn.execute("PRAGMA busy_timeout").fetchone()[0] == db_file.BUSY_TIMEOUT_MS
        assert h.conn.execute("PRAGMA user_version").fetchone()[0] == len(store.MIGRATIONS)


# -- a damaged file ---------------------------------------------------------------------------
def test_a_corrupt_file_is_moved_aside_with_one_warning(history_db: Path) -> None:
    garbage = b"this is not a database, it is a shopping list\n" * 100
    history_db.write_bytes(garbage)
    with pytest.warns(HistoryWarning, match="moved it to history.sqlite3.corrupt-") as caught:
        with History() as h:
            run_id = h.save(sample_report())
            assert [r.id for r in h.runs()] == [run_id]
    assert len(caught) == 1
    aside = list(history_db.parent.glob("history.sqlite3.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == garbage  # kept, byte for byte


def test_a_damaged_page_is_found_and_moved_aside(history_db: Path) -> None:
    with History() as h:
        for _ in range(20):
            h.save(sample_report())
    with sqlite3.connect(history_db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(history_db.read_bytes())
    page = 4096
    data[2 * page : 4 * page] = b"\xff" * (2 * page)  # two pages of the tables overwritten
    history_db.write_bytes(bytes(data))
    db_file._CHECKED.clear()  # a new process: it checks the file once
    messages: list[str] = []
    with History(warn=messages.append) as h:
        assert h.count() == 0
    assert len(messages) == 1 and "could not be read" in messages[0]
    aside = sorted(p.name.rsplit("Z", 1)[1] for p in history_db.parent.glob("*.corrupt-*"))
    assert aside == ["", "-shm", "-wal"]  # its WAL files go with it


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_moved_aside(history_db: Path) -> None:
    history.save(sample_report())
    history_db.chmod(0)
    db_file._CHECKED.clear()
    messages: list[str] = []
    with History(warn=messages.append) as h:
        assert h.count() == 0
    assert "no permission" in messages[0]


def test_a_folder_or_another_program_s_database_is_refused_not_moved(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="not a regular file"):
        History(tmp_path).count()
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE invoices (n)")
    with pytest.raises(HistoryError, match="not a MemoryMark history"):
        History(other).count()
    assert other.exists() and not list(tmp_path.glob("*.corrupt-*"))


# -- migrations ---------------------------------------------------------------------------------
def test_an_older_database_is_migrated_forward_keeping_its_runs(
    history_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_id = history.save(stamped(sample_report()))
    assert old_id is not None
    step_2 = ("ALTER TABLE runs ADD COLUMN note TEXT NOT NULL DEFAULT ''",)
    monkeypatch.setattr(store, "MIGRATIONS", [*store.MIGRATIONS, step_2])
    with History() as h:
        assert h.conn.execute("PRAGMA user_version").fetchone()[0] == 2
        assert h.get(old_id).report().optimal.batch_size == 192
        assert h.conn.execute("SELECT note FROM runs").fetchall() == [("",)]
        new_id = h.save(sample_report())
    assert new_id == old_id + 1


def test_a_newer_database_is_refused_untouched(history_db: Path) -> None:
    history.save(sample_report())
    with sqlite3.connect(history_db) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(HistoryError, match="newer MemoryMark .schema 99"):
        History().count()
    assert not list(history_db.parent.glob("*.corrupt-*"))


# -- several writers at once ----------------------------------------------------------------
RUNS_PER_WRITER = 25


def _write_runs(path: str, writer: str, n: int, start: multiprocessing.synchronize.Event) -> None:
    """Save `n` runs tagged with the writer's name (in another process, or a thread)."""
    start.wait(60)
    with History(path) as h:
        for i in range(n):
            report = dataclasses.replace(
                sample_report(), elapsed_seconds=float(i), costs=Costs(hours_per_run=1 + i)
            )
            h.save(report, source=writer)


def test_three_app_sessions_and_three_cli_processes_lose_nothing(history_db: Path) -> None:
    """Three threads in this process (the app's sessions share one server process) and three
    processes (CLI runs) save at the same moment; every run and every probe is there after."""
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    procs = [
        ctx.Process(target=_write_runs, args=(str(history_db), f"cli-{i}", RUNS_PER_WRITER, go))
        for i in range(3)
    ]
    for p in procs:
        p.start()
    thread_go = threading.Event()
    threads = [
        threading.Thread(
            target=_write_runs, args=(str(history_db), f"app-{i}", RUNS_PER_WRITER, thread_go)
        )
        for i in range(3)
    ]
    for t in threads:
        t.start()
    go.set()
    thread_go.set()
    for p in procs:
        p.join(120)
    for t in threads:
        t.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    with History() as h:
        runs = h.runs()
        probes = h.conn.execute("SELECT count(*) FROM probes").fetchone()[0]
    writers = 6
    assert len(runs) == writers * RUNS_PER_WRITER
    by_writer = {}
    for r in runs:
        by_writer.setdefault(r.source, set()).add(r.elapsed_seconds)
    assert by_writer == {
        name: {float(i) for i in range(RUNS_PER_WRITER)}
        for name in [f"cli-{i}" for i in range(3)] + [f"app-{i}" for i in range(3)]
    }
    assert probes == writers * RUNS_PER_WRITER * 4


def test_a_stamp_reads_back_what_a_later_version_wrote() -> None:
    s = Stamp.from_dict({"torch_version": "9.9", "gpu_clock": "fast"})
    assert s.torch_version == "9.9" and s.memorymark_version == ""


def test_a_report_without_a_stamp_is_stamped_as_it_is_saved() -> None:
    with History() as h:
        saved = h.get(h.save(sample_report()))
    assert saved.report_json["environment"] == saved.environment
    assert saved.report().stamp == Stamp.from_dict(saved.environment)
    assert saved.environment["finished_utc"] == saved.summary.created_utc


def test_a_private_history_keeps_its_runs_in_memory_and_no_file(
    history_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "PRIVATE_RUNS_KEPT", 2)
    mine = History.of_this_session()
    with mine:  # closing it (as pages do) must not lose it
        ids = [mine.save(sample_report(), source="app") for _ in range(3)]
    assert ids == [1, 2, 3]
    assert [r.id for r in mine.runs()] == [3, 2]  # the oldest went past the cap
    assert mine.get(3).report().optimal.batch_size == 192
    with pytest.raises(HistoryError, match="no saved run 1 in this session's history"):
        mine.get(1)
    assert not history_db.exists()
    assert History.of_this_session().count() == 0  # another visitor's starts empty
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(mine.count()))
    worker.start()  # Streamlit runs a session's reruns on threads of its own
    worker.join()
    assert result == [2]
