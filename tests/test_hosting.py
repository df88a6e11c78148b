"""What a host installs and runs: the hosted entrypoint, its requirements, the package's
dependencies, and a Python without them (one line, not a traceback)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from app_helpers import TIMEOUT
from streamlit.testing.v1 import AppTest

from memorymark.service.server_config import ServerConfig
from memorymark.ui import sweep_runner

ROOT = Path(__file__).resolve().parent.parent


def requirement_lines(path: Path) -> list[str]:
    """The requirement lines of a requirements file (no comments, options or includes)."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("-")]


def test_the_package_asks_for_what_requirements_txt_asks_for() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert sorted(project["dependencies"]) == sorted(requirement_lines(ROOT / "requirements.txt"))


def test_the_hosted_requirements_take_cpu_torch_of_a_supported_release() -> None:
    hosted = (ROOT / "hosted" / "requirements.txt").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in hosted
    included = re.search(r"^-r (\S+)$", hosted, re.M)
    assert included and (ROOT / "hosted" / included.group(1)).resolve() == (
        ROOT / "requirements.txt"
    )
    hosted_torch = [r for r in requirement_lines(ROOT / "hosted" / "requirements.txt")]
    assert hosted_torch == ["torch==2.13.0"]
    supported = [r for r in requirement_lines(ROOT / "requirements.txt") if r.startswith("torch")]
    assert supported == ["torch>=2.5,<2.15"]  # 2.13.0 inside it


def test_the_tests_run_on_the_torch_the_app_installs() -> None:
    # One venv for `make run` and `make test`: the tests' requirements add no torch of their own
    # (a pin there replaced the app's CUDA torch with a CPU build, without a word).
    dev = requirement_lines(ROOT / "requirements-dev.txt")
    assert not [r for r in dev if re.match(r"torch\b", r)]
    assert "-r requirements.txt" in (ROOT / "requirements-dev.txt").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "$(VENV)/.dev-installed: $(VENV)/.app-installed" in makefile


def test_the_dockerfile_installs_the_hosted_requirements_and_turns_hosting_on() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install -r hosted/requirements.txt" in dockerfile
    assert "MEMORYMARK_HOSTED=true" in dockerfile
    copied = re.findall(r"^COPY (?:--\S+ )*(\S+) ", dockerfile, re.M)
    assert copied and all((ROOT / path).exists() for path in copied)


def test_a_python_without_torch_gets_one_line_on_how_to_install() -> None:
    code = (
        "import runpy, sys; sys.modules['torch'] = None; sys.argv = ['memorymark', 'gpus']; "
        "runpy.run_module('memorymark', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "torch is not installed" in done.stderr and ".venv/bin/memorymark" in done.stderr


def test_the_hosted_entrypoint_runs_the_app_with_hosting_on(
    monkeypatch: pytest.MonkeyPatch, history_db: Path
) -> None:
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()
                                        if k != "MEMORYMARK_HOSTED"})  # fmt: skip
    monkeypatch.setattr(sweep_runner, "server_config", lambda: ServerConfig.from_sources())
    at = AppTest.from_file("../hosted/streamlit_app.py", default_timeout=TIMEOUT).run()
    assert not at.exception
    assert os.environ["MEMORYMARK_HOSTED"] == "true"
    assert [t.value for t in at.title] == ["MemoryMark"]
    at.switch_page(str(ROOT / "pages" / "3_History.py")).run()
    assert not at.exception
    assert "seen by no other visitor" in at.caption[0].value
    assert not any(str(history_db) in c.value for c in at.caption)


def test_no_entrypoint_draws_a_stray_string() -> None:
    """Streamlit's magic writes every bare expression of a page's script: a docstring under a
    constant would show on every page."""
    for path in (ROOT / "app.py", ROOT / "hosted" / "streamlit_app.py", *ROOT.glob("pages/*.py")):
        body = ast.parse(path.read_text()).body
        strays = [
            node.lineno
            for node in body[1:]  # the module's own docstring is not drawn
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        ]
        assert strays == [], f"{path.name} lines {strays}"
