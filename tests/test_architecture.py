"""The house: a small public top level, packages that follow the data flow, no import cycle,
one meaning per class name, and each package saying what it owns and what it must not know."""

import ast
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)

PACKAGE = Path(__file__).resolve().parents[1] / "memorymark"
TOP_LEVEL = {
    "__init__",
    "__main__",
    "engine",
    "environment",
    "fit",
    "limits",
    "measurement",
    "report",
    "units",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (types only: no import at run time)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every memorymark module `name` imports at run time, function-level imports included."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    found.discard(name)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_top_level_holds_the_public_api_only():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == TOP_LEVEL
    assert len(top) <= 12


def test_no_import_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycle(graph) is None


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_public_class_name_is_defined_twice():
    names = Counter(
        node.name
        for path in _modules().values()
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
    )
    assert [name for name, count in names.items() if count > 1] == []


def test_each_package_says_what_it_owns_and_must_not_know():
    for init in sorted(PACKAGE.rglob("__init__.py")):
        if init.parent == PACKAGE:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "must not know" in doc.lower() or "must not" in doc.lower(), init


# Module-level names that several modules define on purpose, with one meaning in each, and why.
SHARED_NAMES = {
    "CATALOG": "each catalog package's own table, always read through its package "
    "(gpus.CATALOG, models.CATALOG)",
    "PATCH": "each cuda_rules module's one ScopedPatch, the shape cuda_rules.applied switches on",
}


def _defined_names(tree: ast.Module) -> set[str]:
    """The public names a module defines at its top level: classes, constants and type aliases
    (plain, annotated or `type X = ...`). Functions are left out: a function is called through
    its module (`history.add_parser`, `commands.run`), where one verb per module (run, write,
    table) reads clearly, while a constant or a type is imported bare and read without its
    module. TypeVars (`T = TypeVar("T")`) are each generic module's own placeholder."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif type(node).__name__ == "TypeAlias":  # `type X = ...` (Python 3.12 and later)
            names.add(node.name.id)  # type: ignore[attr-defined]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = node.value
            if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("TypeVar"):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return {n for n in names if not n.startswith("_") and n != "__all__"}


def _names_defined_twice(sources: dict[str, str]) -> dict[str, list[str]]:
    """Each public module-level name that more than one module defines -> those modules."""
    where: dict[str, list[str]] = {}
    for module, text in sources.items():
        for name in _defined_names(ast.parse(text)):
            where.setdefault(name, []).append(module)
    return {name: sorted(mods) for name, mods in where.items() if len(mods) > 1}


def test_no_public_module_level_name_has_two_meanings():
    # One name, one meaning: the `Backend` Literal beside the Backend class, or two PROTOCOLS
    # (the --protocol choices and the proof's steps), read alike and mean different things.
    sources = {name: path.read_text() for name, path in _modules().items()}
    twice = _names_defined_twice(sources)
    assert {n: m for n, m in twice.items() if n not in SHARED_NAMES} == {}
    assert set(SHARED_NAMES) <= set(twice)  # an exception nothing needs any more is dropped


def test_the_naming_check_finds_a_clash():
    sources = {
        "a": "from typing import Literal, TypeVar\nBackend = Literal['cpu']\nT = TypeVar('T')\n",
        "b": "T = 1\nclass Backend: ...\ndef run(): ...\nLIMIT: int = 3\n",
        "c": "def run(): ...\nLIMIT = 4\n_private = 1\n",
    }
    assert _names_defined_twice(sources) == {"Backend": ["a", "b"], "LIMIT": ["b", "c"]}
