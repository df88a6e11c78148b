"""What a report says of a user's own training code: where a library read a value, what the job
did (not the catalog's defaults), and a result object that prints in a line.

Tiny models on a 1 GiB GPU, simulated.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

import pytest
import torch
from torch import nn

import memorymark as mm
from memorymark.cli import render
from memorymark.reporting.exports import markdown
from memorymark.reporting.json_form import report_to_dict
from memorymark.reporting.markdown import escape

SMALL = {"gpu_memory_gib": 1, "max_batch": 64}


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def tiny_batch(n: int) -> torch.Tensor:
    return torch.randn(n, 16)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


# -- 4.6: a value read inside a library names the library's line and the user's -------------------
@pytest.fixture
def library(tmp_path, monkeypatch):
    """A module installed the way TRL is (under site-packages) whose function reads `.item()`."""
    folder = tmp_path / "site-packages"
    folder.mkdir()
    (folder / "fakelib_mm.py").write_text(
        textwrap.dedent(
            """\
            def log_loss(loss):
                return round(loss.item(), 3)  # THE LIBRARY'S READ
            """
        )
    )
    monkeypatch.syspath_prepend(str(folder))
    yield importlib.import_module("fakelib_mm"), folder / "fakelib_mm.py"
    sys.modules.pop("fakelib_mm", None)


def test_a_read_inside_a_library_names_its_file_and_line_and_the_users_call(library):
    lib, lib_path = library

    def step(model, batch, optimizer):
        loss = model(batch).square().mean()
        loss.backward()
        lib.log_loss(loss)  # THE USER'S CALL
        optimizer.step()

    user_line = step.__code__.co_firstlineno + 3
    job = mm.Training(model=Tiny, batch=tiny_batch, step=step, optimizer=sgd)
    report = mm.Session(mm.Settings(**SMALL), training=job).analyze()
    (read,) = report.value_reads
    assert (read.file, read.line) == (__file__, user_line)
    assert read.op == "lib.log_loss(loss)  # THE USER'S CALL"
    assert (read.library_file, read.library_line) == (str(lib_path), 2)
    assert read.library_op == "return round(loss.item(), 3)  # THE LIBRARY'S READ"
    assert report_to_dict(report)["value_reads"][0]["library"] == {
        "file": str(lib_path),
        "line": 2,
        "op": "return round(loss.item(), 3)  # THE LIBRARY'S READ",
    }
    text = markdown(report)
    assert f"`{escape(str(lib_path))}:2`" in text
    assert f"in a library, called from `{escape(__file__)}:{user_line}`" in text


def test_a_read_in_the_users_own_line_has_no_library(capsys):
    def step(model, batch, optimizer):
        loss = model(batch).square().mean()
        loss.backward()
        print(loss.item())
        optimizer.step()

    job = mm.Training(model=Tiny, batch=tiny_batch, step=step, optimizer=sgd)
    report = mm.Session(mm.Settings(**SMALL), training=job).analyze()
    (read,) = report.value_reads
    assert read.line == step.__code__.co_firstlineno + 3 and read.library_file is None
    assert report_to_dict(report)["value_reads"][0]["library"] is None
    capsys.readouterr()
    render._print_value_reads(report.value_reads)
    assert (
        capsys.readouterr().out
        == f"  value read as 0 (simulated): {__file__}:{read.line}  print(loss.item())\n"
    )


# -- 4.7: what the job did, never the catalog's defaults ----------------------------------------
BF16_FILE = textwrap.dedent(
    """\
    import torch
    from torch import nn
    import memorymark as mm

    def step(model, batch, optimizer):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch).float().square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def training():
        return mm.Training(model=lambda: nn.Linear(16, 16), batch=lambda n: torch.randn(n, 16),
                           step=step, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    """
)


def test_training_json_settings_say_nothing_of_the_catalog_and_show_the_autocast_seen(
    tmp_path, capsys
):
    from memorymark.cli.parser import main

    path = tmp_path / "train_bf16.py"
    path.write_text(BF16_FILE)
    argv = ["analyze", "--training", f"{path}:training", "--gpu-memory", "1", "--json"]
    assert main([*argv, "--max-batch", "32", "--no-save"]) == 0
    data = json.loads(capsys.readouterr().out)
    settings = data["settings"]
    # The catalog's defaults (32-true, seq_len 128, adamw) are not what the job ran.
    assert settings["precision"] is None and settings["seq_len"] is None
    assert settings["optimizer"] is None and settings["model"] is None
    assert settings["max_batch"] == 32 and settings["gpu_memory_gib"] == 1
    assert data["observed"] == {"autocast_dtypes": ["bfloat16"]}


def test_a_job_with_no_autocast_is_observed_as_none_and_the_markdown_says_so():
    def step(model, batch, optimizer):
        model(batch).square().mean().backward()
        optimizer.step()

    job = mm.Training(model=Tiny, batch=tiny_batch, step=step, optimizer=sgd)
    report = mm.Session(mm.Settings(**SMALL), training=job).analyze()
    assert report.autocast_dtypes == ()
    assert report_to_dict(report)["observed"] == {"autocast_dtypes": []}
    text = markdown(report)
    assert "| Autocast (observed) | none entered |" in text
    assert "Precision" not in text and "32-true" not in text


def test_the_catalogs_own_report_keeps_its_settings_and_observes_nothing():
    report = mm.Session(mm.Settings(model="tiny-gpt2", **SMALL)).analyze()
    data = report_to_dict(report)
    assert data["settings"]["precision"] == "32-true" and data["settings"]["seq_len"] == 128
    assert data["observed"] is None and report.autocast_dtypes is None


def test_a_report_and_the_integrations_results_print_in_a_line():
    job = mm.Training(model=Tiny, batch=tiny_batch, step=_plain_step, optimizer=sgd)
    report = mm.Session(mm.Settings(**SMALL), training=job).analyze()
    assert repr(report) == (
        f"Report(model='Tiny', gpu='Custom 1 GiB', optimal_batch={report.optimal.batch_size}, "
        f"max_batch={report.max_fit.batch_size}, probes={len(report.measurements)}, "
        "memory='simulated')"
    )
    from memorymark.integrations.lightning import LightningBatch

    assert len(repr(LightningBatch(report, 64))) < 200


def test_the_history_refuses_a_training_jobs_report_in_one_line(tmp_path):
    from memorymark.history import History, HistoryError

    job = mm.Training(model=Tiny, batch=tiny_batch, step=_plain_step, optimizer=sgd)
    report = mm.Session(mm.Settings(**SMALL), training=job).analyze()
    with History(tmp_path / "h.sqlite3") as history:
        with pytest.raises(HistoryError, match="Tiny is your own training code.*keep its JSON"):
            history.save(report)
        assert history.count() == 0


def _plain_step(model, batch, optimizer):
    model(batch).square().mean().backward()
    optimizer.step()
