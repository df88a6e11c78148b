"""The symbolic strategy: trace two batch sizes, replay every other one, trace the answer.

A simulated step's sizes are polynomials of the batch (memorymark/accounting/symbolic.py), so
two traced steps give every figure of the step at any batch size by arithmetic, and the caching
allocator's replay judges it in milliseconds where a traced probe takes a second. The strategy
traces the fast strategy's first two probes, searches on replays exactly as the fast strategy
searches on traces (the same proposals, the same verdicts), then traces the answer and compares
it with its replay entry by entry. When they agree, the replays are the sweep's answer; when the
traces do not align, a replay has no whole-byte sizes, or the answer's trace differs, the search
goes on with traced probes from what it has, and `fallback` says why.

When the first grid point does not fit (a big model: a 70B one under FSDP, say), the fast
strategy's own descent below it is traced until a size fits; the fit goes through that size
and the smallest that did not (the allocator replay, not the step, said it does not fit, so its
trace is whole), and the search below the grid runs on replays too. Only when nothing fits
below it is every probe traced. A sequence-length search fits polynomials of degree 2 through
three traces (attention scores grow with the square), and traces every probe when its first
lengths do not fit.

It needs a `Replayer` (a simulated backend, or a measurer over another axis, that keeps what
each traced step leaves); without one (a real GPU measures every probe) it is the fast strategy.
This module knows nothing about models, devices or how a replay is computed.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from itertools import chain
from typing import Protocol

from memorymark.measurement import Measurement
from memorymark.search.strategies import FastStrategy
from memorymark.search.sweep import best_fit
from memorymark.units import size_text


class Replayer(Protocol):
    """What the symbolic strategy asks of the measurer (memorymark/accounting/symbolic.py
    `Replays`): keep a traced probe, fit a symbolic step, replay, compare."""

    def keep(self, value: int) -> None:
        """Keep what the probe just traced at `value` left."""

    def fit(self, points: tuple[int, ...]) -> str | None:
        """Fit the symbolic step through the probes kept at `points`; why not, or None."""

    def replay(self, value: int) -> Measurement | None:
        """The step at `value` read off the fitted one; None when it has no whole sizes."""

    def disagreement(self, value: int) -> str | None:
        """Where the probe traced at `value` differs from its replay; None when it does not."""

    def size_disagreement(self, value: int) -> str | None:
        """Where the allocations of the probe traced at `value` differ from its replay."""


class SymbolicStrategy(FastStrategy):
    """The fast strategy's search run on replays, between two traces and the traced answer."""

    def __init__(
        self,
        *,
        replayer: Replayer | None,
        degree: int = 1,
        why_not: str | None = None,
        confirmed: bool = False,
        **options: object,
    ) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.replayer = replayer
        self.confirmed = confirmed and replayer is not None
        """The replayer's step was traced and confirmed elsewhere (another GPU of the same
        kernels, Compare GPUs): search on replays alone, tracing nothing."""
        self.degree = degree
        """The polynomials' degree: 1 for the batch, 2 for a sequence length."""
        self.fallback: str | None = why_not if replayer is None else None
        """Why the search measured with traced probes instead of replays; None when it
        replayed (or has not decided yet)."""
        self._trusted = False
        self._pending: list[Measurement] = []

    def observe(self, measurement: Measurement) -> None:
        """Record a result and, for a traced probe, keep what its step left."""
        super().observe(measurement)
        if self.replayer is not None and not measurement.replayed:
            self.replayer.keep(measurement.batch_size)

    @property
    def trusted(self) -> bool:
        """True once the answer's trace agreed with its replay (or the step was confirmed
        elsewhere): every replay of this step may stand for a trace."""
        return self._trusted

    def settled(self) -> list[Measurement]:
        """Replays the strategy vouches for since the last call (the traced answer agreed)."""
        pending, self._pending = self._pending, []
        return pending

    def replayed(self, batch_size: int) -> Measurement | None:
        """A batch size asked after the search, replayed once the answer's trace agreed."""
        if not self._trusted or self.replayer is None:
            return None
        return self.replayer.replay(batch_size)

    def propose(self) -> Iterator[int]:
        """The traces, the traced answer, and traced probes only where replays do not hold."""
        if self.hopeless:
            self.fallback = (
                f"the model's states alone ({size_text(self.floor_bytes)}) pass the "
                f"{size_text(self.capacity_bytes)} a step may use, so batch 1 was the one probe"
            )
            yield 1
            return
        if self.confirmed:
            replays = self._search()
            if replays is None:
                yield from super().propose()
                return
            self._settle(replays)
            return
        if self.replayer is None or self._borrowed:
            yield from super().propose()
            return
        odd = yield from self._fitted()
        replays = None if self.fallback else self._search()
        if replays is None:
            yield from self._traced(*self._bounds(self._fits))
            return
        answer_so_far = best_fit([*self.results.values(), *replays.values()])
        best = answer_so_far.batch_size if answer_so_far is not None else 0
        if odd is not None and best not in replays:
            why = self.replayer.size_disagreement(odd)
            if why is None:
                self._settle(replays)  # the answer was traced, the fit checked at `odd`
                return
        if not replays:
            return  # the traces settled it: nothing replayed, nothing to vouch for
        # The recommended batch when it was replayed, else the replayed one nearest it, so a
        # trace away from the fitted ones always checks the replays.
        answer = best if best in replays else min(replays, key=lambda b: (abs(b - best), b))
        yield answer
        why = self.replayer.disagreement(answer)
        if why is not None:
            self.fallback = f"the step traced at {answer} differs from its replay: {why}"
            yield from self._traced(*self._bounds(self._fits))
            return
        self._settle(replays)

    def _fitted(self) -> Generator[int, None, int | None]:
        """Trace the sizes to fit through and fit them (or set `fallback`); the odd first
        step left out of the fit, which checks it, when it was."""
        first = min(max(self.step, 2), self.max_grid)
        points = tuple(sorted({min(first * k, self.max_grid) for k in range(1, self.degree + 2)}))
        for i, point in enumerate(points):
            yield point
            if not self._fits(point):
                if i == 0 and self.degree == 1:
                    return (yield from self._fitted_below(point))
                self.fallback = f"batch {point} does not fit: too few traced sizes to replay"
                return None
        if len(points) <= self.degree:
            self.fallback = f"the grid stops at {self.max_grid}: too few sizes to replay"
            return None
        self.traces = (self.results[points[0]], self.results[points[1]])
        return (yield from self._fitted_through(points, odd=points[0]))

    def _fitted_below(self, first: int) -> Generator[int, None, int | None]:
        """The first grid point does not fit (a 70B model under FSDP fits batch 4, not 8):
        the fast strategy's own descent below it, every probe traced, until a size fits; then
        fit through it and the smallest size that did not (its trace is as whole as any: the
        allocator replay, not the step, said it does not fit)."""
        for probe in self._converge(0, first, self._fits):
            yield probe
            if self._fits(probe):
                break
        else:
            self.fallback = f"batch {first} does not fit, nor any smaller size: nothing to replay"
            return None
        fits, fails = self._bounds(self._fits)
        assert fails is not None
        # The smaller size was traced last, so the larger one is the step that may be odd.
        return (yield from self._fitted_through((fits, fails), odd=fails))

    def _fitted_through(
        self, points: tuple[int, ...], *, odd: int
    ) -> Generator[int, None, int | None]:
        """Fit through the steps traced at `points`. Along the batch, when they do not align,
        fit through the other one and the fast strategy's next probe instead, and return
        `odd`, the step traced first, which may be odd, for its sizes to check the fit."""
        assert self.replayer is not None
        self.fallback = self.replayer.fit(points)
        if not self.fallback or self.degree != 1:
            return None
        # The first step after setting up may run operators no later step runs (under FSDP a
        # 2-layer GPT-2's first step runs 112 more than its second): fit through the other
        # one and the fast strategy's own next probe, its guess at the answer, so the extra
        # trace is one the search needed anyway; the odd step's allocations, logged alike,
        # still check the fit at a third size.
        guess = next(iter(self._converge(*self._bounds(self._fits), self._fits)), None)
        if guess is None:
            return None
        yield guess
        (other,) = (p for p in points if p != odd)
        self.fallback = self.replayer.fit(tuple(sorted((other, guess))))
        return odd

    def _settle(self, replays: dict[int, Measurement]) -> None:
        """Vouch for the replays: results, and the sweep's to yield."""
        self._trusted = True
        for batch_size, m in sorted(replays.items()):
            if batch_size not in self.results:
                self.results[batch_size] = m
                self._pending.append(m)

    def _search(self) -> dict[int, Measurement] | None:
        """The fast strategy's search on from what was traced, every probe replayed: each
        replayed batch size's measurement, or None (and `fallback` set) when one cannot be."""
        inner = FastStrategy(
            step=self.step,
            max_batch=self.max_grid,
            capacity_bytes=self.capacity_bytes,
            limit_bytes=self.limit_bytes,
            traces=self.traces,
            find_max=self.find_max,
        )
        inner.results = dict(self.results)
        assert self.replayer is not None
        replays: dict[int, Measurement] = {}
        searches = [inner._converge(*inner._bounds(inner._fits), inner._fits)]
        if self.find_max:
            searches.append(inner._max_phase())
        for batch_size in chain.from_iterable(searches):
            m = inner.results.get(batch_size) or self.replayer.replay(batch_size)
            if m is None:
                self.fallback = (
                    f"batch {batch_size} has no replay (a size that is not a whole number of "
                    "bytes there, or too large to compute)"
                )
                return None
            if batch_size not in self.results:
                replays[batch_size] = m
            inner.observe(m)
        return replays

    def _traced(self, lo: int, hi: int | None) -> Iterator[int]:
        """Go on as the fast strategy, every probe traced, from the boundary known so far."""
        yield from self._converge(lo, hi, self._fits)
        if self.find_max:
            yield from self._max_phase()
