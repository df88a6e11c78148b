"""What a report says of a user's own training code: where a library read a value, what the job
did (not the catalog's defaults), and a result object that prints in a line.

Tiny models on a 1 GiB GPU, simulated.
"""

from __future__ import annotations

import importlib
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
