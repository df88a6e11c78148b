"""The environment a calibration row was measured in: GPU, driver, CUDA, torch, MemoryMark.

Every calibration row carries these stamps so a file contributed from another machine can be
read, and disagreements traced to a driver, a CUDA build or a MemoryMark revision. Each stamp is
best effort: an empty string when it cannot be read, never an exception, so a missing NVML
library or a tarball install costs a stamp, not the measurements. This module knows nothing
about how anything is measured; it is handed the `torch.cuda`-like module to read the GPU from.
"""

from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import memorymark
from memorymark.environment import memorymark_version

# The checkout this package was imported from, when it runs from a git working tree.
_SOURCE_ROOT = Path(memorymark.__file__).resolve().parents[1]
# git answers in milliseconds; a hung network filesystem must not hold a calibration hostage.
_GIT_TIMEOUT_SECONDS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class Environment:
    """Where and with what a calibration ran (every field a string or bytes count)."""

    gpu_name: str
    """The device's own name (`get_device_properties(0).name`), e.g. "NVIDIA A10"."""
    gpu_total_bytes: int
    """Its total memory as `get_device_properties(0).total_memory` reports it."""
    emulated_gpu: str
    """The catalog GPU whose capacity the process was capped to (--emulate-gpu), else empty."""
    torch_version: str
    """`torch.__version__`."""
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


def environment(cuda: Any, emulated_gpu: str = "", *, nvml: Any = None) -> Environment:
    """Stamps for this process on CUDA device 0 of `cuda` (torch.cuda, or a fake in tests)."""
    props = cuda.get_device_properties(0)
    return Environment(
        gpu_name=str(props.name),
        gpu_total_bytes=int(props.total_memory),
        emulated_gpu=emulated_gpu,
        torch_version=str(torch.__version__),
        cuda_version=torch.version.cuda or "",
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
        if nvml is None:
            import pynvml as nvml  # optional: not a dependency of MemoryMark
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
