"""A model of PyTorch's CUDA caching allocator: from a step's allocations to what the GPU needs.

The tracker counts the bytes of live tensor storages. A CUDA GPU hands out more than that: the
caching allocator rounds every request, carves small ones out of 2 MiB segments and mid-sized ones
out of 20 MiB segments, and keeps freed blocks cached instead of returning them to the device.
`replay` runs a step's allocation and free events through those rules and predicts what
`torch.cuda.max_memory_allocated()` (live blocks, rounded) and `max_memory_reserved()` (segments
obtained with cudaMalloc) would report, and whether cudaMalloc would fail against a budget, for a
process that reaches its first step as `LoopStart` says: as a training loop (the default: no
flush, the optimizer state made inside step 1) or as a probe (state primed, cache emptied).

Each rule cites the function of `c10/cuda/CUDACachingAllocator.cpp` it copies (pytorch/pytorch,
read at commit 001074d2). Not modelled: expandable segments (`expandable_segments:True`),
`garbage_collection_threshold`, `max_split_size_mb` and `roundup_power2_divisions` (all off by
default), CUDA graph private pools, `record_stream`'s deferred frees (timing, which a replay
has not), and memory kernels allocate outside the tracked storages (cuDNN workspaces, kernels'
own temporaries). Streams are modelled: a block is cached for the stream it was allocated on
and serves that stream alone (`BlockComparatorSize` orders a pool by stream first and
`get_free_block` takes only a block of the request's stream), which matters where FSDP2
gathers parameters and reduces gradients on streams of their own. The cuBLAS workspaces are
replayed as `resident` requests. Pure Python, no torch: the event log is a list of ints, see
`replay`.
Knows nothing of models, devices, fit verdicts or search.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# CUDACachingAllocator.cpp, the constants at the top of namespace Native.
MIN_BLOCK_SIZE = 512  # kMinBlockSize: "all sizes are rounded to at least 512 bytes"
SMALL_SIZE = 1024 * 1024  # kSmallSize: "largest 'small' allocation is 1 MiB"
SMALL_BUFFER = 2 * 1024 * 1024  # kSmallBuffer: "'small' allocations are packed in 2 MiB blocks"
MIN_LARGE_ALLOC = 10 * 1024 * 1024  # kMinLargeAlloc: "allocations between 1 and 10 MiB may
# use kLargeBuffer"
LARGE_BUFFER = 20 * 1024 * 1024  # kLargeBuffer: "'large' allocations may be packed in 20 MiB"
ROUND_LARGE = 2 * 1024 * 1024  # kRoundLarge: "round up large allocations to 2 MiB"

STREAM_SHIFT = 48
"""An allocation event carries its stream above this bit (2**48 bytes is 256 TiB, past any
request): `on_stream`. Stream 0 is the default stream, so a one-stream log is plain bytes."""
_BYTES_MASK = (1 << STREAM_SHIFT) - 1


def on_stream(nbytes: int, stream: int) -> int:
    """The allocation event of `nbytes` made on `stream` (0: the default stream)."""
    return nbytes | (stream << STREAM_SHIFT)


def event_bytes(event: int) -> int:
    """The bytes an allocation event (>= 0) asks for, whatever its stream."""
    return event & _BYTES_MASK


def event_stream(event: int) -> int:
    """The stream an allocation event (>= 0) is made on."""
    return event >> STREAM_SHIFT


def canonical_frees(events: Sequence[int | None], cut: int | None = None) -> list[int | None]:
    """`events` with each run of consecutive frees in the order of what they free (the oldest
    allocation first); a run ends at an allocation or an `empty_cache` (None), and none crosses
    `cut` (where the optimizer's state is made: a replay splits the log there).

    Freeing blocks with no allocation between them leaves the cache in the same state whatever
    their order (each block returns to its pool, merged with whichever free neighbours it has
    when the run ends), so the order carries nothing a replay reads. It is not always the same
    from one trace of a step to the next: autocast's weight cache is freed in its hash map's
    order when the forward pass ends (`clear_cache` in aten/src/ATen/autocast_mode.cpp clears
    `cached_casts`, keyed by TensorImpl pointer), so a LoRA model's casts are freed in one
    order or another from run to run, and at two depths or two batch sizes alike. Written in
    one order, two traces of a step align (the batch and depth replays)."""
    out = list(events)
    start = 0
    while start < len(out):
        end = start
        while (
            end < len(out)
            and (e := out[end]) is not None
            and e < 0
            and (end == start or end != cut)
        ):
            end += 1
        if end - start > 1:
            frees = [e for e in out[start:end] if e is not None]
            out[start:end] = sorted(frees, reverse=True)  # ~seq falls as seq grows
        start = end + 1 if end == start else end
    return out


def round_size(nbytes: int) -> int:
    """The block size a request of `nbytes` gets: a multiple of 512, at least 512 (`round_size`,
    with roundup_power2_divisions unset, its default)."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * ((nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def segment_size(size: int) -> int:
    """Bytes cudaMalloc'd when no cached block fits a rounded `size` (`get_allocation_size`):
    2 MiB for small requests, 20 MiB up to 10 MiB, else the size rounded up to 2 MiB."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


def is_small(size: int) -> bool:
    """True when a rounded `size` is served by the small pool (`get_pool`: size <= kSmallSize)."""
    return size <= SMALL_SIZE


def should_split(block_size: int, size: int, small: bool) -> bool:
    """Whether a cached block is split to serve `size` (`should_split`): in the small pool when at
    least 512 bytes remain, in the large pool when more than 1 MiB remains (max_split_size unset).
    An unsplit block is handed out whole and counts whole towards allocated bytes."""
    remaining = block_size - size
    return remaining >= MIN_BLOCK_SIZE if small else remaining > SMALL_SIZE


_NAMED_STREAMS = 8
_POOLS = {
    (stream, small): (stream, small) for stream in range(_NAMED_STREAMS) for small in (False, True)
}
"""One (stream, small) tuple per pool of the first streams, made once, not per request."""


class _Block:
    """A contiguous piece of one segment: allocated or cached, linked to its neighbours."""

    __slots__ = ("size", "addr", "pool", "free", "prev", "next")

    def __init__(self, size: int, addr: int, pool: tuple[int, bool]) -> None:
        self.size = size
        self.addr = addr
        self.pool = pool
        """(stream, small): the cached blocks this one joins when freed."""
        self.free = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


class AllocatorOutOfMemory(Exception):
    """cudaMalloc would fail: the budget cannot hold another segment, even after the allocator
    returned every fully cached segment to the device."""

    def __init__(self, requested_bytes: int, reserved_bytes: int, budget_bytes: int) -> None:
        self.requested_bytes = requested_bytes
        self.reserved_bytes = reserved_bytes
        self.budget_bytes = budget_bytes
        super().__init__(f"a {requested_bytes}-byte segment does not fit")


class CachingAllocator:
    """Best-fit blocks carved from cached segments, per pool; peaks of allocated and reserved."""

    def __init__(self, budget_bytes: int | None = None) -> None:
        self.budget_bytes = budget_bytes
        """Bytes cudaMalloc may reserve in total (None: unlimited)."""
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.alloc_retries = 0
        """Times a cudaMalloc failed and was tried again after cached segments went back to
        the device, whether or not that succeeded (`num_alloc_retries` in `memory_stats()`)."""
        # Cached blocks of each (stream, small) pool, sorted by (size, address) like
        # BlockComparatorSize within a stream, so the first entry not smaller than a request is
        # the best fit, lowest address first.
        self._cached: dict[tuple[int, bool], list[tuple[int, int, _Block]]] = {}
        self._next_addr = 0
        self.live: dict[int, _Block] | None = None
        """The blocks a replay holds, by allocation number (set by `replay`, for `layout`)."""

    def reset_peak(self) -> None:
        """Peaks restart from what is allocated and reserved now (`reset_peak_memory_stats`)."""
        self.peak_allocated_bytes = self.allocated_bytes
        self.peak_reserved_bytes = self.reserved_bytes

    def malloc(self, nbytes: int, stream: int = 0) -> _Block:
        """Serve a request of `nbytes` (> 0) on `stream` the way `DeviceCachingAllocator::malloc`
        does."""
        # round_size, is_small and should_split written out: a 70B model's sweep replays about
        # a million requests, and three calls each were a third of their cost.
        size = MIN_BLOCK_SIZE * ((nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE) or MIN_BLOCK_SIZE
        small = size <= SMALL_SIZE
        pool = _POOLS[stream, small] if stream < _NAMED_STREAMS else (stream, small)
        cached = self._cached.get(pool)
        if cached is None:
            cached = self._cached[pool] = []
        i = bisect_left(cached, (size,))
        block = cached.pop(i)[2] if i < len(cached) else self._new_segment(size, pool)
        remaining = block.size - size
        if remaining >= MIN_BLOCK_SIZE if small else remaining > SMALL_SIZE:
            # alloc_found_block: the request takes the front, the remainder stays cached.
            rest = _Block(block.size - size, block.addr + size, pool)
            rest.free = True
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            insort(cached, (rest.size, rest.addr, rest))
        block.free = False
        self.allocated_bytes += block.size
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes
        return block

    def free(self, block: _Block) -> None:
        """Cache a block again, merged with free neighbours (`free_block`, `try_merge_blocks`).
        Nothing goes back to the device: reserved bytes stay."""
        self.allocated_bytes -= block.size
        block.free = True
        cached = self._cached[block.pool]
        prev, nxt = block.prev, block.next
        if prev is not None and prev.free:
            cached.pop(bisect_left(cached, (prev.size, prev.addr)))
            block.addr, block.size, block.prev = prev.addr, prev.size + block.size, prev.prev
            if block.prev is not None:
                block.prev.next = block
        if nxt is not None and nxt.free:
            cached.pop(bisect_left(cached, (nxt.size, nxt.addr)))
            block.size += nxt.size
            block.next = nxt.next
            if block.next is not None:
                block.next.prev = block
        insort(cached, (block.size, block.addr, block))

    def _new_segment(self, size: int, pool: tuple[int, bool]) -> _Block:
        # alloc_block; on failure malloc calls release_cached_blocks (every cached block that is
        # a whole segment goes back with cudaFree) and tries once more before raising the OOM.
        nbytes = segment_size(size)
        if self.budget_bytes is not None and self.reserved_bytes + nbytes > self.budget_bytes:
            self._release_cached_segments()
            # alloc_block(..., isRetry=true) counts `stats.num_alloc_retries += 1` before it
            # tries, so a retry that fails too is counted (the GPU reported 1 at the step GPT-2
            # and BERT died at, capped at an A10's capacity).
            self.alloc_retries += 1
            if self.reserved_bytes + nbytes > self.budget_bytes:
                raise AllocatorOutOfMemory(nbytes, self.reserved_bytes, self.budget_bytes)
        block = _Block(nbytes, self._next_addr, pool)
        self._next_addr += nbytes
        self.reserved_bytes += nbytes
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes
        return block

    def empty_cache(self) -> None:
        """Return every whole cached segment to the device (`torch.cuda.empty_cache()`, which
        calls `release_cached_blocks`; allocation retries call the same)."""
        self._release_cached_segments()

    def layout(self) -> tuple[tuple[int, tuple[tuple[int, bool], ...]], ...]:
        """The segments in address order, each as its stream and its blocks' (size, free): what
        decides how the next requests are served. Two allocators with the same layout and the
        same live blocks serve the same requests the same way (addresses differ only by an
        offset)."""
        blocks = [entry[2] for cached in self._cached.values() for entry in cached]
        blocks += self._live_blocks()
        heads = sorted((b for b in blocks if b.prev is None), key=lambda b: b.addr)
        segments: list[tuple[int, tuple[tuple[int, bool], ...]]] = []
        for head in heads:
            segment: list[tuple[int, bool]] = []
            block: _Block | None = head
            while block is not None:
                segment.append((block.size, block.free))
                block = block.next
            segments.append((head.pool[0], tuple(segment)))
        return tuple(segments)

    def _live_blocks(self) -> list[_Block]:
        return list(self.live.values()) if self.live is not None else []

    def _release_cached_segments(self) -> None:
        # release_blocks: only blocks with no neighbours (`!prev && !next`) are whole segments.
        for cached in self._cached.values():
            kept = [e for e in cached if e[2].prev is not None or e[2].next is not None]
            self.reserved_bytes -= sum(e[0] for e in cached) - sum(e[0] for e in kept)
            cached[:] = kept  # in place: malloc holds this list


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the caching allocator would report for one step."""

    allocated_bytes: int
    """Peak of live blocks during the step (`max_memory_allocated` after a peak reset)."""
    reserved_bytes: int
    """Peak of cudaMalloc'd segments, counting what setting up the model reserved before it; for
    an out-of-memory, what the failing cudaMalloc would have brought it to (over the budget)."""
    out_of_memory: bool = False
    """True when cudaMalloc would have failed against the budget."""
    requested_bytes: int = 0
    """The segment that did not fit, when out_of_memory."""
    alloc_retries: int = 0
    """cudaMallocs tried again after the cached segments went back to the device, over every
    step replayed (a retry that failed, the OOM's, included)."""
    first_reserved_bytes: int | None = None
    """Step 1's reserved peak (what a first-step measurement reports); `reserved_bytes` is the
    loop's. None when step 1 did not finish."""
    retries_per_step: tuple[int, ...] = ()
    """Allocation retries of each step replayed, in order (the last one's OOM included)."""
    reserved_per_step: tuple[int, ...] = ()
    """Each finished step's reserved peak, in order (as `reset_peak_memory_stats` before each
    step and `max_memory_reserved` after it report)."""
    allocated_per_step: tuple[int, ...] = ()
    """Each finished step's allocated peak, in order."""
    steps: int = 1
    """Steps replayed: until the segments stopped changing, an OOM, or `MAX_LOOP_STEPS` (a loop
    that settled while retrying runs to `MAX_LOOP_STEPS`, its settled step copied, not
    replayed)."""


EMPTY_CACHE = None
"""The event `torch.cuda.empty_cache()`: every whole cached segment goes back to the device."""

EventLog = tuple[int, Sequence[int | None]]
"""(sequence number of the log's first allocation, events). An event n >= 0 allocates
`event_bytes(n)` bytes on stream `event_stream(n)` (plain bytes on the default stream) and takes
the next sequence number; an event n < 0 frees the allocation numbered ~n; the event
`EMPTY_CACHE` empties the cache. Frees of allocations outside the logs replayed together are
ignored."""


@dataclass(frozen=True, slots=True)
class LoopStart:
    """How a process reaches its first training step: what a replay runs before step 1."""

    name: str
    """What reports call it ("training loop", "probe")."""
    lazy_state: bool
    """The optimizer's state is created inside step 1, at its first `optimizer.step()` (every
    torch optimizer makes its state at its first step: `_init_group` in torch/optim/adam.py),
    after backward freed the activations, in blocks they leave cached; else it is made before
    step 1, as a probe primes it."""
    flush: bool
    """The cache is emptied after setting up, before step 1 (`torch.cuda.empty_cache()`)."""
    says: str
    """How a report says it, after "memory figures are for"."""


TRAINING_LOOP = LoopStart(
    "training loop",
    lazy_state=True,
    flush=False,
    says="a training loop: no cache flush, the optimizer state made at step 1",
)
"""The loop people write, and what the replay models by default: the model moved to the GPU,
then step after step, with no cache flush anywhere. HF Trainer runs this loop unless
`torch_empty_cache_steps` is set (transformers/training_args.py: "If left unset or set to None,
cache will not be emptied"; its default is None)."""
LIGHTNING_LOOP = LoopStart(
    "Lightning's loop",
    lazy_state=True,
    flush=True,
    says="Lightning's loop: the cache emptied after setting up, the optimizer state made at step 1",
)
"""Lightning's `Trainer.fit`: the same loop, but the cache is emptied once after setting up
(`_CheckpointConnector.resume_end` calls `torch.cuda.empty_cache()` on every fit, checkpoint or
not: lightning/pytorch/trainer/trainer.py `_run`, lightning 2.6)."""
PROBE = LoopStart(
    "probe",
    lazy_state=False,
    flush=True,
    says="a probe: the optimizer state primed and the cache emptied before the step",
)
"""A MemoryMark probe on a real GPU (`Backend.measure`) and the calibration rows committed up
to 2026-11-23: the optimizer state primed before the step, the cache emptied, then the step.
A measurement device, never the model of the user's run."""

LOOP_STARTS = {start.name: start for start in (TRAINING_LOOP, LIGHTNING_LOOP, PROBE)}


def loop_start_named(name: str) -> LoopStart:
    """The `LoopStart` called `name` (as files and reports write it)."""
    try:
        return LOOP_STARTS[name]
    except KeyError:
        raise ValueError(
            f"unknown loop start {name!r}: use one of {', '.join(LOOP_STARTS)}"
        ) from None


MAX_LOOP_STEPS = 8
"""Most steps a loop replay runs when its segments keep changing. Every loop measured on an H100
(docs/calibration/steady-state-*.jsonl) settled by its second step; the cap bounds the cost
(a replayed step costs about 1% of a simulated probe)."""


def replay(
    setup: EventLog,
    step: EventLog,
    budget_bytes: int | None = None,
    resident: Sequence[int] = (),
    steps: int | None = 1,
    between: EventLog | None = None,
    *,
    start: LoopStart = TRAINING_LOOP,
    state_from: int | None = None,
    optimizer_at: int | None = None,
) -> Prediction:
    """Replay a fresh process: the `setup` events (weights, optimizer state), then consecutive
    runs of `step`: `steps` of them, or with `steps=None` until the loop is steady (its
    segments stop changing: every later step would replay the same), an OOM, or
    `MAX_LOOP_STEPS`. `between` (an evaluation pass, logged after one step) runs after each
    step, as a loop that evaluates between training steps; its peaks count with the step's.

    `start` says how the process reaches step 1. A training loop (the default) flushes nothing
    and creates its optimizer state inside step 1: the setup's events from `state_from` on
    (priming the state, as a probe does) are not run; what they leave allocated (the state) is
    allocated at event `optimizer_at` of step 1 (where its first optimizer step begins), after
    backward freed the activations, from the blocks they left cached. Without both indices the
    state stays in the setup. A probe (`PROBE`) runs the whole setup and empties the cache
    before step 1, as `Backend.measure` does. `resident` lists requests made through the
    allocator outside the tracked storages that live through the step and are made before
    it. Peaks are over the steps only, as a measurement that resets peak statistics before the
    first: allocated the highest of any step; reserved the loop's (`reserved_bytes`) and step
    1's (`first_reserved_bytes`), counting what setting up reserved.

    From the second step on, the allocator starts with the segments the first left cached,
    carved for the first step's order of requests, around what the first step allocated and
    kept (the backward thread's cuBLAS workspace, taken from a block the forward freed; the
    optimizer state, made where backward left room). On a real GPU that is where a loop's
    reserved bytes grow, and near the capacity where it dies: GPT-2 in fp32 at batch 64
    reserved 14.30 GiB at step 1 and 15.83 GiB from step 2 on; GPT-2 and BERT in bf16-mixed,
    capped at an A10's capacity, ran step 1 after a retry and ran out of memory at step 2
    (docs/calibration/README.md).
    """
    allocator = CachingAllocator(budget_bytes)
    live: dict[int, _Block] = {}
    allocator.live = live
    loop = step if between is None else _joined(step, between)
    # Where the state moves from (the setup) and to (step 1): both indices, or it stays put.
    moved = None
    if start.lazy_state and state_from is not None and optimizer_at is not None:
        moved = (state_from, optimizer_at)
    state = _state_made(setup, moved[0], step, moved[1]) if moved else ()
    retries: list[int] = []
    reserved: list[int] = []
    allocated: list[int] = []
    first_reserved: int | None = None
    peak_allocated = peak_reserved = before = 0
    try:
        if moved:
            _run_setup_without_state(allocator, live, setup, moved[0])
        else:
            _run(allocator, live, *setup)
        if start.flush:
            allocator.empty_cache()
        for nbytes in resident:
            allocator.malloc(nbytes)
        last = None
        for n in range(MAX_LOOP_STEPS if steps is None else steps):
            allocator.reset_peak()
            before = allocator.alloc_retries
            retries.append(0)
            if n == 0 and moved:
                _run_making_state(allocator, live, loop, moved[1], state)
            else:
                _run(allocator, live, *(loop if n == 0 else _repeated(loop, n)))
            retries[-1] = allocator.alloc_retries - before
            reserved.append(allocator.peak_reserved_bytes)
            allocated.append(allocator.peak_allocated_bytes)
            peak_allocated = max(peak_allocated, allocator.peak_allocated_bytes)
            peak_reserved = max(peak_reserved, allocator.peak_reserved_bytes)
            if first_reserved is None:
                first_reserved = allocator.peak_reserved_bytes
            if steps is None:
                layout = allocator.layout()
                if layout == last:
                    # Steady: this step started from the segments the one before started from,
                    # so every later step replays as it did, its retries and peaks included.
                    # Where it retried, the loop runs to MAX_LOOP_STEPS as it always did, but
                    # the steps after this one are copied, not replayed.
                    if retries[-1]:
                        copies = MAX_LOOP_STEPS - n - 1
                        for figures in (retries, reserved, allocated):
                            figures.extend([figures[-1]] * copies)
                        allocator.alloc_retries += retries[-1] * copies
                    break
                last = layout
    except AllocatorOutOfMemory as oom:
        if retries:  # else setting up alone did not fit
            retries[-1] = allocator.alloc_retries - before
        return Prediction(
            max(peak_allocated, allocator.peak_allocated_bytes),
            max(peak_reserved, oom.reserved_bytes + oom.requested_bytes),
            out_of_memory=True,
            requested_bytes=oom.requested_bytes,
            alloc_retries=allocator.alloc_retries,
            first_reserved_bytes=first_reserved,
            retries_per_step=tuple(retries),
            reserved_per_step=tuple(reserved),
            allocated_per_step=tuple(allocated),
            steps=len(retries),
        )
    return Prediction(
        peak_allocated,
        peak_reserved,
        alloc_retries=allocator.alloc_retries,
        first_reserved_bytes=first_reserved,
        retries_per_step=tuple(retries),
        reserved_per_step=tuple(reserved),
        allocated_per_step=tuple(allocated),
        steps=len(retries),
    )


def _allocations(events: Iterable[int | None]) -> int:
    """How many sequence numbers `events` take (one per allocation, zero-byte ones too)."""
    return sum(1 for e in events if e is not None and e >= 0)


def _state_made(
    setup: EventLog, state_from: int, step: EventLog, optimizer_at: int
) -> tuple[tuple[int, int], ...]:
    """(sequence number, bytes) of what priming the optimizer left allocated: the setup's
    allocations from event `state_from` on that it does not free, nor the step before its
    optimizer step (those are not state a loop carries). In the order they were made."""
    first, events = setup
    seq = first + _allocations(events[:state_from])
    made: dict[int, int] = {}
    for e in events[state_from:]:
        if e is None:
            continue
        if e >= 0:
            made[seq] = e
            seq += 1
        else:
            made.pop(~e, None)
    for e in step[1][:optimizer_at]:
        if e is not None and e < 0:
            made.pop(~e, None)
    return tuple((s, n) for s, n in made.items() if n)


def _run_setup_without_state(
    allocator: CachingAllocator, live: dict[int, _Block], setup: EventLog, state_from: int
) -> None:
    """The setup up to priming the optimizer; priming's frees of what came before it (none
    for the optimizers known) still apply, as the loop would make the same frees."""
    first, events = setup
    _run(allocator, live, first, events[:state_from])
    # Frees alone take no numbers; those of priming's own allocations find nothing live.
    _run(allocator, live, first, [e for e in events[state_from:] if e is not None and e < 0])


def _run_making_state(
    allocator: CachingAllocator,
    live: dict[int, _Block],
    loop: EventLog,
    optimizer_at: int,
    state: Sequence[tuple[int, int]],
) -> None:
    """Step 1 of a training loop: the step up to its first optimizer step, the optimizer's
    state made there (under the numbers priming gave it, which later steps' frees name), then
    the rest of the step."""
    first, events = loop
    head = events[:optimizer_at]
    _run(allocator, live, first, head)
    for seq, event in state:
        live[seq] = allocator.malloc(event_bytes(event), event_stream(event))
    _run(allocator, live, first + _allocations(head), events[optimizer_at:])


def _joined(step: EventLog, after: EventLog) -> EventLog:
    """`step` then `after` as one log: `after`'s allocations renumbered to follow the step's
    (it may have been logged later, after other steps), its frees of its own allocations with
    them; frees of anything older (the setup's) kept as they are."""
    first, events = step
    after_first, after_events = after
    shift = first + sum(1 for e in events if e is not None and e >= 0) - after_first
    joined = list(events)
    joined += [
        e if e is None or e >= 0 or ~e < after_first else ~(~e + shift) for e in after_events
    ]
    return first, joined


def _repeated(step: EventLog, n: int) -> EventLog:
    """`step` run for the (n+1)-th time: its own allocations and frees, renumbered after the
    n runs before it. Allocations it never frees (state a first step creates and later steps
    reuse) are not made again, and frees of setup allocations are dropped (the first step
    already made them)."""
    first, events = step
    shift = n * sum(1 for e in events if e is not None and e >= 0)
    freed = {~e for e in events if e is not None and e < 0}
    again: list[int | None] = []
    seq = first
    for e in events:
        if e is None:
            again.append(e)
        elif e >= 0:
            # A kept allocation still takes its number so later frees keep pointing right;
            # 0 makes none (zero-byte storages get no block either).
            again.append(e if seq in freed else 0)
            seq += 1
        elif ~e >= first:
            again.append(~(~e + shift))
    return first + shift, again


def _run(
    allocator: CachingAllocator, live: dict[int, _Block], seq: int, events: Iterable[int | None]
) -> None:
    malloc, free = allocator.malloc, allocator.free
    for event in events:
        if event is None:
            allocator.empty_cache()
        elif event >= 0:
            # A zero-byte storage gets no block: `NativeCachingAllocator::allocate` calls
            # malloc only when size != 0.
            if event:
                live[seq] = malloc(event & _BYTES_MASK, event >> STREAM_SHIFT)
            seq += 1
        else:
            block = live.pop(~event, None)
            if block is not None:
                free(block)
