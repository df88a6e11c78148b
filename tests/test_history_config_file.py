"""A `file:` run (CLI `--config-file`, an app upload) keeps a copy of its config in the history,
so it reopens when the file is gone, changed, or not readable where it is reopened (the app's
History page reads configs only from its upload folder)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from app_samples import sample_report
from config_samples import TINY_BERT

from memorymark import history
from memorymark.cli.parser import main
from memorymark.history import History, configs
from memorymark.models import sources
from memorymark.settings import Settings

ANALYZE = ["--seq-len", "32", "--gpu", "a10", "--backend", "sim", "--max-batch", "32"]


def save_file_run(config: Path) -> int:
    config.write_text(json.dumps(TINY_BERT))
    report = dataclasses.replace(sample_report(), settings=Settings(model=f"file:{config}"))
    run_id = history.save(report)
    assert run_id is not None
    return run_id


def reopen(run_id: int, folder: Path) -> tuple[str, str]:
    sources.from_config_file.cache_clear()  # as a new process would read the file
    with History() as h:
        report, note = h.get(run_id).reopen(folder)
    return report.settings.workload.model, note


@pytest.mark.usefixtures("any_config_path")
def test_a_cli_config_file_run_saves_its_absolute_path_and_a_copy(
    capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY_BERT))
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "--config-file", "config.json", *ANALYZE]) == 0
    run_id = int(re.search(r"saved as run (\d+)", capsys.readouterr().out).group(1))
    with History() as h:
        run = h.get(run_id)
    assert run.summary.model == f"file:{tmp_path / 'config.json'}"
    assert run.record["config_file"] == {"path": str(tmp_path / "config.json"), "data": TINY_BERT}


@pytest.mark.usefixtures("any_config_path")
def test_an_unchanged_file_reopens_from_itself(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    run_id = save_file_run(config)
    assert reopen(run_id, tmp_path / "copies") == (f"file:{config}", "")
    assert not (tmp_path / "copies").exists()


@pytest.mark.usefixtures("any_config_path")
def test_a_gone_file_reopens_from_the_copy_kept_with_the_run(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    run_id = save_file_run(config)
    config.unlink()
    model, note = reopen(run_id, tmp_path / "copies")
    copy = Path(model.removeprefix("file:"))
    assert copy.parent.parent == tmp_path / "copies"
    assert json.loads(copy.read_text()) == TINY_BERT
    assert (
        note
        == f"{config} is gone: this run reopened with the copy of its config saved with it ({copy})"
    )
    assert reopen(run_id, tmp_path / "copies") == (model, note)  # the same copy, written once


@pytest.mark.usefixtures("any_config_path")
def test_a_changed_file_reopens_from_the_copy_not_the_new_contents(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    run_id = save_file_run(config)
    config.write_text(json.dumps({**TINY_BERT, "num_hidden_layers": 2}))
    model, note = reopen(run_id, tmp_path / "copies")
    assert json.loads(Path(model.removeprefix("file:")).read_text()) == TINY_BERT
    assert " has changed since: " in note


@pytest.mark.usefixtures("any_config_path")
def test_a_file_the_app_may_not_read_reopens_from_a_copy_in_its_folder(tmp_path: Path) -> None:
    """The app reads configs only from its upload folder: a CLI run's file outside it is
    written back inside it."""
    run_id = save_file_run(tmp_path / "config.json")
    uploads = tmp_path / "uploads"
    sources.restrict_config_files(uploads)  # as the app does; the fixture lifts it again
    model, note = reopen(run_id, uploads)
    assert Path(model.removeprefix("file:")).is_relative_to(uploads)
    assert " is not readable here: " in note


def test_other_models_keep_no_copy() -> None:
    assert configs.copy_of("tiny-bert") is None
    assert configs.copy_of("file:/nonexistent/config.json") is None
