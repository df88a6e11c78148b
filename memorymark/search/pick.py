"""Which strategy searches: the settings' name, over what a measurer can do.

`pick_strategy` is the one place a strategy is made from its name (`--strategy`): `linear` and
`fast` as they are; `symbolic` replays where the measurer keeps records of its traced steps (a
simulation: `keep_records()`), replays alone where the step was traced and confirmed elsewhere
(`confirmed`: another GPU of the same kernels), and else searches as `fast` and says why
(`why_not`). The engine's sweeps and Compare GPUs both ask it. Must not know how a measurement
is taken, models, devices, or how anything is shown.
"""

from __future__ import annotations

from typing import Any

from memorymark.measurement import Measurement
from memorymark.search.strategies import STRATEGY_CLASSES, Strategy
from memorymark.search.symbolic import Replayer, SymbolicStrategy


def pick_strategy(
    name: str,
    measurer: object,
    *,
    step: int,
    max_batch: int,
    capacity_bytes: int,
    limit_bytes: int,
    degree: int = 1,
    why_not: str | None = None,
    confirmed: Replayer | None = None,
    traces: tuple[Measurement, Measurement] | None = None,
    find_max: bool | None = None,
    floor_bytes: int = 0,
) -> Strategy:
    """The strategy `name` over `measurer`'s axis, within the fit policy's `capacity_bytes` and
    `limit_bytes`, on the grid `step`..`max_batch`. For `symbolic`: `degree` of its polynomials
    (2 for a sequence length), `why_not` what its fallback says when the measurer keeps no
    records, `confirmed` a replayer whose step was confirmed elsewhere (nothing traced then).
    `traces` (two borrowed steps) and `find_max` (False: stop at the recommended batch) are the
    fast strategy's, and so the symbolic one's; left out, each strategy's default.
    `floor_bytes`: what every batch's step holds at least (the model's states), when known;
    past the capacity, every strategy traces batch 1 alone."""
    # The fast strategy's own options, passed only when given (the linear one takes none).
    fast: dict[str, Any] = {}
    limits = dict(capacity_bytes=capacity_bytes, limit_bytes=limit_bytes, floor_bytes=floor_bytes)
    if traces is not None:
        fast["traces"] = traces
    if find_max is not None:
        fast["find_max"] = find_max
    if name != "symbolic":
        return STRATEGY_CLASSES[name](step=step, max_batch=max_batch, **limits, **fast)
    # A step confirmed elsewhere is replayed alone; else this measurer's records, if it keeps any.
    replayer = confirmed
    keep_records = getattr(measurer, "keep_records", None)
    if replayer is None and keep_records is not None:
        replayer = keep_records()
    return SymbolicStrategy(
        replayer=replayer,
        confirmed=confirmed is not None,
        degree=degree,
        why_not=why_not,
        step=step,
        max_batch=max_batch,
        **limits,
        **fast,
    )
