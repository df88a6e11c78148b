"""A traced step as polynomials of one axis: every figure of a step at any batch, by arithmetic.

A simulated step at batch b runs the same operators in the same order at every b; only the sizes
change, and each is a polynomial in b: an activation of shape (b, s, h) takes c*b bytes, a weight
a constant, an attention score (b, heads, s, s) is linear in b and quadratic in the sequence
length s. So two steps traced at two batch sizes (three at three lengths, for the quadratic
axis) give, entry by entry, every allocation's size, the live bytes after every operator, by
category, and every operator's FLOPs and bytes as exact polynomials (Lagrange's, in integer
arithmetic), and a step at any other batch is read off them: the same `StepRecord` the tracker
would leave, which the allocator replay and the fit policy then judge as they judge a traced one.

It is the symbolic trace PyTorch's `ShapeEnv` would give (sizes as expressions of a symbolic
batch), taken from concrete traces instead: no guard specialises it, any operator traces, and it
costs two fake steps, where a ShapeEnv trace costs more than that (benchmarks/sweep_cost.py).
It holds only where the traces align: the same events, frees and operators at every point, the
same constant state. What it cannot see from the traces (a size that is not a polynomial of the
degree asked, a kernel chosen by size past the traces) the sweep catches by tracing the answer
and comparing it entry by entry (`SymbolicStep.disagreement`); any difference and the sweep
measures concretely. Pure arithmetic on integer arrays: this module knows nothing of torch,
models, GPUs or search.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from memorymark.accounting.allocator import STREAM_SHIFT, EventLog, event_bytes, event_stream
from memorymark.measurement import Breakdown, Category, Measurement

if TYPE_CHECKING:  # throughput imports torch; this module does arithmetic only
    from memorymark.accounting.throughput import OpWork

_ALLOC, _FREE_OWN, _FREE_OLDER, _EMPTY = 0, 1, 2, 3
_LIMIT = 2**62
"""Largest magnitude an integer product may reach in int64 arithmetic (numpy wraps past 2**63)."""


@dataclass(frozen=True, slots=True, eq=False)
class StepRecord:
    """What one simulated step leaves that its Measurement is computed from: the tracker's view
    (its event log, timeline, breakdown) and the work counted, at one axis value."""

    events_first_seq: int
    events: list[int | None]
    """The step's allocator event log (memorymark/accounting/allocator.py `EventLog`)."""
    baseline_events: EventLog
    """Setting up, as a fresh process does it before its first step."""
    timeline: list[int]
    """Live bytes after each operator."""
    categories: list[tuple[int, ...]]
    """Live bytes by `Category` after each operator."""
    start_categories: tuple[int, ...]
    """Live bytes by `Category` before the first operator."""
    work: list[OpWork] | None
    """Each operator's (FLOPs, bytes, rate kind), in order; None when no work was counted."""
    unified_bytes: int = 0
    """Bytes in CUDA unified memory (a paged optimizer's state), outside the peak."""
    quantized_weight_bytes: int | None = None
    """The quantized weights' bytes (QLoRA), when quantized: a property of the model."""
    state_from: int | None = None
    """Where in `baseline_events` priming the optimizer's state began (the tracker's)."""
    optimizer_at: int | None = None
    """Where in `events` the step's first optimizer step began (the tracker's)."""
    operators: list[int] | None = None
    """Which operator each timeline entry is (the tracker's `operators`), when kept."""

    @property
    def peak_bytes(self) -> int:
        """The live peak, as the tracker keeps it: the highest after any operator, or the
        bytes live before the first."""
        return max(sum(self.start_categories), max(self.timeline, default=0))

    def peak_breakdown(self) -> Breakdown:
        """Live bytes by category when the peak was first reached (the tracker snapshots them
        only when live bytes rise past its peak)."""
        peak = self.peak_bytes
        cats = self.start_categories
        if peak > sum(cats):
            cats = self.categories[self.timeline.index(peak)]
        return Breakdown(**{c.value: n for c, n in zip(Category, cats, strict=True)})


