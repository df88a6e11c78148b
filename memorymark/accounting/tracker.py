"""Count the bytes of every live tensor storage while a training step runs, and its peak.

A `TorchDispatchMode` sees every operator's outputs. Each storage it has not seen is counted once,
under the category of the phase that created it, and subtracted when its Python object dies
(storages keep their Python object alive as long as the C++ storage lives, so `weakref.finalize`
fires exactly when the memory would be freed). Views share a storage and are not counted twice.
The same tracker runs on fake tensors (simulation) and real ones (CPU, CUDA), so both count the
same bytes. It also records the live bytes after every operator (the step's allocation timeline)
and every allocation and free in order (the event log `allocator.replay` reads: a list of ints,
+nbytes for an allocation, ~sequence number for a free), and hands each operator to an optional
work counter (the throughput estimate's FLOPs and bytes).

A stretch of a step can be recorded as a `Segment` and spliced into later steps instead of
running it again: the simulation does this for the optimizer step, whose allocations do not
depend on the batch size. A splice leaves the peak, its breakdown, the timeline and the event
log exactly as running the stretch again would.

Storages created inside `unified_memory()` stand for CUDA unified memory (`cudaMallocManaged`,
bitsandbytes' paged optimizer state): outside the caching allocator, so they are never counted
in the live bytes, the peak or the event log; their bytes add up in `unified_bytes` instead.

This module knows nothing about models, optimizers or GPUs; callers label tensors and phases.
Where MemTracker (torch.distributed._tools) walks module hooks and costs ~7-10x a raw step, this
does one dict lookup per output. Above a `FakeTensorMode` (the simulation) it also keeps its own
layer thin, with the same results: it answers fake tensors' `.device` queries (two in three of
the operators a fake step dispatches) as that mode would, and hands every other operator to the
mode's `dispatch` directly instead of dispatching it again through the C++ dispatcher.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from memorymark.accounting.allocator import on_stream
from memorymark.measurement import Breakdown, Category
from memorymark.units import in_gib

_DEVICE_QUERY = torch.ops.prim.device.default
_aten = torch.ops.aten
CUBLAS_OPS = frozenset(
    getattr(_aten, name).default
    for name in (
        "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot",
        "_addmm_activation", "_int_mm", "_scaled_mm",
    )
    if hasattr(_aten, name)
)  # fmt: skip
"""Operators whose CUDA kernels call cuBLAS or cuBLASLt (aten/src/ATen/native/cuda/Blas.cpp),
so the first of them a thread runs takes that thread's cuBLAS workspace from the allocator
(`getCurrentCUDABlasHandle`, aten/src/ATen/cuda/CublasHandlePool.cpp)."""
_META = torch.device("meta")
_FAKE_KEY = torch._C._TorchDispatchModeKey.FAKE
_PLAIN_TENSORS = (torch.Tensor, FakeTensor)
"""Tensor types with one storage of their own (`storages` needs no unwrapping)."""

# The kinds of a Segment's items (kind, nbytes, category, index).
_ALLOC = 0
_FREE_OWN = 1
"""A free of the segment's own allocation number `index`."""
_FREE_PREVIOUS = 2
"""A free of allocation `index` of the segment before it: state replaced every step."""
_OP_END = 3
"""An operator ended: a timeline entry and a peak check."""
_FREE_RAW = 4
"""While recording: a free by sequence number, resolved to one of the above at the end."""
_RELABEL = 5
"""While recording: a storage moved to another category, which a segment cannot replay."""
Item = tuple[int, int, Category | None, int]
"""A segment's or log's item: kind, bytes, category (None for an operator's end), index (an
operator's end: which operator, `_op_id`; an allocation: its stream)."""
_OP_IDS: dict[Any, int] = {}
"""A number for each operator seen, the same in every step of this process: what the depth
replay aligns steps of several depths by (memorymark/accounting/depth.py)."""
_OP_NAMES: list[str] = []
"""Each number's operator by name ("aten.mm.default"): what another process's numbers are read
by (`operator_names`, `renumbered`)."""
_NAME_IDS: dict[str, int] = {}


def _op_id(func: Any) -> int:
    found = _OP_IDS.get(func)
    if found is None:
        found = _OP_IDS[func] = _named_id(str(func))
    return found


