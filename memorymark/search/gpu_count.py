"""The GPU-count search: the smallest count a cluster offers on which batch 1 trains.

`min_gpus` searches the counts a cluster offers (memorymark/distributed/topology.py) for the
smallest that trains batch 1: a bisection over them, one simulated batch-1 step per count
tried, since per-rank memory only falls as ranks are added (for DDP it stays, so one count
answers). `GpuSearch` is its answer, a plain value the report carries.

Must not know: how a step is measured (the caller passes `measure`), torch, or how anything is
shown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memorymark.distributed import topology
from memorymark.settings import Settings
from memorymark.units import gib

if TYPE_CHECKING:
    from memorymark.measurement import Measurement


def with_gpus(settings: Settings, gpus: int) -> Settings:
    """`settings` on `gpus` GPUs, spanning as few nodes as hold them."""
    return settings.replace(gpus=str(gpus), nodes=None)


@dataclass(frozen=True, slots=True)
class GpuSearch:
    """What `min_gpus` found: the smallest count that trains batch 1, or None."""

    min_gpus: int | None
    tried: tuple[tuple[int, Measurement], ...]
    """(count, its batch-1 step) for each count simulated, in the order tried."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: the count and each probe's count, verdict and reserved GiB."""
        return {
            "min_gpus": self.min_gpus,
            "searched_counts": [
                {
                    "gpus": n,
                    "runs": m.runs,
                    "required_gb": None if m.required_bytes is None else gib(m.required_bytes),
                }
                for n, m in self.tried
            ],
        }


def min_gpus(
    settings: Settings,
    measure: Callable[[Settings], Measurement],
    counts: tuple[int, ...] | None = None,
    capacity: Callable[[int], int] | None = None,
) -> GpuSearch:
    """The smallest of `counts` (a cluster's, by default) on which batch 1 runs, with
    `measure(settings)` simulating batch 1 of the settings on a count.

    Both ends are measured first. With `capacity(n)` (the bytes a rank of n may reserve), what
    batch 1 needs is then fitted as a + b/n through them (sharded states fall as 1/n, the rest
    stays), the first count predicted to fit is checked with the count before it, and the search
    bisects from there only when the prediction missed: about four traces instead of nine."""
    counts = counts or topology.cluster_counts()
    tried: list[tuple[int, Measurement]] = []

    def runs(i: int) -> bool:
        m = measure(with_gpus(settings, counts[i]))
        tried.append((counts[i], m))
        return bool(m.runs)  # (None, not known, does not run)

    if runs(0):
        return GpuSearch(counts[0], tuple(tried))
    last = len(counts) - 1
    if last == 0 or not runs(last):
        return GpuSearch(None, tuple(tried))
    low, high = 0, last  # counts[low] fails, counts[high] runs
    guess = _predicted(counts, tried, capacity)
    if guess is not None and low < guess < high:
        if runs(guess):
            high = guess
            if guess - 1 > low:
                if runs(guess - 1):
                    high = guess - 1
                else:
                    low = guess - 1
        else:
            low = guess
    while high - low > 1:
        mid = (low + high) // 2
        if runs(mid):
            high = mid
        else:
            low = mid
    return GpuSearch(counts[high], tuple(tried))


def _predicted(
    counts: tuple[int, ...],
    tried: list[tuple[int, Measurement]],
    capacity: Callable[[int], int] | None,
) -> int | None:
    """Index of the first count that a + b/n, through the two ends tried, says fits."""
    (n1, m1), (n2, m2) = tried[0], tried[-1]
    if capacity is None or m1.required_bytes is None or m2.required_bytes is None:
        return None
    b = (m1.required_bytes - m2.required_bytes) / (1 / n1 - 1 / n2)
    a = m1.required_bytes - b / n1
    return next((i for i, n in enumerate(counts) if a + b / n <= capacity(n)), None)