@dataclass(frozen=True, slots=True, eq=False)
class _Arrays:
    """A record as integer arrays: structure (what must be equal at every point) and sizes."""

    kinds: np.ndarray
    targets: np.ndarray
    """Per event: a free's allocation (own: its index in the step; older: its sequence number);
    an allocation's stream."""
    sizes: np.ndarray
    """Per event: an allocation's bytes (0 elsewhere)."""
    timeline: np.ndarray
    categories: np.ndarray
    flops: np.ndarray
    work_bytes: np.ndarray
    rates: np.ndarray


def _arrays(record: StepRecord) -> _Arrays:
    first = record.events_first_seq
    # Per event: its kind, the event it frees (an allocation: its stream), its bytes.
    rows: list[tuple[int, int, int]] = []
    for event in record.events:
        if event is None:
            rows.append((_EMPTY, 0, 0))
        elif event >= 0:
            rows.append((_ALLOC, event_stream(event), event_bytes(event)))
        elif ~event >= first:
            rows.append((_FREE_OWN, ~event - first, 0))
        else:
            rows.append((_FREE_OLDER, ~event, 0))
    table = np.array(rows, dtype=np.int64).reshape(-1, 3)
    work = record.work or []
    return _Arrays(
        kinds=table[:, 0].astype(np.int8),
        targets=table[:, 1].copy(),
        sizes=table[:, 2].copy(),
        timeline=np.array(record.timeline, dtype=np.int64),
        categories=np.array(record.categories, dtype=np.int64).reshape(-1, len(Category)),
        flops=np.array([w[0] for w in work], dtype=np.int64),
        work_bytes=np.array([w[1] for w in work], dtype=np.int64),
        rates=np.array([w[2] for w in work], dtype=np.int8),
    )


def _events_misaligned(x: _Arrays, y: _Arrays) -> str | None:
    """Why two event logs are not the same allocations and frees in the same order, or None."""
    if not np.array_equal(x.kinds, y.kinds):
        return f"the event logs differ in length or order ({len(x.kinds)} and {len(y.kinds)})"
    if not np.array_equal(x.targets, y.targets):
        return "the steps free their allocations in a different order"
    return None


def _misaligned(a: StepRecord, b: StepRecord, x: _Arrays, y: _Arrays) -> str | None:
    """Why two records are not the same step at two sizes, or None when they are."""
    why = _events_misaligned(x, y)
    if why is not None:
        return why
    if len(x.timeline) != len(y.timeline):
        return f"the steps run {len(x.timeline)} and {len(y.timeline)} operators"
    if (a.work is None) != (b.work is None) or not np.array_equal(x.rates, y.rates):
        return "the operators run at different peak rates (another kernel or dtype)"
    if a.start_categories != b.start_categories or a.unified_bytes != b.unified_bytes:
        return "the state before the step differs"
    if a.baseline_events != b.baseline_events or a.state_from != b.state_from:
        return "setting up differs"
    if a.optimizer_at != b.optimizer_at:
        return "the optimizer steps begin at different events"
    return None


def _weights(points: tuple[int, ...], x: int) -> tuple[list[int], int]:
    """Lagrange's basis at `x` over `points` as integer numerators over one denominator."""
    basis = [
        math.prod((Fraction(x - q, p - q) for q in points if q != p), start=Fraction(1))
        for p in points
    ]
    denominator = math.lcm(*(f.denominator for f in basis))
    return [int(f * denominator) for f in basis], denominator


def _evaluated(rows: list[np.ndarray], weights: list[int], denominator: int) -> np.ndarray | None:
    """The polynomial through `rows` (one array per point) at the point `weights` stand for;
    None when it is not a whole non-negative number everywhere, or too large to compute."""
    largest = max((int(np.abs(r).max(initial=0)) for r in rows), default=0)
    if largest * sum(abs(w) for w in weights) >= _LIMIT:
        return None
    total = sum((w * r for w, r in zip(weights, rows, strict=True)), np.zeros_like(rows[0]))
    if np.any(total % denominator) or np.any(total < 0):
        return None
    return total // denominator


