"""A deep model's step from steps of the same model built shallower: its depth by arithmetic.

A decoder's N blocks are one block N times, so the step of a model built with d blocks is a
prefix (embeddings), the block's forward d times, the head and the loss, the block's backward d
times, then the optimizer, whose foreach kernels allocate once per parameter, so per block too.
Each of the step's sequences (its allocator event log, setting up's log, its operators'
figures) is then fixed stretches with, at a few points, one stretch inserted once per block.
Three steps of the model built with a, a+p and a+2p blocks (p: the period of the model's layer
pattern, 1 for most) pin that down:

- the steps at a and a+p, aligned, give the structure: which stretches of the shallower step
  stay and which stretch each point gains per period (`_insertions`);
- every number in the steps at a+p and a+2p (an allocation's bytes, the sequence number a free
  names, an operator's live-byte delta and FLOPs, where the optimizer step begins) is an affine
  function of the copy it sits in and of the number of copies, as the bytes of a foreach
  kernel's output list or the sequence number of a block's saved activation freed in backward
  are: two depths and two copies fit it exactly (`DepthStep.at`);

and the step at any depth is read off them: the same `StepRecord` a trace of the full model
leaves, which the allocator replay and the fit policy then judge as they judge a traced one. A
fourth depth, traced, checks the whole record entry by entry (`DepthStep.disagreement`): where
the structure is not what this model assumes (a layer pattern missed, a kernel chosen by
depth), the check fails and the caller traces the full model and says why.

Pure arithmetic on integer arrays: this module knows nothing of torch, models, GPUs or search.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memorymark.accounting.allocator import canonical_frees
from memorymark.accounting.symbolic import StepRecord
from memorymark.measurement import Category

_ALLOC, _FREE, _EMPTY = 0, 1, 2
_UNKNOWN = -1
"""The bytes of a free whose allocation neither log holds (a step before this one made it)."""


@dataclass(frozen=True, slots=True)
class _Sequence:
    """One of a step's sequences as arrays: what must be equal at every depth (`kinds`), the
    numbers that grow with depth (`values`, one row per entry) and the tokens aligned."""

    kinds: np.ndarray
    values: np.ndarray
    tokens: np.ndarray


def _log(
    first: int, events: Sequence[int | None], sizes: dict[int, int], cut: int | None
) -> _Sequence:
    """An event log (`canonical_frees`): kind, then bytes (allocation) or the sequence number freed
    (free)."""
    rows: list[tuple[int, int]] = []
    tokens: list[int] = []
    freed = None  # what the event before freed, if it was a free
    for event in canonical_frees(events, cut):
        if event is None:
            rows.append((_EMPTY, 0))
            tokens.append(_token(_EMPTY, 0))
        elif event >= 0:
            rows.append((_ALLOC, event))
            tokens.append(_token(_ALLOC, event))
        else:
            rows.append((_FREE, ~event))
            # Whether it frees the allocation after the last one freed: a run of frees of
            # every block's tensors grows inside each stretch of consecutive ones, so where
            # one stretch ends is where a block's entries go.
            tokens.append(_token(_FREE, sizes.get(~event, _UNKNOWN), freed == ~event - 1))
        freed = ~event if event is not None and event < 0 else None
    table = np.array(rows, dtype=np.int64).reshape(-1, 2)
    return _Sequence(table[:, 0].copy(), table[:, 1:].copy(), np.array(tokens, dtype=np.int64))


def _token(kind: int, nbytes: int, follows: bool = False) -> int:
    """An event's token as one whole number >= 0: its kind, its bytes (-1 unknown) and whether
    it frees the allocation after the one freed before it; equal tokens, equal numbers."""
    return ((nbytes + 1) * 2 + follows) * 4 + kind


def _sizes(record: StepRecord) -> dict[int, int]:
    """Bytes of every allocation the record's two logs make, by sequence number."""
    sizes: dict[int, int] = {}
    for first, events in (record.baseline_events, (record.events_first_seq, record.events)):
        seq = first
        for event in events:
            if event is not None and event >= 0:
                sizes[seq] = event
                seq += 1
    return sizes


