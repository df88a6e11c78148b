"""The GPU-count search: the smallest count a cluster offers on which batch 1 trains.

`min_gpus` searches the counts a cluster offers (memorymark/distributed/topology.py) for the
smallest that trains batch 1: a fit of what batch 1 needs against the count, checked, and a
bisection where the fit misses, one simulated batch-1 step per count tried, since per-rank
memory only falls as ranks are added (for DDP it stays). `GpuSearch` is its answer, a plain
value the report carries.

Must not know: how a step is measured (the caller passes `measure`), torch, or how anything is
shown.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memorymark.distributed import topology
from memorymark.settings import Settings
from memorymark.units import gib

if TYPE_CHECKING:
    from memorymark.measurement import Measurement


FIRST_PROBE_GPUS = topology.GPUS_PER_NODE
"""The count `min_gpus` measures second: one node, the first count that spans more than a node
costs more to simulate, and a node's answer alone settles every model that fits in one."""


def with_gpus(settings: Settings, gpus: int) -> Settings:
    """`settings` on `gpus` GPUs, spanning as few nodes as hold them."""
    return settings.replace(gpus=str(gpus), nodes=None)


@dataclass(frozen=True, slots=True)
class GpuSearch:
    """What `min_gpus` found: the smallest count on which batch 1 fits, or None."""

    min_gpus: int | None
    tried: tuple[tuple[int, Measurement], ...]
    """(count, its batch-1 step) for each count simulated, in the order tried."""
    states_bytes: int | None = None
    """The sharded states that ruled out smaller counts unstepped; None when none were."""
    first_count: int | None = None
    """The smallest count a rank's share of `states_bytes` leaves room on (the first stepped)."""

    @property
    def ruled_out_below(self) -> int | None:
        """The count below which the states alone ruled every count out; None where none was."""
        below = self.first_count if self.states_bytes is not None else None
        return below if below is not None and below > 1 else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: the count and each probe's count, verdicts (fits: within the margin;
        runs: within the capacity) and reserved GiB, and the counts the states alone ruled
        out."""
        return {
            "min_gpus": self.min_gpus,
            "states_gb": None if self.states_bytes is None else gib(self.states_bytes),
            "first_count_stepped": self.first_count,
            "searched_counts": [
                {
                    "gpus": n,
                    "fits": m.fits,
                    "runs": m.runs,
                    "required_gb": None if m.required_bytes is None else gib(m.required_bytes),
                    "demand_gb": None if m.demand_bytes is None else gib(m.demand_bytes),
                }
                for n, m in self.tried
            ],
        }


def min_gpus(
    settings: Settings,
    measure: Callable[[Settings], Measurement],
    counts: tuple[int, ...] | None = None,
    limit: Callable[[int], int] | None = None,
    sharded_states: int | None = None,
    known: Mapping[int, Measurement] | None = None,
) -> GpuSearch:
    """The smallest of `counts` (a cluster's, by default) on which batch 1 fits, with
    `measure(settings)` simulating batch 1 of the settings on a count. Fits, as the sweep
    judges its recommendation (within the capacity less the margin), not merely runs: a count
    where batch 1 runs only after a cache flush at 100% leaves the sweep nothing to recommend
    (Llama-3.1-405B on 80 H100s did, and sent the report to its ways out).

    With `sharded_states` (bytes every rank holds a 1/n share of at least: FSDP's weights,
    gradients and optimizer state) and `limit`, a count on which that share alone passes a
    rank's limit is not stepped: Llama-3.1-70B's 1,051 GiB rule out fewer than 16 H100s.

    The smallest count is measured first, then one node's (`FIRST_PROBE_GPUS`), not the
    largest: a simulated FSDP step costs more the more ranks it shards over (Llama-3.1-70B's
    batch 1 took 30 s on 1,024 fake ranks against 3 s on 24, on a 2-core machine). With
    `limit(n)` (the bytes batch 1 may need on a rank of n: the fit policy's capacity less its
    margin), what batch 1 needs is fitted as a + b/n
    through the two counts nearest the answer (sharded states fall as 1/n, the rest stays).
    Fitted through two counts that do not fit, the count before the first one predicted to fit
    is measured first (such fits guess high), then that one if needed; fitted through one on
    each side, the count predicted, and when it fits the count before it: one guess usually
    settles it. Where no fit predicts a count, the search bisects, and the largest
    count is measured only when nothing smaller is known to fit.

    `known` holds counts the caller stepped already (the ways out step the first few in
    order): they are not stepped again, and when two of them do not fit, a + b/n through them
    picks the next count at once, not one node's."""
    known = dict(known or {})
    counts = tuple(sorted({*(counts or topology.cluster_counts()), *known}))
    hw = settings.hardware
    # Only counts the tensor, context and pipeline degrees divide make a layout.
    counts = tuple(n for n in counts if n % hw.model_parallel == 0) or counts
    tried: list[tuple[int, Measurement]] = []
    floor: dict[str, Any] = {}
    if sharded_states is not None and limit is not None:
        room = tuple(n for n in counts if sharded_states <= n * limit(n))
        # None left: the largest count is still stepped, to say how far off it is.
        counts = room or counts[-1:]
        floor = {"states_bytes": sharded_states, "first_count": counts[0]}

    def fits(i: int) -> bool:
        n = counts[i]
        m = known[n] if n in known else measure(with_gpus(settings, n))
        tried.append((n, m))
        return m.fits

    def found(index: int | None) -> GpuSearch:
        return GpuSearch(None if index is None else counts[index], tuple(tried), **floor)

    if fits(0):
        return found(0)
    last = len(counts) - 1
    low, high = 0, None  # counts[low] does not fit; counts[high] fits (None: none known to)
    while high is None and low < last and counts[low + 1] in known:
        if fits(low + 1):
            high = low + 1
        else:
            low += 1
    # One node second, or the next count where the states rule out the first node.
    probe = min(last, max(1, bisect.bisect_left(counts, FIRST_PROBE_GPUS)))
    if low == 0 and high is None and probe > 0:
        if fits(probe):
            high = probe
        else:
            low = probe
    while high is None or high - low > 1:
        top = last + 1 if high is None else high
        guess = _predicted(counts, tried, limit, low, top)
        predicted = guess is not None
        if guess == top and high is not None:
            # The fit says none below the smallest count known to fit does: check the one just
            # below it, not the middle (its fit through the farther counts guessed high).
            guess = high - 1
        elif guess is None or guess == top:
            predicted = False
            guess = last if high is None else (low + high) // 2
        if guess == low:  # only when none is known to fit and low is the largest count
            return found(None)
        if predicted and high is None and guess - 1 > low:
            # Through two counts that do not fit, a + b/n guesses high: the smaller count's
            # need holds more than its share of the states (blocks rounded and split around
            # bigger shards). Llama-3.1-70B's FSDP on H100s, fitted through 16 and 24, guessed
            # 40 where 32 fits; its QLoRA on A10s, through 2 and 3, guessed 7 where 6 does.
            # So the count below the guess goes first: where it fits, the guess is never
            # stepped; where it does not, the guess is stepped next, as many steps as before.
            if fits(guess - 1):
                high = guess - 1
                continue
            low = guess - 1
        if not fits(guess):
            low = guess
            continue
        high = guess
        if predicted and guess - 1 > low:
            if fits(guess - 1):
                high = guess - 1
            else:
                low = guess - 1
    return found(high)


def _predicted(
    counts: tuple[int, ...],
    tried: list[tuple[int, Measurement]],
    limit: Callable[[int], int] | None,
    low: int,
    top: int,
) -> int | None:
    """Index between `low` and `top` (both excluded) of the first count that a + b/n says
    fits, fitted through the two counts tried nearest the answer: the largest that does not
    fit and the smallest that does (or the next largest that does not); `top` when it says
    none of them does, None when there is no fit."""
    if limit is None:
        return None
    # Not `required_bytes`: where batch 1 runs only after a flush it is the capacity it held
    # (405B's "needed" 78.4 GiB on 88 to 160 H100s alike, each fit predicting the next count).
    needs = {n: m.needs_bytes for n, m in tried if m.needs_bytes is not None}
    below = sorted(n for n, m in tried if not m.fits and n in needs)
    above = sorted(n for n, m in tried if m.fits and n in needs)
    points = below[-1:] + above[:1] if above else below[-2:]
    if len(points) < 2 or below[-1:] != [counts[low]]:
        return None
    needs_at = fitted_needs((points[0], needs[points[0]]), (points[1], needs[points[1]]))
    return next((i for i in range(low + 1, top) if needs_at(counts[i]) <= limit(counts[i])), top)


def fitted_needs(one: tuple[int, int], other: tuple[int, int]) -> Callable[[int], float]:
    """What a step needs on n GPUs as a + b/n, through two (count, bytes needed) points: the
    sharded states fall as 1/n, the rest stays."""
    (n1, r1), (n2, r2) = one, other
    b = (r1 - r2) / (1 / n1 - 1 / n2)
    a = r1 - b / n1
    return lambda n: a + b / n
