"""The config.json a `file:` run trained, kept with the run so the run reopens without the file.

A run saved from `memorymark analyze --config-file PATH` (or an app upload) names its model
`file:PATH`, and rebuilding its report reads that file again (the model's name and tasks). The
file can be gone by then (a temporary folder), changed since, or not readable where the run is
reopened: the app reads config files only from its upload folder (memorymark/models/sources.py
`restrict_config_files`), so its History page refused every CLI run with a config file. So each
such run keeps a copy of the config's contents in its record (`copy_of`), and reopening writes
that copy where the reader can read it (`readable`) when the file itself will not do.
Runs saved before this kept no copy: they reopen from the file while it is there, unchanged.
Must not know how a report is shown; imports no torch.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from memorymark.models import config_checks, sources

RECORD_KEY = "config_file"
"""The record's entry for the copy: {"path": the file the run named, "data": its contents}."""

DEFAULT_FOLDER = Path(tempfile.gettempdir()) / "memorymark-history-configs"
"""Where a copy is written back when the reader names no folder (the CLI, the Python API)."""


def copy_of(model: str) -> dict[str, Any] | None:
    """The record entry for a `file:` model's config (its absolute path and contents); None
    for any other model, or a file that cannot be read any more (the run is saved without)."""
    if not model.startswith("file:"):
        return None
    path = Path(model.removeprefix("file:")).expanduser()
    try:
        data = config_checks.read_config(path)
    except config_checks.ConfigError:
        return None
    return {"path": str(path.absolute()), "data": data}


def readable(record: dict[str, Any], folder: Path | None = None) -> tuple[dict[str, Any], str]:
    """`record` as it can be reopened here, and a line saying why it changed ("" if it did
    not): when the config file it names is gone, changed since, or not readable here, the
    copy kept with it is written under `folder` (the reader's; DEFAULT_FOLDER when None) and
    the record's model names that copy."""
    saved = record.get(RECORD_KEY)
    if not saved:
        return record, ""
    named = record["settings"]["model"].removeprefix("file:")
    state = _state(Path(named).expanduser(), saved["data"])
    if state == "unchanged" and _readable_here(record["settings"]["model"]):
        return record, ""
    copy = _write(saved["data"], Path(named).stem, folder or DEFAULT_FOLDER)
    why = {"gone": "is gone", "changed": "has changed since"}.get(state, "is not readable here")
    note = f"{named} {why}: this run reopened with the copy of its config saved with it ({copy})"
    settings = {**record["settings"], "model": f"file:{copy}"}
    return {**record, "settings": settings}, note


def _state(path: Path, data: dict[str, Any]) -> str:
    """unchanged, changed or gone: the file at `path` against the contents saved."""
    try:
        return "unchanged" if config_checks.read_config(path) == data else "changed"
    except config_checks.ConfigError:
        return "gone"


def _readable_here(model: str) -> bool:
    """Whether this process reads the `file:` model (the app refuses files outside its uploads)."""
    from memorymark import models

    try:
        models.find_model(model)
    except ValueError:
        return False
    return True


def _write(data: dict[str, Any], stem: str, folder: Path) -> Path:
    """The copy as a file, saved as the app saves an upload (`sources.save_config`: one
    folder per content, so reopening twice writes it once)."""
    text = json.dumps(data, indent=2).encode()
    return sources.save_config(stem, text, folder) / sources.UPLOAD_FILE
