"""Layering: the engine never imports Streamlit, and importing the CLI's parser needs no torch."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=120,
    ).stdout
    return set(out.split())


def test_the_engine_never_imports_streamlit():
    loaded = _modules_after(
        "import memorymark.analysis, memorymark.compare, memorymark.proof, memorymark.commands"
    )
    assert "torch" in loaded
    assert not any(name == "streamlit" or name.startswith("streamlit.") for name in loaded)


def test_cli_help_and_catalogs_import_no_torch():
    loaded = _modules_after("import memorymark.cli, memorymark.gpus, memorymark.report")
    assert "torch" not in loaded
