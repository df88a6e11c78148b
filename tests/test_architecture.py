"""The house: a small public top level, packages that follow the data flow, no import cycle
(type-only imports included), no arrow from a lower floor to a higher one, one meaning per class
name, and each package saying what it owns and what it must not know."""

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
    "ways_out",
}

# The floors of the house, lowest first, as today's imports have them (a unit is a package, or
# a module of the top level). A module imports from its own unit or from a lower floor only:
# never from its own floor (units on one floor know nothing of each other) nor from above. The
# order follows docs/development.md's layout, where the imports allow it; where they say
# otherwise, the comment says why.
FLOORS: tuple[tuple[str, ...], ...] = (
    # Leaves: bytes to GiB, the ceilings on what a user may ask, the environment stamp.
    ("units", "limits", "environment"),
    # Plain records and catalogs; `distributed` is the topology arithmetic (strategies, the
    # counts a cluster offers, NCCL's memory) that settings validate against, so it sits here,
    # below settings, not beside the GPU-count search (search/gpu_count.py).
    ("measurement", "gpus", "models", "distributed"),
    # What a user chose, validated against the catalogs and the topology.
    ("settings",),
    # Read settings and measurements only: the fit rule, the ways-out records the report
    # carries, the tracker and allocator.
    ("fit", "ways_out", "accounting"),
    # Below the step that runs under its rules (the step asks which apply, not the reverse).
    ("cuda_rules",),
    # The training step, built from settings, its optimizer state tracked by accounting.
    ("step",),
    # One step at a batch size, and which batch sizes to try: neither knows the other.
    ("backends", "search"),
    # Arithmetic over a sweep's measurements (search's `best_fit`, the plan, the eval answer).
    ("report",),
    # Questions that run the engine many times (through the door a Session hands them), and the
    # forms a finished report takes.
    ("analyses", "reporting"),
    # The front door, and the saved reports (which read reporting's record).
    ("engine", "history"),
    # Each comes in through the front door: calibration runs, the app's jobs, the public API.
    ("calibration", "service", "__init__"),
    # The consumers.
    ("cli", "ui", "integrations"),
    ("__main__",),
)

UPWARD_ALLOWED = {
    ("memorymark.cuda_rules.bnb_gemm", "memorymark.step.quantization"): (
        "the documented patch: bitsandbytes' 4-bit matmul rule patches the layers quantization "
        "builds"
    ),
}
"""(importer, imported) arrows that go up a floor on purpose, each with its reason."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every memorymark module `name` imports, function-level and type-only (`TYPE_CHECKING`)
    imports included: a type-only import is an arrow too, and a stale one goes unnoticed."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
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


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _unit(module: str) -> str:
    """The package a module belongs to, or its own name at the top level."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _upward(graph: dict[str, set[str]], floors: tuple[tuple[str, ...], ...]) -> list[str]:
    """Each arrow from a unit to one on its own floor or above, as "importer -> imported"."""
    floor = {unit: i for i, units in enumerate(floors) for unit in units}
    return [
        f"{importer} -> {imported}"
        for importer, targets in sorted(graph.items())
        for imported in sorted(targets)
        if _unit(importer) != _unit(imported) and floor[_unit(imported)] >= floor[_unit(importer)]
    ]


def test_the_top_level_holds_the_public_api_only():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == TOP_LEVEL
    assert len(top) <= 12


def test_no_import_cycle():
    assert _cycle(_graph()) is None


def test_type_only_imports_are_arrows_too():
    modules = _modules()
    # engine.py imports `Backend` under TYPE_CHECKING only.
    assert "memorymark.backends.base" in _imports(
        "memorymark.engine", modules["memorymark.engine"], modules
    )


def test_every_unit_has_a_floor():
    units = {_unit(name) for name in _modules()}
    placed = [unit for units in FLOORS for unit in units]
    assert sorted(placed) == sorted(units)  # each once


def test_no_arrow_goes_up_a_floor_except_the_documented_ones():
    upward = _upward(_graph(), FLOORS)
    allowed = [f"{a} -> {b}" for a, b in UPWARD_ALLOWED]
    assert [arrow for arrow in upward if arrow not in allowed] == []
    assert [arrow for arrow in allowed if arrow not in upward] == []  # none stale


def test_the_floor_check_finds_an_arrow_up_and_one_across():
    floors = (("low",), ("high", "side"))
    graph = {
        "memorymark.low.a": {"memorymark.high.b"},
        "memorymark.high.b": {"memorymark.low.a", "memorymark.side.c"},
        "memorymark.side.c": set(),
    }
    assert _upward(graph, floors) == [
        "memorymark.high.b -> memorymark.side.c",
        "memorymark.low.a -> memorymark.high.b",
    ]


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