def _operators(record: StepRecord) -> _Sequence:
    """Operators, aligned by which operator each is: its kernel's rate kind, then its live-byte
    delta, its deltas by category (deltas, not running totals: a block adds the same each
    time), and its FLOPs and bytes moved when work was counted (one entry per operator)."""
    timeline = np.array(record.timeline, dtype=np.int64)
    categories = np.array(record.categories, dtype=np.int64).reshape(-1, len(Category))
    start = np.array(record.start_categories, dtype=np.int64).reshape(1, -1)
    live = np.diff(timeline, prepend=int(start.sum()))
    columns = [live[:, None], np.diff(categories, axis=0, prepend=start)]
    names = np.array(record.operators or [0] * len(timeline), dtype=np.int64)
    kinds = names * _RATES
    if record.work is not None:
        work = np.array(record.work, dtype=np.int64).reshape(-1, 3)
        columns.append(work[:, :2])
        kinds += work[:, 2]
    return _Sequence(kinds, np.concatenate(columns, axis=1), names)


_RATES = 8
"""More than the rate kinds (memorymark/accounting/throughput.py): an operator's kind is its
number times this plus its rate kind, so both must be the same at every depth."""


def _scalars(record: StepRecord) -> np.ndarray:
    """The record's single numbers that grow with depth, as one row (-1 for None); `record`
    numbered afresh."""
    quantized = record.quantized_weight_bytes
    return np.array(
        [
            record.events_first_seq,
            record.baseline_events[0],
            record.unified_bytes,
            -1 if quantized is None else quantized,
            -1 if record.state_from is None else record.state_from,
            -1 if record.optimizer_at is None else record.optimizer_at,
            *record.start_categories,
        ],
        dtype=np.int64,
    )


def numbered_afresh(record: StepRecord) -> StepRecord:
    """`record` with its step's allocations numbered right after setting up's.

    Between setting up and the step a backend may have traced other steps (one per batch size
    probed), whose allocations took sequence numbers: how many depends on what it traced
    before, which differs between depths. A replay reads only setting up's and the step's own
    allocations (frees of any other are ignored: `allocator.replay`), so those numbers carry
    nothing; renumbered, the step's are the same whatever came before. A free of an allocation
    of neither log names the one number left between them."""
    setup_first, setup = record.baseline_events
    gap = setup_first + sum(1 for e in setup if e is not None and e >= 0)
    first, shift = record.events_first_seq, record.events_first_seq - gap - 1
    if shift == 0:
        return record

    def renumbered(event: int | None) -> int | None:
        if event is None or event >= 0 or setup_first <= ~event < gap:
            return event
        return ~(~event - shift) if ~event >= first else ~gap

    return dataclasses.replace(
        record,
        events_first_seq=gap + 1,
        events=[renumbered(e) for e in record.events],
        baseline_events=(setup_first, [renumbered(e) for e in setup]),
    )


@functools.lru_cache(maxsize=8)
def _prepared(record: StepRecord) -> tuple[tuple[_Sequence, ...], np.ndarray]:
    """The record's step log, setting up's log and operators, in that order, and its single
    numbers (`_scalars`), its step numbered afresh (`numbered_afresh`). Kept for the last few
    records: finding a structure and fitting it read the same steps."""
    record = numbered_afresh(record)
    sizes = _sizes(record)
    sequences = (
        _log(record.events_first_seq, record.events, sizes, record.optimizer_at),
        _log(*record.baseline_events, sizes, record.state_from),
        _operators(record),
    )
    return sequences, _scalars(record)


def _sequences(record: StepRecord) -> tuple[_Sequence, ...]:
    """The record's sequences (`_prepared`)."""
    return _prepared(record)[0]


def _common_run(x: np.ndarray, i: int, y: np.ndarray, k: int) -> int:
    """How many tokens `x` from `i` and `y` from `k` share before the first that differs."""
    n = min(len(x) - i, len(y) - k)
    if n <= 0:
        return 0
    differ = np.flatnonzero(x[i : i + n] != y[k : k + n])
    return int(differ[0]) if len(differ) else n


_WINDOW = 256
"""Entries compared after a point where two sequences differ, to choose how they realign."""


def _padded(values: np.ndarray, start: int, length: int, fill: int) -> np.ndarray:
    """`values[start:start + length]`, filled out to `length` with `fill`."""
    out = np.full(length, fill, dtype=np.int64)
    part = values[start : start + length]
    out[: len(part)] = part
    return out


