"""Layering: the engine never imports Streamlit, importing the CLI's parser needs no torch, and
the UI and every page's imports load with torch made unimportable (they reach the engine only
through its front door and plain value types)."""

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
        "import memorymark.engine, memorymark.backends.resolve, memorymark.analyses.compare, "
        "memorymark.analyses.proof, "
        "memorymark.calibration.run, memorymark.cli.commands"
    )
    assert "torch" in loaded
    assert not any(name == "streamlit" or name.startswith("streamlit.") for name in loaded)


def test_cli_help_and_catalogs_import_no_torch():
    loaded = _modules_after("import memorymark.cli.parser, memorymark.gpus, memorymark.report")
    assert "torch" not in loaded


# Any `import torch` (or a submodule) raises, as on a machine without it.
_NO_TORCH = """
import importlib.abc, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, _NoTorch())
"""


def _page_imports() -> list[str]:
    """Every module app.py and pages/*.py import (their statements run Streamlit, not this)."""
    import ast

    found = set()
    for page in [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py"))]:
        for node in ast.walk(ast.parse(page.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return sorted(found)


def test_the_ui_and_every_page_import_with_torch_blocked():
    modules = ["memorymark.ui", *_page_imports()]
    ui_modules = [p.stem for p in (ROOT / "memorymark" / "ui").glob("*.py") if p.stem != "__init__"]
    modules += [f"memorymark.ui.{name}" for name in sorted(ui_modules)]
    # The pages reach the engine through its front door, on the workers (memorymark.service.jobs).
    assert "memorymark.service.jobs" in modules
    assert "memorymark.history" in modules  # the History page reads the database itself
    loaded = _modules_after(_NO_TORCH + "\n".join(f"import {m}" for m in modules))
    assert "torch" not in loaded
    front = {
        "memorymark.engine",
        "memorymark.service.jobs",
        "memorymark.service.questions",  # what the server asks a worker instead of torch
        "memorymark.backends.selection",  # the engine's GPU decision, which the server makes too
        "memorymark.ui.sweep_runner",
        "streamlit",
    }
    assert front <= loaded
    assert {"memorymark.history", "memorymark.ui.history_views", "sqlite3"} <= loaded


def test_the_server_names_the_gpu_with_torch_blocked():
    code = (
        "from memorymark.backends.selection import LocalGPUs, answering_gpu\n"
        "from memorymark.settings import Settings\n"
        "gpu = answering_gpu(Settings(gpu='h100', dist='ddp', gpus='8'), LocalGPUs())\n"
        "assert gpu.name.startswith('H100') and gpu.nccl_bytes > 0\n"
    )
    assert "torch" not in _modules_after(_NO_TORCH + code)


def test_the_blocker_really_blocks_torch():
    result = subprocess.run(
        [sys.executable, "-c", _NO_TORCH + "import memorymark.backends.resolve"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0 and "torch is blocked" in result.stderr


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The memorymark modules `path` imports at run time, in functions too (TYPE_CHECKING
    blocks aside): a function-level import that breaks a cycle still couples the two."""
    import ast

    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module in modules | {"memorymark"}
        ):
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs or {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names} & modules
    return found


def test_no_import_cycles_among_the_engine_s_modules():
    package = ROOT / "memorymark"
    paths = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in package.rglob("*.py")
    }
    graph = {name: _imports(path, set(paths)) - {name} for name, path in paths.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(
            dep == goal or (dep not in seen and reaches(dep, goal, seen | {dep}))
            for dep in graph.get(start, ())
        )

    # The package's __init__ re-exports the front door; importing a submodule through it is
    # not a cycle between two modules.
    cycles = sorted(
        (a, b) for a, deps in graph.items() for b in deps
        if a < b and a != "memorymark" and b != "memorymark" and reaches(b, a, {b})
    )  # fmt: skip
    assert cycles == []
