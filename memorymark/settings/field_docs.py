"""The settings' help text: the string under each field, read once from the source declaring it.

A setting is documented once, in its field's docstring (`sections`, `costs`); the command line's
--help and the app's tooltips take it from `field_help`. Python keeps no attribute docstrings at
run time, so they are read from the module's source with `ast`, once per module.
Must not know: flags, widgets, or how the text is shown.
"""

from __future__ import annotations

import ast
import inspect
import sys
from functools import cache

from memorymark.settings.costs import Costs
from memorymark.settings.sections import SECTIONS


@cache
def _module_docs(module_name: str) -> dict[str, dict[str, str]]:
    """Each class of the module, and each of its fields' docstrings, on one line."""
    try:
        tree = ast.parse(inspect.getsource(sys.modules[module_name]))
    except (OSError, TypeError):  # no source shipped (a frozen app): no help, nothing breaks
        return {}
    docs: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields = docs.setdefault(node.name, {})
        for stmt, after in zip(node.body, node.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                fields[stmt.target.id] = " ".join(after.value.value.split())
    return docs


@cache
def field_help(name: str) -> str:
    """The help of the setting (by its flat name, e.g. "seq_len") or cost named `name`: its
    field's docstring on one line; "" when it has none."""
    for cls in (*SECTIONS.values(), Costs):
        doc = _module_docs(cls.__module__).get(cls.__name__, {}).get(name)
        if doc is not None:
            return doc
    return ""
