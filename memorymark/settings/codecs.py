"""The codecs: settings as URL query parameters and as a command line, and back.

Values travel as strings; `parse_query` turns them back into each field's type (the sections then
validate them), and `command_line` writes the flags memorymark/cli/parser.py reads back into the
same settings. Must not know: the sections themselves (callers pass the field types), torch, or
how anything is shown.
"""

from __future__ import annotations

import shlex
import typing
from collections.abc import Mapping
from typing import Any

from memorymark import limits

# Fields whose CLI flag is not the field's name with dashes; memorymark/cli/setting_flags.py
# makes every flag through `flag_of`, so the command line and `command_line` agree.
_FLAG_NAMES = {
    "gpu_memory_gib": "--gpu-memory",
    "time_limit_seconds": "--time-limit",
    "ways_out_time_limit_seconds": "--ways-out-time-limit",
}


def flag_of(name: str) -> str:
    """The command-line flag of the setting `name` (a flat field name): `--seq-len` for seq_len."""
    return _FLAG_NAMES.get(name, "--" + name.replace("_", "-"))


def to_query(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, value in values.items():
        if value != defaults[name]:
            out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def parse_query(types: Mapping[str, Any], params: Mapping[str, str]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for name, kind in types.items():
        if name not in params:
            continue
        raw = str(params[name])
        try:
            parsed[name] = parse_value(raw, kind)
        except ValueError:
            raise ValueError(f"bad value for {name}: {limits.shown(raw)}") from None
    return parsed


def parse_value(raw: str, kind: Any) -> Any:
    args = typing.get_args(kind)
    if args and type(None) in args:
        if raw in ("", "None", "none", "null"):
            return None
        kind = next(a for a in args if a is not type(None))
    if kind is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(raw)
        return raw.lower() in ("true", "1")
    if kind is int:
        return int(raw)
    if kind is float:
        return float(raw)
    return raw  # str, and a Literal's choices (validated by the section)


def command_line(model: str, query: dict[str, str]) -> str:
    """The `memorymark analyze` command for `model` and the settings' query parameters (the
    fields that differ from the defaults), as the flags the CLI reads back into them."""
    words = ["memorymark", "analyze", shlex.quote(model)]
    for name, value in query.items():
        if name == "model":
            continue
        flag = flag_of(name)
        if value == "true":  # an on/off flag
            words.append(flag)
        elif value != "false":
            words += [flag, shlex.quote(value)]
    return " ".join(words)
