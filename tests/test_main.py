"""`python -m memorymark` exits as soon as its output is flushed, and a closed pipe is quiet."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memorymark import __main__ as entry
from memorymark.cli import parser

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)

ROOT = Path(__file__).resolve().parents[1]


class _Exited(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


@pytest.fixture
def exits(monkeypatch):
    """os._exit raises instead of ending the test process."""

    def fake_exit(status: int) -> None:
        raise _Exited(status)

    monkeypatch.setattr(os, "_exit", fake_exit)


def _run(monkeypatch, main) -> int:
    monkeypatch.setattr(parser, "main", main)
    with pytest.raises(_Exited) as info:
        entry.run()
    return info.value.status


def test_run_flushes_and_exits_with_the_commands_status(exits, monkeypatch, capsys):
    def main():
        print("partial line", end="")
        return 2

    assert _run(monkeypatch, main) == 2
    assert capsys.readouterr().out == "partial line"


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (2, 2), ("bad", 1)])
def test_argparse_exits_keep_their_status(exits, monkeypatch, code, status):
    def main():
        raise SystemExit(code)

    assert _run(monkeypatch, main) == status


def test_a_closed_pipe_ends_quietly_with_status_1(exits, monkeypatch):
    def main():
        raise BrokenPipeError

    monkeypatch.setattr(entry, "_closed_pipe", lambda: 1)
    assert _run(monkeypatch, main) == 1


def _module(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "memorymark", *args], env=env, stderr=subprocess.PIPE, **kwargs
    )


def test_output_to_a_file_is_complete(tmp_path):
    out = tmp_path / "gpus.json"
    with out.open("w") as f:
        proc = _module("gpus", "--json", stdout=f)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert {"name", "usable_gb"} <= set(json.loads(out.read_text())[0])


def test_a_reader_that_stops_reading_gets_no_traceback():
    proc = _module("gpus", "--json", stdout=subprocess.PIPE)
    proc.stdout.close()  # as `| head` does once it has its lines: every write meets EPIPE
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert b"Traceback" not in err and b"BrokenPipeError" not in err