class SymbolicStep:
    """Every figure of a step as a polynomial of one axis, through records at distinct points."""

    def __init__(self, records: dict[int, StepRecord]) -> None:
        self.points = tuple(sorted(records))
        self._records = [records[p] for p in self.points]
        self._arrays = [_arrays(r) for r in self._records]

    @classmethod
    def fit(cls, records: dict[int, StepRecord]) -> SymbolicStep | str:
        """The symbolic step through `records` (at least two), or why they do not align."""
        if len(records) < 2:
            return "one traced step gives no sizes as functions of the batch"
        step = cls(records)
        first, a = step._records[0], step._arrays[0]
        for record, arrays in zip(step._records[1:], step._arrays[1:], strict=True):
            why = _misaligned(first, record, a, arrays)
            if why is not None:
                return why
        return step

    def at(self, x: int) -> StepRecord | None:
        """The step at `x`, or None where a size would not be a whole non-negative number (no
        polynomial of this degree fits what was traced)."""
        if x in self.points:
            return self._records[self.points.index(x)]
        weights, denominator = _weights(self.points, x)

        def value(name: str) -> np.ndarray | None:
            return _evaluated([getattr(a, name) for a in self._arrays], weights, denominator)

        sizes, timeline, categories = value("sizes"), value("timeline"), value("categories")
        flops, work_bytes = value("flops"), value("work_bytes")
        if sizes is None or timeline is None or categories is None:
            return None
        if flops is None or work_bytes is None:
            return None
        ref, arrays = self._records[0], self._arrays[0]
        return StepRecord(
            events_first_seq=ref.events_first_seq,
            events=_events(arrays, sizes, ref.events_first_seq),
            baseline_events=ref.baseline_events,
            timeline=timeline.tolist(),
            categories=[tuple(row) for row in categories.tolist()],
            start_categories=ref.start_categories,
            work=None
            if ref.work is None
            else list(zip(flops.tolist(), work_bytes.tolist(), arrays.rates.tolist(), strict=True)),
            unified_bytes=ref.unified_bytes,
            quantized_weight_bytes=ref.quantized_weight_bytes,
            state_from=ref.state_from,
            optimizer_at=ref.optimizer_at,
            operators=ref.operators,
        )

    def disagreement(self, x: int, traced: StepRecord) -> str | None:
        """Where the step traced at `x` differs from what this symbolic step says of `x`, in
        one line; None when they are the same entry for entry."""
        return self._difference(x, traced, sizes_only=False)

    def size_disagreement(self, x: int, traced: StepRecord) -> str | None:
        """Where the allocations of a step traced at `x` differ from what this symbolic step
        says of `x`: the same allocations and frees, in order, each of the same bytes; None
        when they agree. For a trace whose operators do not align (a first step that runs
        one-off operators which allocate nothing logged): its sizes still check the fit."""
        return self._difference(x, traced, sizes_only=True)

    def _difference(self, x: int, traced: StepRecord, *, sizes_only: bool) -> str | None:
        """The first way the step traced at `x` differs from this one's at `x`: in the event
        log's structure (unless `sizes_only`, the operators' too), then in the first array of
        `_COMPARED` (only the sizes, when `sizes_only`) with an entry that differs."""
        predicted = self.at(x)
        if predicted is None:
            degree = len(self.points) - 1
            return f"no whole-byte sizes at {x}: the sizes are not polynomials of degree {degree}"
        mine, theirs = _arrays(predicted), _arrays(traced)
        why = (
            _events_misaligned(mine, theirs)
            if sizes_only
            else _misaligned(predicted, traced, mine, theirs)
        )
        if why is not None:
            return why
        for name, what in _COMPARED[:1] if sizes_only else _COMPARED:
            left, right = getattr(mine, name), getattr(theirs, name)
            if not np.array_equal(left, right):
                i = int(np.argwhere(left != right)[0][0])
                return (
                    f"{what} {i} differs: {left[i].tolist()} predicted, {right[i].tolist()} traced"
                )
        return None


