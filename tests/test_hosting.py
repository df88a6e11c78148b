"""What a host installs and runs: the hosted entrypoint, its requirements, the package's
dependencies, and a Python without them (one line, not a traceback)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    # `measure` needs torch (`models` and `gpus` list static data without it).
    code = (
        "import runpy, sys; sys.modules['torch'] = None; "
        "sys.argv = ['memorymark', 'measure', 'tiny-bert', '--batch-size', '1']; "
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


def page_text(at: AppTest) -> str:
    """Everything the page draws (each element's message: text, values, link targets) and its
    link, as one string."""

    def walk(node: Any) -> Iterator[str]:
        proto = getattr(node, "proto", None)
        if proto is not None:
            yield str(proto)
        for child in getattr(node, "children", {}).values():
            yield from walk(child)

    return "\n".join([*walk(at._tree), str(at.query_params)])


@pytest.fixture
def hosted_uploads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A hosted server (sweeps inline) whose uploads go to `tmp_path`."""
    from memorymark.models import sources

    monkeypatch.setattr(sweep_runner, "server_config", lambda: ServerConfig(hosted=True))
    monkeypatch.setattr(sources, "UPLOAD_DIR", tmp_path)
    monkeypatch.setattr(sources, "_config_root", tmp_path.resolve())
    sources.from_upload.cache_clear()
    return tmp_path


def upload(data: bytes, name: str = "my bert.json") -> AppTest:
    at = AppTest.from_file("../app.py", default_timeout=TIMEOUT)
    at.session_state[sweep_runner.SYNC_KEY] = True
    at.query_params.update(max_batch="16", current_batch="8")
    at.run()
    at.file_uploader(key="mm_upload").set_value((name, data, "application/json")).run()
    assert not at.exception
    return at


@pytest.mark.usefixtures("fresh_caches")
def test_a_hosted_app_shows_no_server_path_for_an_upload(hosted_uploads: Path) -> None:
    from memorymark import models

    at = upload(Path(models.CONFIG_DIR, "tiny-bert.json").read_bytes())
    spec = at.text_input(key="mm_model_spec").value
    assert spec.startswith("upload:my-bert-")
    at.button(key="analyze").click().run()
    assert not at.exception
    text = page_text(at)
    assert "Optimal batch size" in text  # the answer, its log and commands were drawn
    assert spec in text  # the upload is named by its name...
    for path in (str(hosted_uploads), str(hosted_uploads.resolve()), "memorymark-uploads"):
        assert path not in text  # ...and its folder on the server never shows


@pytest.mark.usefixtures("fresh_caches")
def test_a_hosted_app_names_a_bad_upload_without_its_server_path(hosted_uploads: Path) -> None:
    at = upload(b'{"model_type": "bert", "hidden_size": ', name="broken.json")
    errors = [e.value for e in at.error]
    assert errors and "upload:broken-" in errors[0] and "is not valid JSON" in errors[0]
    text = page_text(at)
    assert str(hosted_uploads) not in text and "memorymark-uploads" not in text
