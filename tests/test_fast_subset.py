"""`make test-fast`: the files marked `fast` reach every package of memorymark/.

A file joins the subset whole, with `pytestmark = pytest.mark.fast` (or the mark in its
`pytestmark` list); the packages it tests are the memorymark packages it imports. Read from the
source, so this check runs in milliseconds and needs no collection."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "memorymark"


def _packages() -> set[str]:
    return {p.parent.name for p in PACKAGE.glob("*/__init__.py")}


def _is_fast(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return "mark.fast" in ast.unparse(node.value)
    return False


def _packages_imported(tree: ast.Module, packages: set[str]) -> set[str]:
    """The memorymark packages a test file imports, anywhere in it (`from memorymark import
    gpus`, `from memorymark.cli.parser import main`, `import memorymark.history`)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "memorymark" and len(parts) > 1 and parts[1] in packages:
                found.add(parts[1])
    return found


def fast_files() -> dict[str, set[str]]:
    """Each test file in the fast subset -> the memorymark packages it imports."""
    packages = _packages()
    files = {}
    for path in sorted(TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        if _is_fast(tree):
            files[path.name] = _packages_imported(tree, packages)
    return files


def test_the_fast_subset_reaches_every_package():
    reached = set().union(*fast_files().values())
    assert sorted(_packages() - reached) == []


def test_the_fast_subset_is_a_subset():
    # A handful of files, not the suite: past about a third of it, it stops being quick.
    files = fast_files()
    assert "test_fast_subset.py" in files
    assert len(files) <= len(list(TESTS.glob("test_*.py"))) // 3


def test_the_import_reader_finds_packages():
    tree = ast.parse(
        "from memorymark import gpus, units\nimport memorymark.cli.parser\n"
        "def f():\n    from memorymark.history.store import History\n"
    )
    assert _packages_imported(tree, {"gpus", "cli", "history"}) == {"gpus", "cli", "history"}
    assert _is_fast(ast.parse("pytestmark = [pytest.mark.fast, pytest.mark.usefixtures('x')]"))
    assert not _is_fast(ast.parse("pytestmark = pytest.mark.gpu"))
