"""The environment stamp every finished analysis carries: which versions ran it, where, and when.

A report without a stamp cannot be compared with another a month later: a torch release moves
the allocator, a MemoryMark release moves a rule. So the JSON report, the CSV of probes, the
Markdown report and the history all carry the same stamp: MemoryMark, torch and transformers
versions, Python, the platform, the backend and device, and the time in UTC the analysis ended.

Versions are read from the installed distributions' metadata (`importlib.metadata`), so this
module imports neither torch nor transformers, and the UI and the history can use it. Each
stamp is best effort: "" when a version cannot be read, never an exception. Must not know how
anything is measured or shown.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import platform
import sys
from dataclasses import asdict, dataclass, fields
from typing import Any

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""ISO 8601 in UTC with a Z: sorts as text, and reads the same on every machine."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Stamp:
    """Where and with what one analysis ran (every field a string)."""

    memorymark_version: str
    torch_version: str
    transformers_version: str
    python_version: str
    platform: str
    """`platform.platform(terse=True)`, e.g. "Linux-6.1" or "macOS-14.4"."""
    backend: str
    """cuda, mps, sim or cpu."""
    device: str
    """The GPU the figures answer for (its catalog name, or the detected device's)."""
    memory_source: str
    """measured or simulated."""
    finished_utc: str
    """When the analysis ended, in TIME_FORMAT."""

    def to_dict(self) -> dict[str, str]:
        """The stamp as JSON keys (the reports' `environment` object)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Stamp:
        """The inverse of `to_dict`; keys a later version added are ignored, missing ones ""."""
        return cls(**{f.name: str(data.get(f.name) or "") for f in fields(cls)})


def utc_now() -> str:
    """The time now, in TIME_FORMAT."""
    return dt.datetime.now(dt.timezone.utc).strftime(TIME_FORMAT)


def package_version(name: str) -> str:
    """An installed distribution's version, or "" when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def stamp(
    *,
    backend: str,
    device: str,
    memory_source: str,
    torch_version: str | None = None,
    finished_utc: str | None = None,
) -> Stamp:
    """The stamp of an analysis that ended now (or at `finished_utc`).

    `torch_version` is the imported torch's own `__version__` when the caller has it (it keeps
    a local build's suffix, "2.13.0+cu128"); else the installed distribution's."""
    return Stamp(
        memorymark_version=memorymark_version(),
        torch_version=torch_version or package_version("torch"),
        transformers_version=package_version("transformers"),
        python_version=platform.python_version(),
        platform=platform.platform(terse=True),
        backend=backend,
        device=device,
        memory_source=memory_source,
        finished_utc=finished_utc or utc_now(),
    )


def memorymark_version() -> str:
    """The installed distribution's version; the source tree's `__version__` when MemoryMark
    runs from a checkout that was never installed. That one is read from the loaded package
    (always loaded before any of its modules) rather than imported: the package's `__init__`
    imports the engine, which imports this module."""
    installed = package_version("memorymark")
    return installed or str(getattr(sys.modules.get("memorymark"), "__version__", ""))
