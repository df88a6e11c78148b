"""Where and with what something ran: the one place that reads versions, drivers and commits.

A figure without its environment cannot be compared with another a month later: a torch release
moves the allocator, a MemoryMark release moves a rule. Two records carry it, each the contract
of its own file format, both read through the same functions here:

- `Stamp`, which every finished analysis carries (the JSON report's `environment` object, the
  CSV of probes, the Markdown report, the history): MemoryMark, torch and transformers versions,
  Python, the platform, the backend and device, and the time in UTC the analysis ended;
- `GpuEnvironment`, which every calibration row carries (docs/calibration/'s columns): the real
  GPU, the one it emulated, torch and its CUDA build, the NVIDIA driver, MemoryMark and the git
  commit it ran from.

Versions come from the imported module when it is loaded (a local build keeps its suffix,
"2.13.0+cu128"), else from the installed distribution's metadata (`importlib.metadata`), so
importing this module loads neither torch nor transformers, and the UI and the history can use
it. Each field is best effort: "" when it cannot be read, never an exception. Must not know how
anything is measured or shown.
"""

from __future__ import annotations

import datetime as dt
import importlib
import importlib.metadata
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

# The checkout this package runs from, when it runs from a git working tree.
_SOURCE_ROOT = Path(__file__).resolve().parents[1]
# git answers in milliseconds; a hung network filesystem must not hold a calibration hostage.
_GIT_TIMEOUT_SECONDS = 5

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


def torch_version() -> str:
    """The torch this process runs: the imported module's `__version__` when torch is loaded
    (it keeps a local build's suffix, "2.13.0+cu128"), else the installed distribution's."""
    torch = sys.modules.get("torch")
    version = getattr(torch, "__version__", None)
    return str(version) if version else package_version("torch")


def stamp(
    *,
    backend: str,
    device: str,
    memory_source: str,
    finished_utc: str | None = None,
) -> Stamp:
    """The stamp of an analysis that ended now (or at `finished_utc`)."""
    return Stamp(
        memorymark_version=memorymark_version(),
        torch_version=torch_version(),
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


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuEnvironment:
    """Where and with what a calibration row was measured (strings and a byte count)."""

    gpu_name: str
    """The device's own name (`get_device_properties(0).name`), e.g. "NVIDIA A10"."""
    gpu_total_bytes: int
    """Its total memory as `get_device_properties(0).total_memory` reports it."""
    emulated_gpu: str
    """The catalog GPU whose capacity the process was capped to (--emulate-gpu), else empty."""
    torch_version: str
    """`torch_version()`: the imported torch's `__version__`."""
    cuda_version: str
    """The CUDA version torch was built with (`torch.version.cuda`); empty for a CPU build."""
    driver_version: str
    """The NVIDIA display driver (NVML's `nvmlSystemGetDriverVersion`), empty without NVML."""
    memorymark_version: str
    """The installed package's version, else `memorymark.__version__`."""
    git_commit: str
    """HEAD of the working tree MemoryMark ran from, "-dirty" appended when tracked files were
    modified; empty when it is not a git checkout."""

    def to_dict(self) -> dict[str, Any]:
        """The stamps as columns, in a fixed order."""
        return asdict(self)


def gpu_environment(cuda: Any, emulated_gpu: str = "", *, nvml: Any = None) -> GpuEnvironment:
    """Stamps for this process on CUDA device 0 of `cuda` (torch.cuda, or a fake in tests)."""
    props = cuda.get_device_properties(0)
    torch = sys.modules.get("torch")  # loaded: a calibration runs on it
    return GpuEnvironment(
        gpu_name=str(props.name),
        gpu_total_bytes=int(props.total_memory),
        emulated_gpu=emulated_gpu,
        torch_version=torch_version(),
        cuda_version=str(getattr(getattr(torch, "version", None), "cuda", None) or ""),
        driver_version=driver_version(nvml),
        memorymark_version=memorymark_version(),
        git_commit=git_commit(),
    )


def driver_version(nvml: Any = None) -> str:
    """The NVIDIA driver version ("550.54.15") from NVML, or "" when NVML cannot say.

    PyTorch has no public call for it (`torch.utils.collect_env` parses `nvidia-smi`; torch.cuda
    reads NVML through the optional `pynvml` module, package nvidia-ml-py, for utilization and
    the like), so this asks NVML as NVIDIA documents it: `nvmlInit`, then
    `nvmlSystemGetDriverVersion` (a string; bytes in older pynvml releases), then
    `nvmlShutdown`. `nvml` replaces the pynvml module in tests.
    """
    try:
        if nvml is None:  # optional: not a dependency of MemoryMark
            nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
        try:
            version = nvml.nvmlSystemGetDriverVersion()
        finally:
            nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML, no driver, or an NVMLError: no stamp, no failure
        return ""
    return version.decode() if isinstance(version, bytes) else str(version)


def git_commit(root: Path = _SOURCE_ROOT) -> str:
    """HEAD of the git working tree at `root` ("-dirty" appended when tracked files differ from
    it), or "" when `root` is not the top of a git checkout or git cannot answer."""
    if not (root / ".git").exists():  # an installed package's folder may sit inside some repo
        return ""
    commit = _git(root, "rev-parse", "HEAD")
    if not commit:
        return ""
    changes = _git(root, "status", "--porcelain", "--untracked-files=no")
    return f"{commit}-dirty" if changes else commit


def _git(root: Path, *args: str) -> str:
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""
