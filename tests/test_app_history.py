"""The History page and the main page's saving, under AppTest (reports built by hand, no sweep)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from app_helpers import TIMEOUT, app, chart, metrics, shown
from app_samples import sample_report
from streamlit.testing.v1 import AppTest

from memorymark import gpus
from memorymark.environment import stamp
from memorymark.history import History
from memorymark.service.server_config import ServerConfig
from memorymark.settings import Settings
from memorymark.ui import sweep_runner

PAGE = "../pages/3_History.py"  # AppTest resolves paths against this file


def seed() -> None:
    """Runs 1-3: tiny-bert on A10, tiny-gpt2 on A10, tiny-bert on T4 (optimal 192 each)."""
    when = stamp(backend="sim", device="A10", memory_source="simulated",
                 finished_utc="2026-01-02T03:04:05Z")  # fmt: skip
    base = dataclasses.replace(sample_report(), stamp=when)
    with History() as h:
        h.save(base, source="cli")
        h.save(dataclasses.replace(base, settings=Settings(model="tiny-gpt2")), source="app")
        h.save(dataclasses.replace(base, gpu=gpus.find_gpu("T4")), source="cli")


def page() -> AppTest:
    return AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()


def test_the_page_lists_runs_and_filters_by_model_and_gpu() -> None:
    seed()
    at = page()
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["ID"]) == [3, 2, 1]
    assert list(table["Memory"]) == ["simulated"] * 3
    at.multiselect(key="mm_history_model").set_value(["tiny-bert"]).run()
    assert list(at.dataframe[0].value["ID"]) == [3, 1]
    at.multiselect(key="mm_history_gpu").set_value(["T4"]).run()
    assert list(at.dataframe[0].value["ID"]) == [3]
    assert at.multiselect(key="mm_history_pick").options == ["#3 tiny-bert on T4, 2026-01-02 03:04"]


def test_a_run_reopens_with_the_main_page_charts_without_a_sweep() -> None:
    seed()
    at = page()
    at.multiselect(key="mm_history_pick").set_value([1]).run()
    assert not at.exception
    assert metrics(at)["Optimal batch size"] == "192"
    sweep = chart(at, "sweep_chart")
    assert sorted(x for t in sweep["data"] if t.get("name") == "fits" for x in t["x"]) == [
        8,
        16,
        192,
    ]
    assert "simulated" in sweep["layout"]["title"]["text"]
    assert "saved 2026-01-02T03:04:05Z: optimal batch 192" in at.code[0].value
    assert [b.label for b in at.get("download_button")] == [
        "Download JSON report", "Download probes CSV", "Download Markdown report"]  # fmt: skip


def test_two_runs_overlay_their_memory_curves() -> None:
    seed()
    at = page()
    at.multiselect(key="mm_history_pick").set_value([1, 3]).run()
    assert not at.exception
    spec = chart(at, "history_overlay")
    curves = [t for t in spec["data"] if t["mode"] == "lines+markers"]
    assert [t["name"] for t in curves] == [
        "#1 tiny-bert on A10 (simulated)", "#3 tiny-bert on T4 (simulated)"]  # fmt: skip
    assert curves[0]["x"] == [8, 16, 192]
    usable = [t["name"] for t in spec["data"] if "usable" in t["name"]]
    assert usable == [
        "#1 tiny-bert on A10: usable (21.68 GiB)",
        "#3 tiny-bert on T4: usable (14.45 GiB)",
    ]
    ooms = [t for t in spec["data"] if t["name"].endswith("out of memory")]
    assert [t["x"] for t in ooms] == [[200], [200]]


def test_delete_removes_the_selected_runs() -> None:
    seed()
    at = page()
    at.multiselect(key="mm_history_pick").set_value([2, 3]).run()
    assert at.get("popover")[0].proto.popover.label == "Delete 2 selected runs"  # asks first
    at.button(key="mm_history_delete").click().run()
    assert not at.exception
    assert [r.id for r in History().runs()] == [1]
    assert list(at.dataframe[0].value["ID"]) == [1]


def test_the_server_can_turn_the_history_off(monkeypatch: pytest.MonkeyPatch) -> None:
    seed()
    monkeypatch.setenv("MEMORYMARK_HISTORY", "off")
    at = page()
    assert not at.exception and "turned off on this server" in at.info[0].value
    assert not at.dataframe


def test_a_damaged_database_is_moved_aside_and_said_once(history_db: Path) -> None:
    history_db.write_bytes(b"not sqlite" * 500)
    at = page()
    assert not at.exception
    assert len(at.warning) == 1
    assert "moved it to history.sqlite3.corrupt-" in shown(at.warning[0].value)
    assert "No saved analyses yet" in at.info[0].value


@pytest.mark.usefixtures("fresh_caches")
def test_the_main_page_saves_each_finished_analysis_once(fake) -> None:
    at = app(model="tiny-bert")
    at.button(key="analyze").click().run()
    assert not at.exception
    runs = History().runs()
    assert [(r.source, r.model, r.optimal_batch, r.probes) for r in runs] == [
        ("app", "tiny-bert", 192, 4)
    ]
    assert "Saved as run 1" in at.toast[0].value
    at.slider(key="mm_usd_per_hour").set_value(2.0).run()  # a rerun saves nothing new
    assert History().count() == 1
    saved = History().get(1)
    assert saved.costs["usd_per_hour"] is None
    assert json.loads(json.dumps(saved.report_json))["optimal_batch_size"] == 192


@pytest.mark.usefixtures("fresh_caches")
def test_unticking_save_keeps_the_analysis_out_of_the_history(fake) -> None:
    at = app(model="tiny-bert")
    at.checkbox(key="mm_save_history_box").uncheck().run()
    at.button(key="analyze").click().run()
    assert not at.exception and metrics(at)["Optimal batch size"] == "192"
    assert History().count() == 0


@pytest.mark.usefixtures("fresh_caches")
def test_a_hosted_server_gives_each_visitor_a_history_of_their_own(fake, monkeypatch) -> None:
    monkeypatch.setattr(sweep_runner, "server_config", lambda: ServerConfig(hosted=True))
    seed()  # runs in the server's own file: no visitor may see them
    first = app(model="tiny-bert")
    first.button(key="analyze").click().run()
    assert "Saved as run 1" in first.toast[0].value
    first.switch_page("pages/3_History.py").run()
    assert not first.exception
    assert list(first.dataframe[0].value["ID"]) == [1]
    assert list(first.dataframe[0].value["Model"]) == ["tiny-bert"]
    assert [r.id for r in History().runs()] == [3, 2, 1]  # the file got nothing new
    second = page()  # another browser session
    assert not second.exception
    assert "No saved analyses yet" in second.info[0].value and not second.dataframe
    # A visitor has no command line to run (it was "...or run `memorymark analyze`").
    assert "memorymark" not in second.info[0].value and "memorymark" not in second.caption[0].value
    for at in (first, second):
        assert not any("Database" in c.value for c in at.caption)
        assert not any(str(History().path) in e.value for e in at.get("markdown"))


@pytest.mark.usefixtures("any_config_path")
def test_a_cli_config_file_run_reopens_on_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app reads configs only from its upload folder; a run saved by `memorymark analyze
    --config-file` names a file outside it, and reopens from the copy saved with it."""
    from config_samples import TINY_BERT

    from memorymark.models import sources

    config = tmp_path / "cli" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(TINY_BERT))
    report = dataclasses.replace(sample_report(), settings=Settings(model=f"file:{config}"))
    with History() as h:
        run_id = h.save(report, source="cli")
    uploads = tmp_path / "uploads"
    monkeypatch.setattr(sources, "UPLOAD_DIR", uploads)
    sources.restrict_config_files(uploads)  # as the app does; the fixture lifts it again
    at = page()
    at.multiselect(key="mm_history_pick").set_value([run_id]).run()
    assert not at.exception and not at.warning
    assert metrics(at)["Optimal batch size"] == "192"
    [note] = [shown(i.value) for i in at.info]
    assert note.startswith(f"Run {run_id}: {config} is not readable here: this run reopened")
    assert str(uploads) in note
