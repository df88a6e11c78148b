"""Which GPU a name means: lookup in the catalog, GPUs outside it, and the one detected here.

Owns `find_gpu` (names and aliases, ignoring case, separators and vendor words, with suggestions),
`gpu_names`, `custom_gpu` (a GPU given only its memory) and `detected_gpu` (the GPU on this
machine, from properties torch reported elsewhere). The record itself lives in
memorymark/gpus/record.py and the catalog's data in memorymark/gpus/catalog.py; callers import
all of them from `memorymark.gpus`.

Must not know torch: the UI and report code import it, so it never imports torch or touches a
device. Nor does it know workloads, search strategies or how anything is displayed.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import replace

from memorymark.gpus.catalog import CATALOG
from memorymark.gpus.record import (
    DEFAULT_BANDWIDTH_BYTES_PER_S,
    DEFAULT_BF16_TFLOPS,
    DEFAULT_FP32_TFLOPS,
    DEFAULT_USD_PER_HOUR,
    GPU,
    MAX_CUSTOM_GIB,
    UNKNOWN_COMPUTE_CAPABILITY,
)
from memorymark.units import GIB


class UnknownGPUError(ValueError):
    """A GPU name the catalog does not know; the message is one line, for the CLI and the UI."""

    def __init__(self, name: str, suggestions: list[str] | None = None) -> None:
        self.name = name
        self.suggestions = suggestions or []
        quoted = [repr(s) for s in self.suggestions]
        maybe = " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)
        hint = f" did you mean {maybe}?" if maybe else ""
        known = ", ".join(gpu_names())
        super().__init__(f"unknown GPU {name!r};{hint} known: {known} (or pass --gpu-memory GIB)")


def _key(name: str) -> str:
    """Lower case, no spaces, dashes or underscores, and no leading vendor words that device
    names carry but users leave out ("NVIDIA GeForce RTX 4090", "Tesla T4")."""
    key = re.sub(r"[\s\-_]+", "", name.lower())
    return re.sub(r"^(?:nvidia|geforce|tesla)+", "", key) or key


def _index() -> dict[str, GPU]:
    index: dict[str, GPU] = {}
    for gpu in CATALOG:
        for label in (gpu.name, *gpu.aliases):
            index.setdefault(_key(label), gpu)
    return index


_INDEX = _index()


def _suggest(key: str, limit: int = 4, cutoff: float = 0.5) -> list[str]:
    """Catalog names whose best label starts with `key` or is close to it (difflib ratio)."""
    best: dict[str, float] = {}
    for label, gpu in _INDEX.items():
        prefix = len(key) >= 2 and label.startswith(key)  # "a100" -> both A100s, first
        score = 2.0 if prefix else difflib.SequenceMatcher(None, key, label).ratio()
        if score >= cutoff and score > best.get(gpu.name, 0.0):
            best[gpu.name] = score
    return sorted(best, key=lambda n: -best[n])[:limit]


def find_gpu(name: str) -> GPU:
    """The catalog GPU called `name` or one of its aliases, ignoring case and separators."""
    key = _key(name)
    if key in _INDEX:
        return _INDEX[key]
    raise UnknownGPUError(name, _suggest(key))


def gpu_names() -> list[str]:
    """Display names of the catalog, in catalog order."""
    return [gpu.name for gpu in CATALOG]


def custom_gpu(
    total_gib: float,
    *,
    name: str | None = None,
    usd_per_hour: float = DEFAULT_USD_PER_HOUR,
    bf16_tflops: float = DEFAULT_BF16_TFLOPS,
    fp32_tflops: float = DEFAULT_FP32_TFLOPS,
    memory_bandwidth_bytes_per_s: float = DEFAULT_BANDWIDTH_BYTES_PER_S,
) -> GPU:
    """A GPU outside the catalog with `total_gib` GiB as PyTorch reports total_memory.

    Its compute capability is unknown, so it is treated as Ampere (8, 0) for the overheads.
    """
    if not math.isfinite(total_gib) or total_gib <= 0 or total_gib > MAX_CUSTOM_GIB:
        raise ValueError(
            f"GPU memory must be between 0 and {MAX_CUSTOM_GIB:g} GiB, got {total_gib}"
        )
    return GPU(
        name=name or f"Custom {total_gib:g} GiB",
        total_bytes=int(total_gib * GIB),
        usd_per_hour=usd_per_hour,
        bf16_tflops=bf16_tflops,
        fp32_tflops=fp32_tflops,
        memory_bandwidth_bytes_per_s=memory_bandwidth_bytes_per_s,
        compute_capability=UNKNOWN_COMPUTE_CAPABILITY,
    )


def detected_gpu(name: str, total_bytes: int, compute_capability: tuple[int, int]) -> GPU:
    """The GPU on this machine, from the properties torch reported (passed in, never queried here).

    A device the catalog knows keeps the catalog's display name, price and peak rates; its memory
    and compute capability are the device's own. An unknown device gets the custom defaults.
    """
    major, minor = compute_capability
    try:
        known = find_gpu(name)
    except UnknownGPUError:
        return GPU(
            name=name,
            total_bytes=total_bytes,
            usd_per_hour=DEFAULT_USD_PER_HOUR,
            bf16_tflops=DEFAULT_BF16_TFLOPS,
            memory_bandwidth_bytes_per_s=DEFAULT_BANDWIDTH_BYTES_PER_S,
            compute_capability=(int(major), int(minor)),
            measured=True,
        )
    aliases = known.aliases if name in known.aliases else (*known.aliases, name)
    return replace(
        known,
        total_bytes=total_bytes,
        compute_capability=(int(major), int(minor)),
        aliases=aliases,
        measured=True,
    )
