"""The time the search for ways out may take: its own budget, apart from the sweep's.

When nothing fits, the ways out (memorymark/analyses/fixes.py) count states and simulate steps,
each seconds to a minute for a large model, after the sweep's own probes: Llama-3.1-70B on an
A10 takes its five probes in about a minute and the ways out several more. A budget of their own
means a sweep that spent its time limit still gets them, and a search that runs long stops
between two pieces of work and says so, instead of being killed in the middle of one.

`TimeBudget` runs each costly call (`spend`) only when the time spent plus the last call of its
kind stays within the limit, as `SweepLimits` checks a probe (memorymark/search/sweep.py): a
step cannot be stopped half-way in-process. Past it, `OutOfTime` is raised and `stopped_by`
says which limit. Must not know what is being timed; imports no torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


class OutOfTime(Exception):
    """The next piece of work would pass the budget: the search stops before it."""


@dataclass(slots=True, kw_only=True)
class TimeBudget:
    """Wall time a search may take (None: no limit), read from `clock` (a test's fake one)."""

    time_limit_seconds: float | None = None
    clock: Callable[[], float] = time.perf_counter
    stopped_by: str | None = None
    """None while within the limit; "the time limit (N s)" once a call would have passed it."""
    _start: float | None = None
    _last: dict[str, float] = field(default_factory=dict)

    @property
    def elapsed_seconds(self) -> float:
        """Seconds since the first check (0 before it)."""
        return 0.0 if self._start is None else self.clock() - self._start

    def check(self, kind: str = "") -> None:
        """Raise `OutOfTime` when the time spent plus the last call of `kind` (none yet: zero)
        would pass the limit; the clock starts at the first check."""
        if self._start is None:
            self._start = self.clock()
        limit = self.time_limit_seconds
        if self.stopped_by is None and limit is not None:
            if self.elapsed_seconds + self._last.get(kind, 0.0) > limit:
                self.stopped_by = f"the time limit ({limit:g} s)"
        if self.stopped_by is not None:
            raise OutOfTime(self.stopped_by)

    def spend(self, kind: str, call: Callable[..., T], *args: object) -> T:
        """`call(*args)` when it should end within the limit (judged by the last call of
        `kind`), timed for the next one; else `OutOfTime`."""
        self.check(kind)
        began = self.clock()
        try:
            return call(*args)
        finally:
            self._last[kind] = self.clock() - began
