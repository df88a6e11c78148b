"""`memorymark history ...` and the runs `analyze` saves: JSON shapes, one-line errors, exports."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from app_samples import sample_report

from memorymark import gpus, history
from memorymark.cli.parser import main
from memorymark.environment import stamp
from memorymark.history import History
from memorymark.models import sources
from memorymark.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
TINY = ["tiny-bert", "--seq-len", "32", "--gpu", "a10", "--backend", "sim", "--max-batch", "64"]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def seed() -> list[int]:
    """Three saved runs: tiny-bert on A10, tiny-gpt2 on A10, tiny-bert on T4 (ids 1, 2, 3)."""
    when = stamp(backend="sim", device="A10", memory_source="simulated",
                 finished_utc="2026-01-02T03:04:05Z")  # fmt: skip
    base = dataclasses.replace(sample_report(), stamp=when)
    reports = [
        base,
        dataclasses.replace(base, settings=Settings(model="tiny-gpt2")),
        dataclasses.replace(base, gpu=gpus.find_gpu("T4")),
    ]
    with History() as h:
        return [h.save(r, source="test") for r in reports]


def test_analyze_saves_the_finished_run_and_no_save_does_not(capsys) -> None:
    status, out, err = run_cli(capsys, "analyze", *TINY)
    assert status == 0, err
    assert "saved as run 1 (memorymark history show 1)" in out
    assert re.search(r"^  MemoryMark [\d.]+, torch 2\.\S+, transformers \S+, Python 3\.\S+; "
                     r"finished 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ$", out, re.M)  # fmt: skip
    status, out, _ = run_cli(capsys, "analyze", *TINY, "--no-save", "--json")
    assert status == 0
    analyzed = json.loads(out)
    assert analyzed["environment"]["backend"] == "sim"
    assert analyzed["environment"]["torch_version"].startswith("2.")
    with History() as h:
        runs = h.runs()
        assert [(r.id, r.source, r.model, r.gpu, r.optimal_batch) for r in runs] == [
            (1, "cli", "tiny-bert", "A10", 64)
        ]
        assert len(h.probes(1)) == runs[0].probes == analyzed["probes"]
    status, out, _ = run_cli(capsys, "history", "show", "1")
    assert status == 0
    assert "optimal batch size   64" in out
    assert "$ memorymark analyze tiny-bert --seq-len 32 --gpu a10 --backend sim" in out
    assert out.startswith("run 1, saved by cli: MemoryMark ")


def test_analyze_prints_a_markdown_report(capsys) -> None:
    status, out, _ = run_cli(capsys, "analyze", *TINY, "--format", "markdown", "--no-save")
    assert status == 0
    assert out.startswith("## MemoryMark: tiny-bert on A10 (simulated)")
    assert "| Optimal batch size | 64 (2% margin kept free) |" in out
    assert "memorymark analyze tiny-bert --seq-len 32 --gpu a10 --backend sim" in out
    assert History().count() == 0


def test_list_filters_and_prints_json(capsys) -> None:
    seed()
    status, out, _ = run_cli(capsys, "history", "list", "--json")
    assert status == 0
    assert [r["id"] for r in json.loads(out)] == [3, 2, 1]
    _, out, _ = run_cli(capsys, "history", "list", "--model", "bert", "--gpu", "a10", "--json")
    rows = json.loads(out)
    assert [(r["id"], r["model"], r["gpu"], r["optimal_batch"]) for r in rows] == [
        (1, "tiny-bert", "A10", 192)
    ]
    assert rows[0]["memory_source"] == "simulated"
    _, out, _ = run_cli(capsys, "history", "list", "--limit", "1")
    lines = out.splitlines()
    assert len(lines) == 2 and lines[1].split()[:4] == [
        "3",
        "2026-01-02T03:04:05Z",
        "tiny-bert",
        "T4",
    ]


def test_show_json_has_settings_costs_environment_and_report(capsys) -> None:
    seed()
    status, out, _ = run_cli(capsys, "history", "show", "2", "--json")
    assert status == 0
    data = json.loads(out)
    assert data["settings"]["model"] == "tiny-gpt2"
    assert data["costs"] == {"usd_per_hour": None, "hours_per_run": 2.0, "runs_per_year": 100.0}
    assert data["environment"]["finished_utc"] == "2026-01-02T03:04:05Z"
    assert data["report"]["optimal_batch_size"] == 192
    assert [r["batch_size"] for r in data["report"]["results"]] == [8, 16, 192, 200]


def test_delete_is_all_or_nothing(capsys) -> None:
    seed()
    status, _, err = run_cli(capsys, "history", "delete", "1", "9")
    assert status == 2 and err.strip() == (
        f"memorymark: error: no saved run 9 in {history.History().path} (see `memorymark "
        "history list`)"
    )
    assert History().count() == 3
    status, out, _ = run_cli(capsys, "history", "delete", "1", "3", "--json")
    assert status == 0 and json.loads(out) == {"deleted": [1, 3]}
    assert [r.id for r in History().runs()] == [2]


def test_export_writes_json_csv_and_markdown_named_for_the_run(capsys, tmp_path: Path) -> None:
    seed()
    status, out, _ = run_cli(capsys, "history", "export", "1")
    assert status == 0 and json.loads(out)["environment"]["finished_utc"] == "2026-01-02T03:04:05Z"
    status, out, _ = run_cli(capsys, "history", "export", "1", "--format", "csv")
    header, *rows = out.splitlines()
    assert "torch_version" in header.split(",") and len(rows) == 4
    status, out, _ = run_cli(
        capsys, "history", "export", "1", "--format", "markdown", "--out", str(tmp_path), "--json"
    )
    written = Path(json.loads(out)["path"])
    assert written.name == "memorymark-tiny-bert-A10-32-true-seq128-bs16-20260102T030405Z.md"
    assert "| 200 | OOM |" in written.read_text()
    status, _, err = run_cli(capsys, "history", "export", "1", "--format", "csv", "--json")
    assert status == 2 and "give --out PATH" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["history", "show", "7"], "no saved run 7"),
        (["history", "show", "0"], "must be at least 1"),
        (["history", "export", "1", "--format", "pdf"], "invalid choice: 'pdf'"),
        (["history", "frob"], "invalid choice: 'frob'"),
    ],
)
def test_bad_history_input_is_one_line_with_status_2(argv, message, capsys) -> None:
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    err = capsys.readouterr().err
    assert status == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_history_list_loads_no_torch_and_a_damaged_file_warns_once(history_db: Path) -> None:
    history_db.write_bytes(b"garbage" * 1000)
    code = (
        "import sys\nfrom memorymark.cli.parser import main\n"
        "status = main(['history', 'list', '--json'])"
        "\nprint('torch' in sys.modules, status)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.stdout.split()[-2:] == ["False", "0"]
    assert proc.stderr.count("memorymark: warning: history database") == 1
    assert "moved it to history.sqlite3.corrupt-" in proc.stderr


def test_history_show_prints_a_saved_report_without_loading_torch() -> None:
    seed()
    code = (
        "import sys\nfrom memorymark.cli.parser import main\n"
        "status = main(['history', 'show', '1'])"
        "\nprint('torch' in sys.modules, status)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.stdout.startswith("run 1, saved by test: MemoryMark ")
    assert "optimal batch size   192" in proc.stdout
    assert proc.stdout.split()[-2:] == ["False", "0"]


def test_a_history_that_cannot_be_written_warns_and_keeps_the_answer(
    capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("MEMORYMARK_DB", str(blocker / "history.sqlite3"))
    status, out, err = run_cli(capsys, "analyze", *TINY, "--json")
    assert status == 0 and json.loads(out)["optimal_batch_size"] == 64
    assert err.startswith("memorymark: warning: this run was not saved to the history: cannot")
    assert len(err.strip().splitlines()) == 1
    status, _, err = run_cli(capsys, "history", "list")
    assert status == 2 and err.startswith("memorymark: error: cannot create the folder")


@pytest.mark.usefixtures("any_config_path")
def test_an_older_run_whose_config_file_is_gone_still_shows_as_json(capsys, tmp_path: Path) -> None:
    from config_samples import TINY_BERT

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_BERT))
    report = dataclasses.replace(sample_report(), settings=Settings(model=f"file:{config}"))
    run_id = history.save(report)
    with History() as h:  # as a run saved before runs kept a copy of their config
        record = json.loads(
            h.conn.execute("SELECT record_json FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
        )
        del record["config_file"]
        h.conn.execute("UPDATE runs SET record_json = ? WHERE id = ?", (json.dumps(record), run_id))
        h.conn.commit()
    config.unlink()
    sources.from_config_file.cache_clear()  # as a new process would find it: gone
    status, _, err = run_cli(capsys, "history", "show", str(run_id))
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "cannot be read back" in err and "put the file back" in err
    assert f"history show {run_id} --json" in err
    status, out, _ = run_cli(capsys, "history", "show", str(run_id), "--json")
    assert status == 0 and json.loads(out)["report"]["optimal_batch_size"] == 192