def _insertions(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> list[tuple[int, int, int]] | None:
    """(where in `x`, where in `y`, how long) each stretch is that `y` inserts into `x`, such
    that `y` is `x` with them inserted, up to single entries whose numbers changed; None when
    it is not.

    Greedy: where the two first differ, `y` has either an insertion there or a changed entry
    (a foreach kernel over every block's parameters moves more bytes one block deeper): the
    choice after which the two agree longest, then most within the next `_WINDOW` entries,
    the shortest among equals. An insertion must be there twice, back to back, in `z` (the
    sequence one period deeper still): a foreach kernel's outputs for a block, then its frees
    of another block's, agree longer as one insertion than as the two they are (each block's
    entries alike), but not twice. Blocks repeat, so several lengths fit the same logs (a
    block inserted before or after its twin, or one rotated by a few entries): `_placed`
    chooses among them, and `DepthStep.disagreement` checks the record it gives."""
    extra = len(y) - len(x)
    if extra < 0:
        return None
    found: list[tuple[int, int, int]] = []
    inserted = i = k = 0
    while i < len(x):
        run = _common_run(x, i, y, k)
        i, k = i + run, k + run
        if i == len(x):
            break
        left = extra - inserted
        # Agreement after each choice: y's window at k + r, for r = 0..left, against x's.
        rows = np.lib.stride_tricks.sliding_window_view(
            _padded(y, k, left + 1 + _WINDOW, -1), _WINDOW
        )
        agree = np.empty((left + 1, _WINDOW), dtype=bool)
        agree[0] = rows[1] == _padded(x, i + 1, _WINDOW, -2)  # a changed entry
        agree[1:] = rows[1 : left + 1] == _padded(x, i, _WINDOW, -2)  # an insertion of n
        # The longest run of agreement decides; where no choice has one (a changed entry
        # right after the point), the most agreement in the window.
        runs = np.where(agree.all(axis=1), _WINDOW, np.argmin(agree, axis=1))
        scores = runs * (_WINDOW + 1) + agree.sum(axis=1)
        at = i + 2 * inserted  # where this point is in z
        for n in np.flatnonzero(scores[1:] > scores[0]).tolist():
            chunk = y[k : k + n + 1]
            if not np.array_equal(z[at : at + 2 * n + 2], np.concatenate([chunk, chunk])):
                scores[n + 1] = -1
        best = int(np.argmax(scores))
        if best == 0:
            i, k = i + 1, k + 1  # a changed entry: a fixed one whose numbers grow with depth
            continue
        found.append((i, k, best))
        inserted += best
        k += best
    if k < len(y):
        found.append((len(x), k, len(y) - k))
        inserted += len(y) - k
    return found if inserted == extra else None


@functools.lru_cache(maxsize=256)
def _layout(
    fixed: tuple[int, ...], chunks: tuple[int, ...], copies: int
) -> tuple[np.ndarray, np.ndarray]:
    """`_Pattern.entries`, kept: placing chunks asks it of one layout several times."""
    ids, copy = [], []
    fixed_at, chunk_at = 0, sum(fixed)
    for s, length in enumerate(fixed):
        ids.append(np.arange(fixed_at, fixed_at + length))
        copy.append(np.zeros(length, dtype=np.int64))
        fixed_at += length
        if s < len(chunks):
            n = chunks[s]
            ids.append(np.tile(np.arange(chunk_at, chunk_at + n), copies))
            copy.append(np.repeat(np.arange(copies), n))
            chunk_at += n
    return np.concatenate(ids), np.concatenate(copy)


@dataclass(frozen=True, slots=True)
class _Pattern:
    """A sequence at any number of copies j: fixed stretches of the shallowest step with, after
    stretch s (but the last), stretch s's chunk repeated j times."""

    fixed: tuple[int, ...]
    """Lengths of the fixed stretches (one more than the chunks)."""
    chunks: tuple[int, ...]
    """Lengths of the chunks."""
    kinds: np.ndarray
    """Each entry's kind: the fixed ones', then each chunk's, in order."""
    tokens: np.ndarray
    """Each entry's token (what aligned it), in the same order."""

    @classmethod
    def found(cls, shallow: _Sequence, deeper: _Sequence, deepest: _Sequence) -> _Pattern | None:
        """The pattern through a sequence at one depth and the next two (a period apart)."""
        inserted = _insertions(shallow.tokens, deeper.tokens, deepest.tokens)
        if inserted is None:
            return None
        fixed: list[int] = []
        chunks: list[int] = []
        at = 0
        for where, _, length in inserted:
            if fixed and where == at:  # two insertions at one point are one chunk
                chunks[-1] += length
            else:
                fixed.append(where - at)
                chunks.append(length)
            at = where
        fixed.append(len(shallow.kinds) - at)
        stretches = [slice(start, start + length) for _, start, length in inserted]
        pattern = cls(
            tuple(fixed),
            tuple(chunks),
            np.concatenate([shallow.kinds, *(deeper.kinds[s] for s in stretches)]),
            np.concatenate([shallow.tokens, *(deeper.tokens[s] for s in stretches)]),
        )
        return pattern if pattern.matches(deeper, 1) else None

    def slid(self, chunk: int, step: int) -> _Pattern | None:
        """This pattern with chunk `chunk` inserted one entry earlier (`step` -1) or later (+1),
        rotated to give the same sequence; None where the entry it passes is not its twin."""
        fixed, chunks = list(self.fixed), self.chunks
        if not chunks[chunk]:
            return None
        start = sum(self.fixed) + sum(chunks[:chunk])
        inside = np.arange(start, start + chunks[chunk])
        passed = sum(fixed[: chunk + 1]) - 1 if step < 0 else sum(fixed[: chunk + 1])
        twin = inside[-1] if step < 0 else inside[0]
        if not fixed[chunk if step < 0 else chunk + 1]:
            return None
        if self.tokens[passed] != self.tokens[twin] or self.kinds[passed] != self.kinds[twin]:
            return None
        fixed[chunk] += step
        fixed[chunk + 1] -= step
        order = np.arange(len(self.kinds))
        order[inside] = np.roll(inside, -step)
        return _Pattern(tuple(fixed), chunks, self.kinds[order], self.tokens[order])

    def entries(self, copies: int) -> tuple[np.ndarray, np.ndarray]:
        """For each entry of the sequence at `copies`: which of the pattern's entries it is,
        and which copy of its chunk (0 for a fixed one)."""
        return _layout(self.fixed, self.chunks, copies)

    def matches(self, sequence: _Sequence, copies: int) -> bool:
        """Whether `sequence` has this pattern's kinds at `copies`."""
        ids, _ = self.entries(copies)
        return len(ids) == len(sequence.kinds) and np.array_equal(self.kinds[ids], sequence.kinds)


@dataclass(frozen=True, slots=True)
class _Affine:
    """Each pattern entry's numbers as `base + per_copy * copy + per_depth * copies`."""

    pattern: _Pattern
    base: np.ndarray
    per_copy: np.ndarray
    per_depth: np.ndarray

    @classmethod
    def fit(cls, pattern: _Pattern, one: _Sequence, two: _Sequence) -> _Affine:
        """Through the sequence at one copy and at two (each entry's numbers at copy 0 of 1,
        and at copies 0 and 1 of 2)."""
        width = one.values.shape[1]
        size = len(pattern.kinds)
        at_one = np.zeros((size, width), dtype=np.int64)
        first = np.zeros((size, width), dtype=np.int64)
        second = np.zeros((size, width), dtype=np.int64)
        ids, _ = pattern.entries(1)
        at_one[ids] = one.values
        ids, copy = pattern.entries(2)
        first[ids[copy == 0]] = two.values[copy == 0]
        second[ids[copy == 1]] = two.values[copy == 1]
        fixed = sum(pattern.fixed)
        second[:fixed] = first[:fixed]  # a fixed entry has no copy to grow with
        per_depth = first - at_one
        return cls(pattern, at_one - per_depth, second - first, per_depth)

    def at(self, copies: int) -> np.ndarray:
        """The numbers of every entry of the sequence at `copies`, in order."""
        ids, copy = self.pattern.entries(copies)
        return self.base[ids] + self.per_copy[ids] * copy[:, None] + self.per_depth[ids] * copies


def _misses(
    pattern: _Pattern, one: _Sequence, two: _Sequence, three: _Sequence, *, slid: bool = False
) -> int:
    """How many entries of the sequence at three copies the pattern, fitted at one and two,
    gets wrong (every one, when the kinds do not match; `slid`: a pattern slid from one that
    matched, which matches too)."""
    if not slid and not all(pattern.matches(s, j) for j, s in enumerate((one, two, three), 1)):
        return len(three.kinds) + 1
    predicted = _Affine.fit(pattern, one, two).at(3)
    return int(np.count_nonzero((predicted != three.values).any(axis=1)))


def _placed(pattern: _Pattern, one: _Sequence, two: _Sequence, three: _Sequence) -> _Pattern:
    """The pattern with each chunk placed where its numbers grow affinely.

    Twins make several places equally right for the kinds: GPT-2's last block's backward
    frees what no other block's does, so a chunk placed to repeat after it gets that free at
    its last copy only, which no affine function of the copy gives; placed before it, the
    special block stays fixed. So each chunk slides (one at a time, the others kept) to where
    the fitted pattern gets fewest entries wrong at a third depth."""
    best, misses = pattern, _misses(pattern, one, two, three)
    for chunk in range(len(pattern.chunks)):
        if not misses:
            break
        for step in (-1, 1):
            candidate: _Pattern | None = best
            for _ in range(best.chunks[chunk]):
                candidate = candidate.slid(chunk, step) if candidate is not None else None
                if candidate is None:
                    break
                wrong = _misses(candidate, one, two, three, slid=True)
                if wrong < misses:
                    best, misses = candidate, wrong
    return best


@dataclass(frozen=True, slots=True)
class DepthStructure:
    """How a step's sequences grow by one period of blocks: found once from four traced
    depths, then fitted at each batch size from two (`DepthStep.fit`)."""

    patterns: tuple[_Pattern, ...]
    """The step log's, setting up's and the operators' (`_NAMES`)."""

    @classmethod
    def found(cls, steps: Sequence[StepRecord]) -> DepthStructure | str:
        """The structure through steps traced at four depths one period apart, or why there
        is none: the first two align it, the next two place its chunks."""
        for record in steps:
            if record.operators is None or len(record.operators) != len(record.timeline):
                return "the steps do not say which operator each is"
            if record.work is not None and len(record.work) != len(record.timeline):
                return "the steps' work is not counted one entry per operator"
            if (record.work is None) != (steps[0].work is None):
                return "one depth counted its operators' work and another did not"
        patterns = []
        for name, *sequences in zip(_NAMES, *(_sequences(r) for r in steps), strict=True):
            shallow, one, two, three = sequences
            pattern = _Pattern.found(shallow, one, two)
            if pattern is None:
                return f"the {name} one block deeper is not the shallower one with stretches added"
            patterns.append(_placed(pattern, one, two, three))
        return cls(tuple(patterns))


_NAMES = ("step's event log", "setting up's event log", "operators")


class DepthStep:
    """A step at any depth, read off steps traced at three: the base depth `base` (j = 0, for
    the structure), `base + period` (j = 1) and `base + 2 * period` (j = 2)."""

    def __init__(
        self,
        structure: DepthStructure,
        sequences: tuple[_Affine, ...],
        scalars: tuple[np.ndarray, np.ndarray],
        *,
        base: int,
        period: int,
        counted_work: bool,
    ) -> None:
        self.structure = structure
        self._sequences = sequences
        self._scalars = scalars
        self.base = base
        self.period = period
        self._counted_work = counted_work

    @classmethod
    def fit(
        cls,
        structure: DepthStructure,
        one: StepRecord,
        two: StepRecord,
        *,
        base: int,
        period: int,
    ) -> DepthStep | str:
        """The step through `structure` and the steps traced at one and two periods past
        `base`; why not when they do not have its structure (another batch's step may run
        other operators: an FSDP model's first step runs some no later step does)."""
        if (one.work is None) != (two.work is None):
            return "one depth counted its operators' work and the other did not"
        fitted = []
        for name, pattern, x, y in zip(
            _NAMES, structure.patterns, _sequences(one), _sequences(two), strict=True
        ):
            if not (pattern.matches(x, 1) and pattern.matches(y, 2)):
                return f"the {name} does not have the structure found"
            fitted.append(_Affine.fit(pattern, x, y))
        a, b = _prepared(one)[1], _prepared(two)[1]
        if len(a) != len(b) or np.any((a < 0) != (b < 0)):
            return "where the optimizer's state is made is marked at one depth only"
        return cls(
            structure,
            tuple(fitted),
            (2 * a - b, b - a),
            base=base,
            period=period,
            counted_work=one.work is not None,
        )

    def copies(self, depth: int) -> int | None:
        """The periods `depth` adds to the base depth, or None when it is not a whole number
        of them at least one."""
        copies, rest = divmod(depth - self.base, self.period)
        return copies if copies >= 1 and not rest else None

    def at(self, depth: int) -> StepRecord | None:
        """The step of the model built with `depth` blocks; None where `depth` is not a whole
        number of periods past the base, or a figure would be negative."""
        j = self.copies(depth)
        if j is None:
            return None
        step, setup, ops = (fitted.at(j) for fitted in self._sequences)
        scalars = self._scalars[0] + self._scalars[1] * j
        width = 1 + len(Category)
        if np.any(step < 0) or np.any(setup < 0) or np.any(ops[:, width:] < 0):
            return None  # a negative size or sequence number: not this structure
        first, setup_first, unified, quantized, state_from, optimizer_at = scalars[:6].tolist()
        start = tuple(scalars[6:].tolist())
        if min(start, default=0) < 0 or unified < 0:
            return None
        live = np.cumsum(ops[:, 0]) + sum(start)
        categories = np.cumsum(ops[:, 1:width], axis=0) + np.array(start)
        if np.any(live < 0) or np.any(categories < 0):
            return None
        work = None
        pattern = self.structure.patterns[2]
        operators = pattern.kinds[pattern.entries(j)[0]]
        if self._counted_work:
            rates = (operators % _RATES).tolist()
            flops, moved = ops[:, width].tolist(), ops[:, width + 1].tolist()
            work = list(zip(flops, moved, rates, strict=True))
        events = canonical_frees(_events(self.structure.patterns[0], step, j), optimizer_at)
        setup_events = canonical_frees(_events(self.structure.patterns[1], setup, j), state_from)
        return StepRecord(
            events_first_seq=first,
            events=events,
            baseline_events=(setup_first, setup_events),
            timeline=live.tolist(),
            categories=[tuple(row) for row in categories.tolist()],
            start_categories=start,
            work=work,
            unified_bytes=unified,
            quantized_weight_bytes=None if quantized < 0 else quantized,
            state_from=None if state_from < 0 else state_from,
            optimizer_at=None if optimizer_at < 0 else optimizer_at,
            operators=(operators // _RATES).tolist(),
        )

    def disagreement(self, depth: int, traced: StepRecord) -> str | None:
        """Where the step traced at `depth` differs from what this one says of `depth`, in
        one line; None when they are the same entry for entry."""
        predicted = self.at(depth)
        if predicted is None:
            return f"no step at {depth} blocks: a figure would be negative there"
        return difference(predicted, traced)


def _events(pattern: _Pattern, values: np.ndarray, copies: int) -> list[int | None]:
    """An event log from its kinds and numbers (an allocation's bytes, a free's target)."""
    kinds = pattern.kinds[pattern.entries(copies)[0]]
    numbers = values[:, 0]
    out: list[int | None] = np.where(kinds == _ALLOC, numbers, ~numbers).tolist()
    for i in np.flatnonzero(kinds == _EMPTY).tolist():
        out[i] = None
    return out


def difference(predicted: StepRecord, traced: StepRecord) -> str | None:
    """The first way a record read off shallower steps differs from the step traced, in one
    line (the traced one `numbered_afresh`, their event logs `canonical_frees`); None when they do
    not."""
    traced = numbered_afresh(traced)
    checks: tuple[tuple[str, object, object], ...] = (
        (
            "the step's event log",
            predicted.events,
            canonical_frees(traced.events, traced.optimizer_at),
        ),
        ("where the step's log begins", predicted.events_first_seq, traced.events_first_seq),
        ("where setting up's log begins", predicted.baseline_events[0], traced.baseline_events[0]),
        (
            "setting up's event log",
            predicted.baseline_events[1],
            canonical_frees(traced.baseline_events[1], traced.state_from),
        ),
        ("the live bytes after each operator", predicted.timeline, traced.timeline),
        ("the breakdown after each operator", predicted.categories, traced.categories),
        ("the bytes live before the step", predicted.start_categories, traced.start_categories),
        ("the operators' work", predicted.work, traced.work),
        ("the unified-memory bytes", predicted.unified_bytes, traced.unified_bytes),
        ("the quantized weights", predicted.quantized_weight_bytes, traced.quantized_weight_bytes),
        ("where priming the state begins", predicted.state_from, traced.state_from),
        ("where the optimizer step begins", predicted.optimizer_at, traced.optimizer_at),
    )
    for what, mine, theirs in checks:
        if _normal(mine) != _normal(theirs):
            return f"{what} differs{_where(mine, theirs)}"
    return None


def _normal(value: object) -> object:
    """`value` with its lists and tuples compared alike (a log is a tuple of a list)."""
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    return value


def _where(mine: object, theirs: object) -> str:
    """ " at entry i (x replayed, y traced)" for two lists, or "" for anything else."""
    if not (isinstance(mine, list) and isinstance(theirs, list)):
        return ""
    if len(mine) != len(theirs):
        return f" in length ({len(mine)} replayed, {len(theirs)} traced)"
    i = next(
        i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if _normal(a) != _normal(b)
    )
    return f" at entry {i} ({mine[i]} replayed, {theirs[i]} traced)"
