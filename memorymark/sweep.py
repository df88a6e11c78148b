"""The generator that yields each measurement the moment it lands, and the answer it adds up to.

`sweep()` asks a strategy (memorymark/strategies.py) for batch sizes one at a time, measures
each on a backend, shows the strategy the result and yields it, so a UI can draw every probe
live; the backend is released however the consumer stops. `best_fit` reads the answer off the
measurements. This module knows nothing about models or devices: a backend is anything with
`measure(batch_size)`, `capacity_bytes` and `release()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from memorymark.measurement import Measurement
from memorymark.strategies import Strategy


class Measurer(Protocol):
    """What a sweep needs from a backend."""

    capacity_bytes: int

    def measure(self, batch_size: int) -> Measurement: ...

    def release(self) -> None: ...


def sweep(
    backend: Measurer, strategy: Strategy, *, also: tuple[int, ...] = ()
) -> Iterator[Measurement]:
    """Yield one Measurement per batch size tried, in the order tried.

    `also` lists batch sizes the report needs measured too (the user's current batch); they are
    measured after the search unless the search already did.
    The backend is released however the consumer stops: use `contextlib.closing(sweep(...))`
    to stop early.
    """
    try:
        for batch_size in strategy.propose():
            measurement = backend.measure(batch_size)
            strategy.observe(measurement)
            yield measurement
        for batch_size in also:
            # Measured even past a failure: a batch that does not fit says what it would need.
            if batch_size not in strategy.results:
                measurement = backend.measure(batch_size)
                strategy.observe(measurement)
                yield measurement
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
