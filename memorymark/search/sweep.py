"""The generator that yields each measurement the moment it lands, and the answer it adds up to.

`sweep()` asks a strategy (memorymark/search/strategies.py) for batch sizes one at a time, measures
each on a backend, shows the strategy the result and yields it, so a UI can draw every probe
live. It yields too what the strategy has without a probe (the symbolic strategy's replays,
memorymark/search/symbolic.py), which no limit counts. The backend is released however the
consumer stops. `SweepLimits` ends a sweep early at a wall time or a probe count and says which
one did. `best_fit` reads the answer off the measurements. This module knows nothing about models
or devices: a backend is anything with `measure(batch_size)` and `release()`.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Protocol

from memorymark.measurement import Measurement
from memorymark.search.strategies import Strategy


class Measurer(Protocol):
    """What a sweep needs from a backend."""

    def measure(self, batch_size: int) -> Measurement: ...

    def release(self) -> None: ...


@dataclass(slots=True, kw_only=True)
class SweepLimits:
    """When a sweep must stop before its strategy is done; `stopped_by` says which limit did.

    The time limit is checked before each probe: a probe is not started when the time spent plus
    the last probe's duration would pass it (a probe cannot be stopped half-way in-process; a
    worker process that overruns anyway is killed by its pool)."""

    time_limit_seconds: float | None = None
    max_probes: int | None = None
    stopped_by: str | None = None
    """None while the strategy decides; else "the time limit (N s)" or "the probe limit (N)"."""

    def allows_next(self, probes: int, elapsed_seconds: float, last_seconds: float) -> bool:
        """True when one more probe stays within both limits (records which one it would pass)."""
        if self.max_probes is not None and probes >= self.max_probes:
            self.stopped_by = f"the probe limit ({self.max_probes} probes)"
        elif self.time_limit_seconds is not None and (
            elapsed_seconds + last_seconds > self.time_limit_seconds
        ):
            self.stopped_by = f"the time limit ({self.time_limit_seconds:g} s)"
        return self.stopped_by is None


def sweep(
    backend: Measurer,
    strategy: Strategy,
    *,
    also: tuple[int, ...] = (),
    limits: SweepLimits | None = None,
) -> Generator[Measurement, None, None]:
    """Yield one Measurement per batch size tried, in the order tried.

    `also` lists batch sizes the report needs measured too (the user's current batch); they are
    measured after the search unless the search already did. `limits` ends the sweep early (its
    `stopped_by` then says why), leaving a partial answer in what was yielded.
    The backend is released however the consumer stops: use `contextlib.closing(sweep(...))`
    to stop early.
    """
    limits = limits or SweepLimits()
    start, last, probes = time.perf_counter(), 0.0, 0

    def proposals() -> Iterator[int]:
        yield from strategy.propose()
        # Measured even past a failure: a batch that does not fit says what it would need.
        yield from (b for b in also if b not in strategy.results)

    try:
        for batch_size in proposals():
            yield from strategy.settled()
            measurement = strategy.replayed(batch_size)
            if measurement is None:
                if not limits.allows_next(probes, time.perf_counter() - start, last):
                    return
                began = time.perf_counter()
                measurement = backend.measure(batch_size)
                last, probes = time.perf_counter() - began, probes + 1
            strategy.observe(measurement)
            yield measurement
        yield from strategy.settled()
    finally:
        backend.release()


def best_fit(measurements: list[Measurement], *, runs: bool = False) -> Measurement | None:
    """The largest batch measured as fitting (or, with `runs`, as running with no margin)
    below every batch measured as not doing so."""

    def passes(m: Measurement) -> bool:
        return bool(m.runs) if runs else m.fits

    ceiling = min((m.batch_size for m in measurements if not passes(m)), default=None)
    ok = [m for m in measurements if passes(m) and (ceiling is None or m.batch_size < ceiling)]
    return max(ok, key=lambda m: m.batch_size, default=None)
