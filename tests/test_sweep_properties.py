"""Property tests of the search strategies: on any step whose needs grow with the batch (live
bytes that are lines, a need/live ratio that wobbles with segment rounding and falls once a
cache flush is needed), the fast search ends, measures no batch twice, takes logarithmically
many probes, and lands on the boundaries that walking every grid point finds."""

from __future__ import annotations

import math
from itertools import accumulate

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memorymark.measurement import Measurement
from memorymark.search.strategies import FastStrategy, LinearStrategy
from memorymark.search.sweep import best_fit, sweep

# Modest example counts: the file runs in seconds on 2 cores.
FEW = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


class TableBackend:
    """Needs looked up by batch size: `live` (the timeline's two phases), `demand` (what the
    allocator would reserve with nothing limiting it) and `flushed` (what it holds after a
    cache flush), judged as the simulation judges them."""

    name = "table"

    def __init__(self, live, demand, flushed, limit: int, capacity: int) -> None:
        self.live, self.demand, self.flushed = live, demand, flushed
        self.limit, self.capacity = limit, capacity
        self.tried: list[int] = []

    def measure(self, batch_size: int) -> Measurement:
        self.tried.append(batch_size)
        demand, flushed = self.demand[batch_size], self.flushed[batch_size]
        runs = demand <= self.capacity or flushed <= self.capacity
        return Measurement(
            batch_size=batch_size,
            fits=demand <= self.limit,
            runs=runs,
            peak_bytes=max(self.live[batch_size]),
            required_bytes=flushed if runs and demand > self.capacity else demand,
            demand_bytes=demand,
            backend=self.name,
            measured=False,
            timeline=self.live[batch_size],
        )

    def release(self) -> None:
        pass


@st.composite
def workloads(draw) -> tuple[TableBackend, int, int]:
    """(backend, step, max_batch) for one random workload."""
    max_batch = draw(st.integers(1, 600))
    step = draw(st.sampled_from([1, 2, 4, 8, 16]).filter(lambda s: s <= max_batch))
    slope = draw(st.integers(1_000, 10**7))
    base = slope * draw(st.integers(1, 2_000))  # weights, gradients: 1 to 2,000 samples' worth
    optimizer = base * draw(st.integers(0, 3))  # small batches peak in the optimizer step
    ratio, wobble = draw(st.floats(1.0, 1.3)), draw(st.floats(0.0, 0.03))
    period = draw(st.integers(1, 12))
    segment = draw(st.sampled_from([1, slope // 2, 3 * slope, 8 * slope]))  # staircases
    flush_gain = draw(st.floats(0.0, 0.5))
    live = [(base + optimizer, base + slope * b) for b in range(max_batch + 1)]
    peaks = [max(t) for t in live]
    raw = [p * (ratio + wobble * (b % period) / period) for b, p in enumerate(peaks)]
    demand = list(accumulate((math.ceil(r / segment) * segment for r in raw), max))
    # A flush frees part of what the demand holds over live bytes, more at larger batches.
    flushed = [
        int(p + (demand[b] - p) * (1 - flush_gain * b / (max_batch + 1)))
        for b, p in enumerate(peaks)
    ]
    flushed = list(accumulate(flushed, max))
    # Each boundary sits at some batch (past the cap: the cap answers), a little over its need.
    fit_at = min(draw(st.integers(0, max_batch + max_batch // 8 + 1)), max_batch)
    run_at = min(fit_at + draw(st.integers(0, max_batch // 4 + 1)), max_batch)
    limit = demand[fit_at] + draw(st.integers(0, slope))
    capacity = max(limit, flushed[run_at] + draw(st.integers(0, slope)))
    return TableBackend(live, demand, flushed, limit, capacity), step, max_batch


def answers(strategy_cls, backend: TableBackend, step: int, max_batch: int):
    """((recommended, maximum), batches tried) of one strategy's sweep on a fresh record."""
    backend.tried = []
    strategy = strategy_cls(
        step=step,
        max_batch=max_batch,
        capacity_bytes=backend.capacity,
        limit_bytes=backend.limit,
    )
    measurements = list(sweep(backend, strategy))
    fit, run = best_fit(measurements), best_fit(measurements, runs=True)
    return (fit and fit.batch_size, run and run.batch_size), backend.tried


@FEW
@given(workloads())
def test_fast_ends_in_logarithmic_probes_on_the_boundaries_linear_finds(workload):
    fast, tried = answers(FastStrategy, *workload)
    linear, _ = answers(LinearStrategy, *workload)
    assert fast == linear
    assert len(tried) == len(set(tried))
    # Each of the two searches halves its range at least every five probes (strategies.py).
    assert len(tried) <= 4 + 2 * 5 * math.log2(workload[2] + 1)