def _named_id(name: str) -> int:
    found = _NAME_IDS.get(name)
    if found is None:
        found = _NAME_IDS[name] = len(_OP_NAMES)
        _OP_NAMES.append(name)
    return found


def operator_names() -> tuple[str, ...]:
    """The operators this process has numbered, by number: what a step's `operators` mean
    (the depth worker sends them with its steps)."""
    return tuple(_OP_NAMES)


def renumbered(operators: list[int], names: tuple[str, ...]) -> list[int]:
    """Another process's operator numbers (`names`: its `operator_names()`) as this one's."""
    mine = [_named_id(name) for name in names]
    return [mine[i] for i in operators]


_UNIFIED = threading.local()


@contextlib.contextmanager
def unified_memory() -> Iterator[None]:
    """In this thread, storages created in the block are CUDA unified memory (see module doc)."""
    depth = getattr(_UNIFIED, "depth", 0)
    _UNIFIED.depth = depth + 1
    try:
        yield
    finally:
        _UNIFIED.depth = depth


def _in_unified_memory() -> bool:
    return getattr(_UNIFIED, "depth", 0) > 0


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """In this thread, storages created in the block are not counted at all: values that
    live in registers inside a fused kernel (memorymark/step/compiled.py), never allocated."""
    before = getattr(_UNIFIED, "uncounted", False)
    _UNIFIED.uncounted = True
    try:
        yield
    finally:
        _UNIFIED.uncounted = before


