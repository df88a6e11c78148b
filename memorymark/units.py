"""Bytes and the units people read them in: the one place bytes become GiB or MiB.

GiB is 2**30 bytes and MiB 2**20 everywhere, the JSON keys ending in `_gb` included (they keep
the original API's names). Engine code carries bytes (`peak_bytes`, `capacity_bytes`) and
converts only where a person or the JSON contract reads the figure; counts a person reads say
`1 GPU`, never `1 GPUs` (`plural`). No torch, no I/O.
"""

from __future__ import annotations

GIB = 2**30
MIB = 2**20


def in_gib(n_bytes: float) -> float:
    """Bytes as GiB, unrounded: for a chart's axis or a message that formats the figure itself."""
    return n_bytes / GIB


def gib(n_bytes: float, digits: int = 3) -> float:
    """Bytes as GiB, rounded for display and JSON."""
    return round(n_bytes / GIB, digits)


def gib_or_none(n_bytes: int | None) -> float | None:
    """`gib`, or None for a figure that is not known (JSON's null)."""
    return None if n_bytes is None else gib(n_bytes)


def gib_text(n_bytes: float) -> str:
    """Bytes as a GiB figure a person reads: two decimals from 1 GiB (`20.19 GiB`), three
    significant digits below (`0.0123 GiB`), so a tiny model's figure is not `0.00 GiB`."""
    value = n_bytes / GIB
    return f"{value:.2f} GiB" if value >= 1 else f"{value:.3g} GiB"


def size_text(n_bytes: float) -> str:
    """Bytes for a message: GiB from 1 GiB up, else MiB (`2.00 GiB`, `12.5 MiB`)."""
    return f"{n_bytes / GIB:.2f} GiB" if n_bytes >= GIB else f"{n_bytes / MIB:.1f} MiB"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """A count and its noun, singular for one: `1 GPU`, `8 GPUs`, `1 probe`, `1,024 GPUs`
    (`nouns`: the plural when it is not the noun and an s)."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"