_COMPARED = (
    ("sizes", "allocation"),
    ("timeline", "live bytes after operator"),
    ("categories", "breakdown after operator"),
    ("flops", "FLOPs of operator"),
    ("work_bytes", "bytes moved by operator"),
)
"""The arrays a traced step and its replay must agree on, entry for entry (sizes first)."""


def _events(arrays: _Arrays, sizes: np.ndarray, first: int) -> list[int | None]:
    """The event log for `sizes`, in the numbering that starts at `first`."""
    kinds, targets = arrays.kinds, arrays.targets
    out = np.where(
        kinds == _ALLOC,
        sizes | (targets << STREAM_SHIFT),  # `allocator.on_stream`, elementwise
        np.where(kinds == _FREE_OWN, ~(targets + first), ~targets),
    ).tolist()
    for i in np.flatnonzero(kinds == _EMPTY).tolist():
        out[i] = None
    return out


class Replays:
    """The traced records of one sweep, by axis value, and the symbolic step fitted to them:
    what the symbolic strategy asks (memorymark/search/symbolic.py `Replayer`).

    `last_record` reads what the probe just taken left (the backend's); `to_measurement` turns
    a record into the measurement at an axis value, as the backend judges a traced step.
    """

    def __init__(
        self,
        to_measurement: Callable[[int, StepRecord], Measurement],
        last_record: Callable[[], StepRecord | None],
    ) -> None:
        self._to_measurement = to_measurement
        self._last_record = last_record
        self.records: dict[int, StepRecord] = {}
        self.step: SymbolicStep | None = None

    def measured_by(self, to_measurement: Callable[[int, StepRecord], Measurement]) -> Replays:
        """These records and their fitted step, turned into measurements by another measurer:
        another GPU whose kernels are the same (one compute capability), judged against its
        own capacity and costed on its own roofline."""
        other = Replays(to_measurement, lambda: None)
        other.records, other.step = self.records, self.step
        return other

    def keep(self, value: int) -> None:
        """Keep what the probe just traced at `value` left (nothing, when it left none)."""
        record = self._last_record()
        if record is not None:
            self.records[value] = record

    def fit(self, points: tuple[int, ...]) -> str | None:
        """Fit the symbolic step through the records at `points`; why not, or None."""
        missing = [p for p in points if p not in self.records]
        if missing:
            return f"the step at {missing[0]} left no record (an evaluation pass, or an error)"
        fitted = SymbolicStep.fit({p: self.records[p] for p in points})
        if isinstance(fitted, str):
            return fitted
        self.step = fitted
        return None

    def replay(self, value: int) -> Measurement | None:
        """The measurement at `value` read off the fitted step; None where it has no whole
        sizes (or nothing is fitted)."""
        record = self.step.at(value) if self.step is not None else None
        return None if record is None else self._to_measurement(value, record)

    def size_disagreement(self, value: int) -> str | None:
        """Where the allocations of the step traced at `value` differ from its replay."""
        return self._compared(value, SymbolicStep.size_disagreement)

    def disagreement(self, value: int) -> str | None:
        """Where the step traced at `value` differs from its replay; None when it does not."""
        return self._compared(value, SymbolicStep.disagreement)

    def _compared(
        self, value: int, compare: Callable[[SymbolicStep, int, StepRecord], str | None]
    ) -> str | None:
        if self.step is None:
            return "nothing was fitted"
        if value not in self.records:
            return f"the step at {value} left no record"
        return compare(self.step, value, self.records[value])