def _fake_dispatch(
    fake_mode: FakeTensorMode,
    func: Any,
    types: tuple[type, ...],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """`func(*args, **kwargs)` as the fake mode beneath the tracker computes it, called
    directly: dispatching it again would cross from Python to the dispatcher and back to the
    same `FakeTensorMode.dispatch`, which costs a simulated step a tenth of its time. As the
    dispatcher does, the mode is unset while it runs (torch/csrc/utils/python_dispatch: the
    mode handling an operator is popped), so what it dispatches itself does not come back to it
    through the stack."""
    torch._C._unset_dispatch_mode(_FAKE_KEY)
    try:
        out = fake_mode.dispatch(func, types, args, kwargs)
    finally:
        torch._C._set_dispatch_mode(fake_mode)
    if out is NotImplemented:
        # A tensor subclass must handle it: let the dispatcher find it, as it would have.
        return func(*args, **kwargs)
    return out


class _Record:
    __slots__ = ("nbytes", "category", "seq")

    def __init__(self, nbytes: int, category: Category, seq: int) -> None:
        self.nbytes = nbytes
        self.category = category
        self.seq = seq
        """The allocation's sequence number: its free is logged as ~seq."""


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of a step as the tracker saw it, for `MemoryTracker.splice` to replay.

    Each item is (kind, nbytes, category, index): an allocation; a free of the segment's own
    allocation `index`, or of allocation `index` of the segment before it (state an optimizer
    replaces each step, as Adafactor's RMS); or the end of an operator.
    """

    items: tuple[Item, ...]
    allocations: int
    """Sequence numbers the segment takes."""
    survivors: frozenset[int]
    """Its own allocations still alive at its end: what the next segment frees."""


def storages(tensor: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages that hold `tensor`'s bytes. A wrapper subclass (a sharded DTensor) reports
    a storage of its full global size, which no device holds: its inner tensors (the shard
    this rank keeps) are what memory counts."""
    if not is_traceable_wrapper_subclass(tensor):
        return [tensor.untyped_storage()]
    names, _ = tensor.__tensor_flatten__()
    inner = (getattr(tensor, name) for name in names)
    return [s for t in inner if isinstance(t, torch.Tensor) for s in storages(t)]


class OperatorObserver(Protocol):
    """Anything that wants to see every operator the step runs (throughput.WorkCounter)."""

    def count(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Called after `func(*args, **kwargs)` returned `out`."""


def simulated_oom(
    requested_bytes: int, live_bytes: int, budget_bytes: int
) -> torch.OutOfMemoryError:
    """The error a byte budget raises: the same type as a CUDA OOM, so one handler serves both."""
    return torch.OutOfMemoryError(
        f"simulated out of memory: tried to allocate {in_gib(requested_bytes):.2f} GiB with "
        f"{in_gib(live_bytes):.2f} GiB live and a budget of {in_gib(budget_bytes):.2f} GiB"
    )


@dataclass(slots=True)
class PassApart:
    """What a pass logged apart from its step left (`MemoryTracker.pass_apart`), filled in when
    the pass ends."""

    log: tuple[int, list[int | None]] = (0, [])
    """(first seq, events) of the pass: its allocations and frees, numbered after the step's."""
    peak_bytes: int = 0
    """The live peak during the pass, what the step left live included."""


class MemoryTracker(TorchDispatchMode):
    """Live and peak storage bytes by category, with an optional budget that raises an OOM."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps a subclass's __torch_dispatch__ to keep Dynamo out of it
        # (torch/utils/_python_dispatch.py `__init_subclass__`): two more Python frames and
        # two eval-frame switches per operator, for nothing in an eager step (a compiled one
        # takes `CompiledStepTracker`).
        return False

    def __init__(self, budget_bytes: int | None = None) -> None:
        super().__init__()
        self.budget_bytes = budget_bytes
        self.phase_category = Category.ACTIVATIONS
        """Category given to storages created from now on (the backend sets it per phase)."""
        self.live_by_category: dict[Category, int] = dict.fromkeys(Category, 0)
        self.live_bytes = 0
        self.peak_bytes = 0
        self._peak_by_category = dict(self.live_by_category)
        self.timeline: list[int] = []
        self.category_timeline: list[tuple[int, ...]] | None = None
        """When a list (the symbolic sweep sets it), the live bytes by category after each
        operator, as the timeline has them in total: what a step's breakdown at its peak is
        read from at another batch size."""
        self.operators: list[int] | None = None
        """Kept with `category_timeline`: which operator each timeline entry is (`_op_id`)."""
        self.start_categories: tuple[int, ...] = ()
        """Live bytes by category when the peak was last reset (before the step's first op)."""
        self.events: list[int | None] = []
        """Allocations (+nbytes) and frees (~seq) since the last `reset_peak`, in order."""
        self.events_first_seq = 0
        """Sequence number of the first allocation in `events`."""
        self.baseline_events: tuple[int, list[int | None]] = (0, [])
        """(first seq, events) of setting up, kept by `mark_baseline`: what a fresh process
        allocates before its first step."""
        self.state_from: int | None = None
        """Where in `baseline_events` priming the optimizer's state began (`mark_state`): a
        training loop makes that state inside its first step instead. None: never marked."""
        self.optimizer_at: int | None = None
        """Where in `events` the step's first optimizer step began (`mark_optimizer`), where a
        training loop's first step makes the optimizer state. None: the step ran none."""
        self.work_counter: OperatorObserver | None = None
        """Sees every operator while set (the backend sets it around a step)."""
        self.unified_bytes = 0
        """Bytes of live storages in CUDA unified memory (`unified_memory()`), not in the peak."""
        self.thread_workspace: tuple[int, ...] = ()
        """What a thread asks the allocator for at its first cuBLAS call and keeps (its cuBLAS
        workspace): logged as allocations, not counted as tensors, once for the forward's
        thread and once for the backward's in each step's log (each log is a fresh process's
        first step). Set by the backend."""
        self.backward_thread = False
        """True while the step's backward pass runs (autograd's own device thread on CUDA)."""
        self.stream_of: Callable[[], int] | None = None
        """Which stream an allocation made now is made on, for the allocator replay (0 the
        default; set by a backend whose library allocates on streams of its own, as FSDP2
        does). None: every allocation on the default stream."""
        self._workspace_due: set[bool] = set()
        self._unified: set[int] = set()
        self._next_seq = 0
        self._baseline_end = 0
        self._records: dict[int, _Record] = {}
        self._host: set[int] = set()
        """Storages in host memory (offloaded): never counted."""
        self.host_allocations = False
        """While True, storages created are host memory (an optimizer step run on the CPU)."""
        self._log: list[Item] | None = None
        """What the segment being recorded did, in order; None when not recording."""
        self._log_first_seq = 0
        self._previous: tuple[int, Segment] | None = None
        """(first seq, segment) of the last segment recorded or spliced."""

    # -- labelling ---------------------------------------------------------------------------
    def track(self, tensor: torch.Tensor, category: Category) -> None:
        """Count `tensor`'s storage under `category` (moving it there if already counted)."""
        for storage in storages(tensor):
            self._track_storage(storage, category)

    def _track_storage(self, storage: torch.UntypedStorage, category: Category) -> None:
        if id(storage) in self._host or id(storage) in self._unified:
            return
        record = self._records.get(id(storage))
        if record is None:
            self._add(storage, category)
        elif record.category != category:
            if self._log is not None:
                self._log.append((_RELABEL, 0, None, 0))
            self.live_by_category[record.category] -= record.nbytes
            self.live_by_category[category] += record.nbytes
            record.category = category

    def track_all(self, tensors: Any, category: Category) -> None:
        """`track` every tensor among the leaves of a nested structure."""
        for leaf in tree_leaves(tensors):
            if isinstance(leaf, torch.Tensor):
                self.track(leaf, category)

    @property
    def next_seq(self) -> int:
        """The number the next allocation logged will take."""
        return self._next_seq

    def reset_peak(self) -> None:
        """Start a new measurement: the peak becomes what is live now, timeline and events empty."""
        self.peak_bytes = self.live_bytes
        self._peak_by_category = dict(self.live_by_category)
        self.timeline = []
        self.start_categories = tuple(self.live_by_category.values())
        if self.category_timeline is not None:
            self.category_timeline = []
            self.operators = []
        # Frees of setup allocations since the last step still apply to the next one.
        setup_end = ~self._baseline_end
        self.events = [e for e in self.events if e is not None and setup_end < e < 0]
        self.events_first_seq = self._next_seq
        self.optimizer_at = None
        self._workspace_due = {False, True} if self.thread_workspace else set()

    @contextlib.contextmanager
    def pass_apart(self) -> Iterator[PassApart]:
        """Log a pass apart from the step just tracked (a loop's evaluation pass between
        training steps): inside, a fresh event log numbered from the next allocation, and no
        work counter (not the step's work); after, the step's event log, peak and work counter
        are back and the pass's timeline is dropped, and the record yielded holds the pass's own
        log and live peak (the step's live bytes included)."""
        step_log = self.events_first_seq, self.events
        ops, step_peak, live_before = len(self.timeline), self.peak_bytes, self.live_bytes
        counter, self.work_counter = self.work_counter, None
        self.events = []
        self.events_first_seq = self._next_seq
        apart = PassApart()
        try:
            yield apart
        finally:
            apart.log = self.events_first_seq, self.events
            self.events_first_seq, self.events = step_log
            apart.peak_bytes = max([live_before, *self.timeline[ops:]])
            del self.timeline[ops:]
            if self.category_timeline is not None:
                del self.category_timeline[ops:]
            if self.operators is not None:
                del self.operators[ops:]
            self.peak_bytes, self.work_counter = step_peak, counter

    def mark_state(self) -> None:
        """Priming the optimizer's state begins now: what setting up logs from here on is what
        a training loop's first optimizer step makes (`allocator.replay`'s `state_from`)."""
        self.state_from = len(self.events)

    def mark_optimizer(self) -> None:
        """The step's optimizer step begins now; only its first mark in a step counts."""
        if self.optimizer_at is None:
            self.optimizer_at = len(self.events)

    def mark_baseline(self) -> None:
        """Keep the events logged so far as the setup every step starts from."""
        self.baseline_events = (self.events_first_seq, self.events)
        self._baseline_end = self._next_seq
        self.events = []
        self.events_first_seq = self._next_seq

    # -- segments ----------------------------------------------------------------------------
    def start_segment(self) -> None:
        """Record from now on what the tracker sees, until `finish_segment`."""
        self._log = []
        self._log_first_seq = self._next_seq

    def finish_segment(self, *, completed: bool = True) -> Segment | None:
        """Stop recording. Returns the segment when splicing it would stand for running the same
        stretch again, else None: when it did not complete, moved a storage to another
        category, freed what neither it nor the segment before allocated, or left allocations
        alive that the next segment would not free as this one freed the last one's."""
        log, self._log = self._log or [], None
        first, end = self._log_first_seq, self._next_seq
        previous, self._previous = self._previous, None
        if not completed:
            return None
        prev_first, prev = previous if previous is not None else (0, None)
        items: list[Item] = []
        allocs: list[tuple[int, Category | None]] = []
        alive: set[int] = set()
        freed_previous: dict[int, tuple[int, Category | None]] = {}
        standalone = True
        for item in log:
            kind, nbytes, category, seq = item
            if kind == _ALLOC:
                alive.add(len(allocs))
                allocs.append((nbytes, category))
            elif kind == _FREE_RAW and first <= seq < end:
                item = (_FREE_OWN, nbytes, category, seq - first)
                alive.discard(seq - first)
            elif kind == _FREE_RAW and prev is not None and seq - prev_first in prev.survivors:
                item = (_FREE_PREVIOUS, nbytes, category, seq - prev_first)
                freed_previous[seq - prev_first] = (nbytes, category)
            elif kind != _OP_END:
                standalone = False  # a relabel, or a free of something older
            items.append(item)
        segment = Segment(tuple(items), end - first, frozenset(alive))
        self._previous = first, segment
        # Periodic: what this one leaves, the next one frees as this one freed the last's.
        periodic = set(freed_previous) == alive == (prev.survivors if prev else set()) and all(
            freed_previous[i] == allocs[i] for i in alive
        )
        return segment if standalone and periodic else None

    def finish_state_segment(self, category: Category) -> tuple[Segment, range] | None:
        """Stop recording a first optimizer step that creates all its state in one stretch
        before its update, and return the step as a later one runs it: without the operators
        from the one that made the first allocation still alive at the end (the state) to the
        one that made the last, its allocations relabelled `category`; with the range of
        operators cut out. None when no state was made, when the stretch cut out or what
        follows frees or relabels what it should not, or when an allocation outside the
        stretch is left alive (state made inside the update, as SGD's momentum: the cut would
        not be what a later step runs)."""
        log, self._log = self._log or [], None
        first, end = self._log_first_seq, self._next_seq
        self._previous = None
        freed = {seq - first for kind, _, _, seq in log if kind == _FREE_RAW}
        # Where each operator's items begin, and how many allocations come before it.
        op_starts, allocs_before = [0], [0]
        state_ops: list[int] = []  # the operators that made state
        seq = 0
        for i, (kind, *_) in enumerate(log):
            if kind == _ALLOC:
                if seq not in freed and (not state_ops or state_ops[-1] != len(op_starts) - 1):
                    state_ops.append(len(op_starts) - 1)
                seq += 1
            elif kind == _OP_END:
                op_starts.append(i + 1)
                allocs_before.append(seq)
        if not state_ops or state_ops[-1] >= len(op_starts) - 1:
            return None
        cut = range(state_ops[0], state_ops[-1] + 1)
        head, tail = log[: op_starts[cut.start]], log[op_starts[cut.stop] :]
        head_allocs = allocs_before[cut.start]
        cut_allocs = allocs_before[cut.stop] - head_allocs
        items: list[Item] = []
        for kind, nbytes, _, seq in (*head, *tail):
            if kind == _ALLOC:
                items.append((_ALLOC, nbytes, category, seq))  # `seq` holds the stream here
            elif kind == _FREE_RAW and first <= seq < first + head_allocs:
                items.append((_FREE_OWN, nbytes, category, seq - first))
            elif kind == _FREE_RAW and first + head_allocs + cut_allocs <= seq < end:
                items.append((_FREE_OWN, nbytes, category, seq - first - cut_allocs))
            elif kind == _OP_END:
                items.append((_OP_END, 0, None, seq))  # `seq` holds the operator's id here
            else:
                return None  # a free of the state or of something older, or a relabel
        allocations = end - first - cut_allocs
        if sum(1 for item in items if item[0] == _FREE_OWN) != allocations:
            return None  # something outside the cut stays alive: a later step would differ
        return Segment(tuple(items), allocations, frozenset()), cut

    def splice(self, segment: Segment) -> None:
        """Count `segment` as if the stretch it recorded ran again now: its allocations and
        frees (numbered as they would be) into the event log, its operators into the timeline
        and the peak. The storages are not created; what it leaves alive is counted as live.
        Only without a budget: a stretch cut short by an OOM would leave what it held."""
        if self.budget_bytes is not None:
            raise ValueError("a tracker with a byte budget must run every step for real")
        first = self._next_seq
        prev_first = self._previous[0] if self._previous is not None else 0
        live, peak = self.live_bytes, self.peak_bytes
        by_category, events, timeline = self.live_by_category, self.events, self.timeline
        categories, operators = self.category_timeline, self.operators
        for kind, nbytes, category, index in segment.items:
            if kind == _OP_END:
                timeline.append(live)
                if categories is not None:
                    categories.append(tuple(by_category.values()))
                if operators is not None:
                    operators.append(index)
                if live > peak:
                    peak = live
                    self._peak_by_category = dict(by_category)
            # (An allocation's or a free's category is never None: only an operator's end's.)
            elif kind == _ALLOC:
                events.append(on_stream(nbytes, index))
                live += nbytes
                by_category[category] += nbytes  # type: ignore[index]
            else:
                events.append(~((first if kind == _FREE_OWN else prev_first) + index))
                live -= nbytes
                by_category[category] -= nbytes  # type: ignore[index]
        self.live_bytes, self.peak_bytes = live, peak
        self._next_seq = first + segment.allocations
        self._previous = first, segment

    def peak_breakdown(self) -> Breakdown:
        """Live bytes by category at the moment of the peak."""
        return Breakdown(**{c.value: n for c, n in self._peak_by_category.items()})

    # -- counting ----------------------------------------------------------------------------
    def _add(self, storage: torch.UntypedStorage, category: Category) -> None:
        if self.host_allocations:
            key = id(storage)
            self._host.add(key)
            weakref.finalize(storage, self._host.discard, key)
            return
        nbytes = storage.nbytes()
        if self.budget_bytes is not None and self.live_bytes + nbytes > self.budget_bytes:
            raise simulated_oom(nbytes, self.live_bytes, self.budget_bytes)
        key = id(storage)
        seq = self._next_seq
        self._next_seq = seq + 1
        stream = self._stream()
        self.events.append(on_stream(nbytes, stream))
        if self._log is not None:
            self._log.append((_ALLOC, nbytes, category, stream))
        record = _Record(nbytes, category, seq)
        self._records[key] = record
        self.live_bytes += nbytes
        self.live_by_category[category] += nbytes
        weakref.finalize(storage, self._free, key, record)

    def _stream(self) -> int:
        """The stream an allocation made now is made on (`stream_of`; 0: the default)."""
        return self.stream_of() if self.stream_of is not None else 0

    def _add_unified(self, storage: torch.UntypedStorage) -> None:
        key, nbytes = id(storage), storage.nbytes()
        self._unified.add(key)
        self.unified_bytes += nbytes
        weakref.finalize(storage, self._free_unified, key, nbytes)

    def _free_unified(self, key: int, nbytes: int) -> None:
        self._unified.discard(key)
        self.unified_bytes -= nbytes

    def to_host(self, tensors: Any) -> None:
        """The storages of `tensors` (leaves of a nested structure) live in host memory from
        now on (offloaded): no longer counted, and never counted again."""
        for leaf in tree_leaves(tensors):
            if not isinstance(leaf, torch.Tensor):
                continue
            for storage in storages(leaf):
                key = id(storage)
                record = self._records.get(key)
                if record is not None and record.nbytes:
                    self._release(record)
                    record.nbytes = 0
                if key not in self._host:
                    self._host.add(key)
                    weakref.finalize(storage, self._host.discard, key)

    def resized(self, tensor: torch.Tensor, category: Category) -> None:
        """`tensor`'s storage was resized in place (FSDP2 frees a gathered parameter with
        `resize_(0)` and gathers it again into the same storage): count its new size, under
        `category` when it grows back."""
        for storage in storages(tensor):
            record = self._records.get(id(storage))
            nbytes = storage.nbytes()
            if record is None:
                if nbytes:
                    self._add(storage, category)
                continue
            if nbytes == record.nbytes:
                if nbytes:
                    self._track_storage(storage, category)
                continue
            if self._log is not None:
                self._log.append((_RELABEL, 0, None, 0))  # a segment cannot replay a resize
            if record.nbytes:
                self._release(record)
            if nbytes:
                if self.budget_bytes is not None and self.live_bytes + nbytes > self.budget_bytes:
                    raise simulated_oom(nbytes, self.live_bytes, self.budget_bytes)
                record.nbytes, record.category, record.seq = nbytes, category, self._next_seq
                self._next_seq += 1
                self.events.append(on_stream(nbytes, self._stream()))
                self.live_bytes += nbytes
                self.live_by_category[category] += nbytes
            else:
                record.nbytes = 0

    def _release(self, record: _Record) -> None:
        self.events.append(~record.seq)
        self.live_bytes -= record.nbytes
        self.live_by_category[record.category] -= record.nbytes

    def _free(self, key: int, record: _Record) -> None:
        if self._records.get(key) is record:
            del self._records[key]
        if not record.nbytes:
            return  # resized away already
        self.events.append(~record.seq)
        if self._log is not None:
            self._log.append((_FREE_RAW, record.nbytes, record.category, record.seq))
        self.live_bytes -= record.nbytes
        self.live_by_category[record.category] -= record.nbytes

    def _serve_workspace(self) -> None:
        """Log the current thread's cuBLAS workspace requests, the first time it runs one."""
        thread = self.backward_thread
        if thread not in self._workspace_due:
            return
        self._workspace_due.discard(thread)
        if self._log is not None:
            self._log.append((_RELABEL, 0, None, 0))  # a segment cannot replay it
        for nbytes in self.thread_workspace:
            self.events.append(nbytes)
            self._next_seq += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._workspace_due and func in CUBLAS_OPS:
            self._serve_workspace()
        if func is _DEVICE_QUERY:
            # Fake tensors answer `.device` through dispatch (two in three operators a
            # simulated step dispatches); it allocates nothing and would make the simulated
            # timeline longer than a real run's. Answered here as FakeTensorMode answers it
            # (fake_tensor.py `_device_handler`), without dispatching again to that mode.
            if len(args) == 1 and isinstance(args[0], FakeTensor):
                fake = args[0]
                return _META if fake.fake_mode.in_kernel_invocation else fake.fake_device
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        fake_mode = torch._C._get_dispatch_mode(_FAKE_KEY)
        if fake_mode is not None and all(t is FakeTensor for t in types):
            out = _fake_dispatch(fake_mode, func, types, args, kwargs)
        else:
            out = func(*args, **kwargs)
        if self.work_counter is not None:
            self.work_counter.count(func, args, kwargs, out)
        # Most operators return one plain tensor: its storage, without walking a pytree.
        if type(out) in _PLAIN_TENSORS:
            self._created(out.untyped_storage())
        else:
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    for storage in storages(leaf):
                        self._created(storage)
        live = self.live_bytes
        self.timeline.append(live)
        if self.category_timeline is not None:
            self.category_timeline.append(tuple(self.live_by_category.values()))
            if self.operators is not None:
                self.operators.append(_op_id(func))
        if self._log is not None:
            self._log.append((_OP_END, 0, None, _op_id(func)))
        if live > self.peak_bytes:
            self.peak_bytes = live
            self._peak_by_category = dict(self.live_by_category)
        return out

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Off while Dynamo and AOTAutograd trace a compiled region, on while the graphs they
        # made run (torch/utils/_python_dispatch.py): what is counted is what the compiled
        # code allocates, never the tracing's own fake values.
        return True

    def _created(self, storage: torch.UntypedStorage) -> None:
        """Count an operator's output storage if it is new (not a view of one counted)."""
        key = id(storage)
        if key in self._records or key in self._unified or key in self._host:
            return
        if getattr(_UNIFIED, "uncounted", False):
            return
        if _in_unified_memory():
            self._add_unified(storage)
        else:
            self._add(storage, self.phase_category)


class CompiledStepTracker(MemoryTracker):
    """The tracker for a compiled step: the same counting, with Dynamo kept out of its own
    frames (`_should_skip_dynamo`), which the eager regions around a graph break would
    otherwise try to compile. Costs two Python frames per operator, so only compiled steps
    use it."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return True

    __torch_dispatch__ = MemoryTracker.__torch_dispatch__
