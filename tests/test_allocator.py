"""The caching-allocator model: rounding, pools, segments, caching and OOM on hand-made events.

Every expected number is worked out from the rules in c10/cuda/CUDACachingAllocator.cpp that
memorymark/accounting/allocator.py cites.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memorymark.accounting.allocator import (
    LIGHTNING_LOOP,
    MAX_LOOP_STEPS,
    PROBE,
    TRAINING_LOOP,
    CachingAllocator,
    canonical_frees,
    event_bytes,
    event_stream,
    loop_start_named,
    on_stream,
    replay,
    round_size,
    segment_size,
    should_split,
)

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)

KIB, MIB = 2**10, 2**20


@pytest.mark.parametrize(
    ("request_bytes", "block"),
    [(1, 512), (4, 512), (512, 512), (513, 1024), (1000, 1024), (4000, 4096), (MIB + 1, MIB + 512)],
)
def test_requests_round_up_to_512_byte_blocks(request_bytes, block):
    assert round_size(request_bytes) == block


@pytest.mark.parametrize(
    ("size", "segment"),
    [
        (512, 2 * MIB),  # small pool: 2 MiB segments
        (MIB, 2 * MIB),  # 1 MiB is still small
        (MIB + 512, 20 * MIB),  # 1-10 MiB: a 20 MiB segment to split
        (10 * MIB - 512, 20 * MIB),
        (10 * MIB, 10 * MIB),  # from 10 MiB: its own segment, rounded to 2 MiB
        (11 * MIB, 12 * MIB),
        (100 * MIB + 512, 102 * MIB),
    ],
)
def test_segment_sizes_by_request(size, segment):
    assert segment_size(size) == segment


def test_split_thresholds_differ_by_pool():
    assert should_split(2 * MIB, 2 * MIB - 512, small=True)  # 512 bytes remain: split
    assert not should_split(2 * MIB, 2 * MIB - 511, small=True)
    assert should_split(20 * MIB, 19 * MIB - 512, small=False)  # just over 1 MiB remains
    assert not should_split(20 * MIB, 19 * MIB, small=False)  # exactly 1 MiB: kept whole


def test_small_requests_pack_into_2_mib_segments():
    a = CachingAllocator()
    blocks = [a.malloc(512 * KIB) for _ in range(4)]
    assert (a.allocated_bytes, a.reserved_bytes) == (2 * MIB, 2 * MIB)
    blocks.append(a.malloc(512 * KIB))  # the first segment is full: a second one
    assert (a.allocated_bytes, a.reserved_bytes) == (2.5 * MIB, 4 * MIB)
    assert len(blocks) == 5


def test_mid_sized_requests_share_a_20_mib_segment():
    a = CachingAllocator()
    for _ in range(6):
        a.malloc(3 * MIB)  # 6 x 3 MiB from one 20 MiB segment, 2 MiB left cached
    assert (a.allocated_bytes, a.reserved_bytes) == (18 * MIB, 20 * MIB)
    a.malloc(3 * MIB)  # the 2 MiB remainder is too small
    assert (a.allocated_bytes, a.reserved_bytes) == (21 * MIB, 40 * MIB)


def test_an_unsplit_remainder_counts_as_allocated():
    # 19.5 MiB gets a 20 MiB segment; the 0.5 MiB left is not > 1 MiB, so the block stays whole
    # and max_memory_allocated counts all 20 MiB.
    a = CachingAllocator()
    a.malloc(19 * MIB + 512 * KIB)
    assert (a.allocated_bytes, a.reserved_bytes) == (20 * MIB, 20 * MIB)


def test_pools_are_separate():
    a = CachingAllocator()
    a.free(a.malloc(512 * KIB))  # a cached 2 MiB small segment...
    a.malloc(MIB + 512)  # ...cannot serve a large request
    assert a.reserved_bytes == 22 * MIB


def test_a_block_cached_for_one_stream_serves_that_stream_alone():
    # FSDP2 gathers parameters on a copy-in stream: a buffer it frees is cached for that stream
    # (BlockComparatorSize orders by stream first), so the default stream gets a new segment.
    a = CachingAllocator()
    a.free(a.malloc(12 * MIB, stream=1))
    a.malloc(12 * MIB)
    assert a.reserved_bytes == 24 * MIB
    a.malloc(12 * MIB, stream=1)  # the stream's own cached block
    assert (a.allocated_bytes, a.reserved_bytes) == (24 * MIB, 24 * MIB)


def test_empty_cache_returns_every_streams_whole_segments():
    a = CachingAllocator()
    a.free(a.malloc(12 * MIB, stream=3))
    a.free(a.malloc(512 * KIB, stream=1))
    a.free(a.malloc(14 * MIB))
    a.empty_cache()
    assert a.reserved_bytes == 0


def test_an_allocation_event_carries_its_stream_and_replays_on_it():
    event = on_stream(12 * MIB, 3)
    assert (event_bytes(event), event_stream(event)) == (12 * MIB, 3)
    assert on_stream(12 * MIB, 0) == 12 * MIB  # a one-stream log is plain bytes
    # The step frees a 12 MiB buffer made on stream 3, then asks for 12 MiB on the default
    # stream: one pool would reuse the block, two streams need a second segment.
    one = replay((0, []), (0, [12 * MIB, ~0, 12 * MIB]))
    two = replay((0, []), (0, [event, ~0, 12 * MIB]))
    assert (one.reserved_bytes, two.reserved_bytes) == (12 * MIB, 24 * MIB)
    assert one.allocated_bytes == two.allocated_bytes == 12 * MIB


def test_freed_blocks_are_cached_and_reused_best_fit():
    a = CachingAllocator()
    twelve, fourteen = a.malloc(12 * MIB), a.malloc(14 * MIB)
    a.free(twelve)
    a.free(fourteen)
    assert (a.allocated_bytes, a.reserved_bytes) == (0, 26 * MIB)  # nothing goes back
    a.malloc(11 * MIB)  # best fit: the 12 MiB block; 1 MiB left is not split off
    assert (a.allocated_bytes, a.reserved_bytes) == (12 * MIB, 26 * MIB)
    a.malloc(13 * MIB)  # the 14 MiB block, whole
    assert (a.allocated_bytes, a.reserved_bytes) == (26 * MIB, 26 * MIB)


def test_a_large_cached_block_is_split_for_a_smaller_request():
    a = CachingAllocator()
    a.free(a.malloc(12 * MIB))
    a.malloc(8 * MIB)  # 4 MiB remain (> 1 MiB): split, no new segment
    a.malloc(4 * MIB)  # served by the remainder
    assert (a.allocated_bytes, a.reserved_bytes) == (12 * MIB, 12 * MIB)


def test_freed_neighbours_merge_back_into_one_block():
    a = CachingAllocator()
    first, second = a.malloc(3 * MIB), a.malloc(3 * MIB)  # one 20 MiB segment
    a.free(first)
    a.free(second)  # merges with both neighbours: the whole 20 MiB is one cached block again
    a.malloc(18 * MIB)
    assert (a.allocated_bytes, a.reserved_bytes) == (18 * MIB, 20 * MIB)


def test_peaks_reset_to_what_is_held_now():
    a = CachingAllocator()
    a.free(a.malloc(12 * MIB))
    a.reset_peak()
    assert (a.peak_allocated_bytes, a.peak_reserved_bytes) == (0, 12 * MIB)


def test_over_budget_the_allocator_returns_cached_segments_before_failing():
    a = CachingAllocator(budget_bytes=30 * MIB)
    a.free(a.malloc(12 * MIB))
    a.free(a.malloc(14 * MIB))  # 26 MiB reserved, all cached
    a.malloc(16 * MIB)  # 26 + 16 > 30: the two cached segments go back, then 16 fits
    assert (a.reserved_bytes, a.peak_reserved_bytes) == (16 * MIB, 26 * MIB)


def test_a_segment_obtained_after_a_release_is_split_and_reused():
    a = CachingAllocator(budget_bytes=27 * MIB)
    a.free(a.malloc(12 * MIB))
    a.free(a.malloc(14 * MIB))
    a.malloc(512 * KIB)  # 26 + 2 > 27: the large cached segments go back, a small one comes
    a.malloc(512 * KIB)  # from the same 2 MiB segment's remainder
    assert (a.allocated_bytes, a.reserved_bytes) == (MIB, 2 * MIB)


def test_log_events_replay_a_fresh_process():
    # Setup: weights (4 MiB, a 2-element small tensor); a zero-byte tensor gets a number but no
    # block. Step: an activation, a temporary freed, a larger activation, the first one freed.
    setup = (0, [4 * MIB, 8, 0])
    step = (3, [12 * MIB, 3 * MIB, ~4, 14 * MIB, ~3, ~99])  # ~99: not in these logs, ignored
    p = replay(setup, step)
    # Setup: 4 MiB takes the front of a 20 MiB segment; 8 bytes a 2 MiB small segment.
    # Step: 12 MiB fits the cached 16 MiB remainder (4 MiB left); 3 MiB takes those 4 MiB whole
    # (1 MiB left is not split off); 14 MiB fits no cached block: a 14 MiB segment.
    # Peak allocated over the step: 4 MiB + 512 + 12 MiB + 14 MiB (the 3 MiB was freed first).
    assert (p.allocated_bytes, p.reserved_bytes) == (30 * MIB + 512, 36 * MIB)
    assert (p.first_reserved_bytes, p.retries_per_step, p.steps) == (36 * MIB, (0,), 1)


def test_replay_reports_the_failing_cudamalloc():
    p = replay((0, [12 * MIB]), (1, [20 * MIB]), budget_bytes=30 * MIB)
    assert p.out_of_memory
    assert p.requested_bytes == 20 * MIB
    assert p.reserved_bytes == 32 * MIB  # what the failing cudaMalloc would have needed


def test_a_probe_empties_the_cache_before_step_1_and_a_training_loop_does_not():
    # Setting up holds 12 MiB and frees it; the step then needs 1 MiB (a small block, from a
    # 2 MiB segment of its own). A probe empties the cache first (Backend.measure), so the
    # 12 MiB segment is gone; a training loop never flushes, so it stays reserved.
    setup, step = (0, [12 * MIB, ~0]), (1, [MIB])
    p = replay(setup, step, start=PROBE)
    assert (p.allocated_bytes, p.reserved_bytes) == (MIB, 2 * MIB)
    assert replay(setup, step).reserved_bytes == 12 * MIB + 2 * MIB  # TRAINING_LOOP, default
    # What setting up keeps (the weights) stays reserved either way.
    kept = replay((0, [12 * MIB, 3 * MIB, ~1]), (2, [MIB]), start=PROBE)
    assert kept.reserved_bytes == 12 * MIB + 2 * MIB


# Setting up: weights 20 MiB (seq 0); priming the optimizer (from event 1): gradients 20 MiB
# (seq 1), the state 12 MiB (seq 2), the gradients freed. The step: a 30 MiB activation (seq 3),
# its gradients 20 MiB (seq 4), the activation freed by backward, then (event 3) the optimizer
# step, then zero_grad frees the gradients.
PRIMED = (0, [20 * MIB, 20 * MIB, 12 * MIB, ~1])
LAZY_STEP = (3, [30 * MIB, 20 * MIB, ~3, ~4])
LAZY = {"state_from": 1, "optimizer_at": 3}


def test_a_training_loop_makes_the_optimizer_state_at_step_1s_optimizer_step():
    # A probe: weights, gradients and state each get a segment (52 MiB); the flush returns the
    # gradients' (32 MiB); the step takes a 30 MiB and a 20 MiB segment: 82 MiB from step 1.
    probe = replay(PRIMED, LAZY_STEP, steps=None, start=PROBE, **LAZY)
    assert probe.reserved_per_step == (82 * MIB, 82 * MIB)
    # A training loop: weights (20 MiB), the activation (30) and gradients (20) at step 1, then
    # the state is carved from the 30 MiB block the activation left (70 MiB). Step 2's
    # activation finds 22 MiB there and 20 in the gradients' segment: another 30 MiB segment.
    loop = replay(PRIMED, LAZY_STEP, steps=None, **LAZY)
    assert loop.reserved_per_step == (70 * MIB, 100 * MIB, 100 * MIB)
    assert loop.allocated_per_step == (70 * MIB, 82 * MIB, 82 * MIB)  # no state in forward 1
    assert loop.reserved_bytes > probe.reserved_bytes
    # Lightning empties the cache after setting up: nothing is cached then, the same loop.
    lightning = replay(PRIMED, LAZY_STEP, steps=None, start=LIGHTNING_LOOP, **LAZY)
    assert lightning.reserved_per_step == loop.reserved_per_step


def test_a_step_with_no_optimizer_step_keeps_the_state_made_before_it():
    # Without the two marks (an optimizer the step never steps) the setup runs whole, as a
    # probe's, with no flush: the primed gradients' segment stays cached and serves step 1.
    unmarked = replay(PRIMED, LAZY_STEP, steps=None)
    assert unmarked.reserved_per_step[0] == 82 * MIB
    assert replay(PRIMED, LAZY_STEP, steps=None, state_from=1).reserved_per_step[0] == 82 * MIB


def test_state_freed_by_the_step_before_its_optimizer_step_is_not_made_again():
    # Priming left 4 MiB more (seq 3) that the step frees at once: not state a loop carries.
    setup = (0, [20 * MIB, 20 * MIB, 12 * MIB, 4 * MIB, ~1])
    step = (4, [~3, 30 * MIB, 20 * MIB, ~4, ~5])
    loop = replay(setup, step, steps=1, state_from=1, optimizer_at=4)
    assert loop.allocated_bytes == 20 * MIB + 30 * MIB + 20 * MIB  # weights, act., grads
    assert loop.reserved_bytes == 70 * MIB  # the state (12 MiB) went into the freed 30


def test_loop_starts_are_found_by_the_names_reports_give_them():
    assert loop_start_named("training loop") is TRAINING_LOOP
    assert loop_start_named("probe") is PROBE
    with pytest.raises(ValueError, match="unknown loop start 'warm'"):
        loop_start_named("warm")


def test_a_cudamalloc_past_the_budget_releases_cached_segments_and_counts_a_retry():
    mib = 2**20
    # 12 MiB is cached after its free; 30 MiB more would pass a 40 MiB budget until the
    # allocator hands the cached segment back (release_cached_blocks) and retries.
    step = (0, [12 * mib, ~0, 30 * mib])
    retried = replay((0, []), step, 40 * mib)
    assert (retried.out_of_memory, retried.alloc_retries) == (False, 1)
    assert replay((0, []), step).alloc_retries == 0  # no budget, no retry
    assert replay((0, []), step, 20 * mib).out_of_memory


def test_resident_requests_are_served_before_the_step_and_stay_allocated():
    mib = 2**20
    workspace = 4096 * 1024 * 2 + 16 * 1024 * 8  # cuBLAS's default on Ampere, 8.125 MiB
    bare = replay((0, []), (0, [mib]))
    with_ws = replay((0, []), (0, [mib]), resident=(workspace,))
    assert with_ws.allocated_bytes - bare.allocated_bytes == workspace
    # An 8.125 MiB request gets a 20 MiB segment (kLargeBuffer), as on a GPU.
    assert with_ws.reserved_bytes - bare.reserved_bytes == 20 * mib


# One step: 40 MiB (seq 0) freed, then 22 MiB (seq 1) kept past the step, then 2 MiB (seq 2)
# freed. The kept 22 MiB is carved from the cached 40 MiB segment and pins it.
PINNING_STEP = (0, [40 * MIB, ~0, 22 * MIB, 2 * MIB, ~2])


def test_a_second_step_starts_from_the_segments_the_first_left_cached():
    first = replay((0, []), PINNING_STEP, 40 * MIB)
    assert (first.allocated_bytes, first.reserved_bytes, first.out_of_memory) == (
        40 * MIB,
        40 * MIB,
        False,
    )
    # Step 2 asks for 40 MiB again. The only segment holds the kept 22 MiB, so it is not a
    # whole cached segment that a release could return, and a second one is past the budget.
    second = replay((0, []), PINNING_STEP, 40 * MIB, steps=2)
    assert second.out_of_memory
    assert second.requested_bytes == 40 * MIB
    assert second.reserved_bytes == 80 * MIB
    assert (second.first_reserved_bytes, second.steps) == (40 * MIB, 2)
    # The loop replay finds it too: it runs until an OOM or until nothing changes.
    assert replay((0, []), PINNING_STEP, 40 * MIB, steps=None) == second


def test_a_repeated_step_does_not_remake_what_the_first_kept():
    unlimited = replay((0, []), PINNING_STEP, steps=3)
    # The kept 22 MiB is allocated once; each later step holds it beside its own 40 MiB.
    assert unlimited.allocated_bytes == 62 * MIB
    assert unlimited.reserved_bytes == 80 * MIB
    two, three = replay((0, []), PINNING_STEP, steps=2), replay((0, []), PINNING_STEP, steps=3)
    assert (two.allocated_bytes, two.reserved_bytes) == (three.allocated_bytes, 80 * MIB)
    # Steady from step 2: the loop replay stops once a step leaves the segments as it found
    # them (step 3 then repeats step 2).
    steady = replay((0, []), PINNING_STEP, steps=None)
    assert (steady.steps, steady.reserved_bytes, steady.first_reserved_bytes) == (
        3,
        80 * MIB,
        40 * MIB,
    )


def test_a_step_that_frees_everything_replays_the_same_every_time():
    step = (3, [30 * MIB, 12 * MIB, ~3, 4 * MIB, ~4, ~5])
    setup = (0, [8 * MIB, 8 * MIB, 100, ~1])
    one, loop = replay(setup, step, 64 * MIB), replay(setup, step, 64 * MIB, steps=None)
    assert (loop.allocated_bytes, loop.reserved_bytes) == (one.allocated_bytes, one.reserved_bytes)
    assert (loop.steps, loop.retries_per_step) == (2, (0, 0))  # step 2 changed nothing


def test_an_evaluation_pass_between_steps_counts_with_the_loop():
    # The eval pass was logged later (numbered from 50): it keeps 6 MiB of predictions alive
    # while a 10 MiB forward runs, then frees both.
    step = (3, [30 * MIB, ~3])
    eval_pass = (50, [6 * MIB, 10 * MIB, ~51, ~50])
    alone = replay((0, [8 * MIB]), step, steps=None)
    with_eval = replay((0, [8 * MIB]), step, steps=None, between=eval_pass)
    assert alone.allocated_bytes == 38 * MIB
    assert with_eval.allocated_bytes == 38 * MIB  # eval's 16 MiB fit in the step's freed 30
    tight = replay((0, [8 * MIB]), step, 38 * MIB, steps=None, between=(50, [20 * MIB, 12 * MIB]))
    assert tight.out_of_memory  # 20 + 12 kept past the budget beside the weights


def test_an_empty_cache_event_returns_whole_cached_segments_as_torch_cuda_empty_cache():
    # Weights 4 MiB (a 20 MiB segment), a 40 MiB step, then a 44 MiB eval pass, under 70 MiB.
    # Step 1's eval needs a 44 MiB segment: 104 MiB, so the cached 40 goes back (a retry).
    # Without a flush the 44 MiB segment stays cached and serves both from then on; with
    # Trainer's empty_cache after the eval it goes back too, and every step pays again.
    step, budget = (1, [40 * MIB, ~1]), 70 * MIB
    kept = replay((0, [4 * MIB]), step, budget, steps=2, between=(10, [44 * MIB, ~10]))
    flushed = replay((0, [4 * MIB]), step, budget, steps=2, between=(10, [44 * MIB, ~10, None]))
    assert kept.retries_per_step == (1, 0)
    assert flushed.retries_per_step == (1, 1)


_SIZES = (300, 4096, 600_000, 3 * MIB // 2, 3 * MIB, 12 * MIB, 25 * MIB)
"""Requests that land in every pool and segment kind: small, 20 MiB-packed, large."""


@settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.data())
def test_frees_with_no_allocation_between_them_leave_the_same_cache_in_any_order(data):
    # A step's log as runs: allocations (some on a second stream), then frees of some of what
    # is live, in an order the test draws. Any order of each run of frees replays alike, and
    # canonical_frees writes every order the same: what lets two traces of a step align when
    # autocast's cache freed its casts in another order.
    live: list[int] = []
    drawn: list[int | None] = []
    shuffled: list[int | None] = []
    seq = 1
    for _ in range(data.draw(st.integers(2, 8))):
        for _ in range(data.draw(st.integers(1, 6))):
            size = data.draw(st.sampled_from(_SIZES))
            event = on_stream(size, data.draw(st.sampled_from((0, 0, 1))))
            drawn.append(event)
            shuffled.append(event)
            live.append(seq)
            seq += 1
        freed = data.draw(st.lists(st.sampled_from(live), unique=True)) if live else []
        live = [s for s in live if s not in freed]
        drawn.extend(~s for s in freed)
        shuffled.extend(~s for s in data.draw(st.permutations(freed)))
        if data.draw(st.booleans()):
            drawn.append(None)
            shuffled.append(None)
    setup = (0, [8 * MIB])
    assert replay(setup, (1, drawn), steps=None) == replay(setup, (1, shuffled), steps=None)
    assert canonical_frees(drawn) == canonical_frees(shuffled)
    assert sorted(canonical_frees(drawn), key=str) == sorted(drawn, key=str)


def test_a_run_of_frees_is_ordered_within_its_bounds_alone():
    events = [MIB, 2 * MIB, 3 * MIB, ~1, ~3, ~2, None, ~9, ~8, MIB, ~4]
    assert canonical_frees(events) == [MIB, 2 * MIB, 3 * MIB, ~1, ~2, ~3, None, ~8, ~9, MIB, ~4]
    # A cut (where the optimizer's state is made) is a bound no free is moved across.
    assert canonical_frees([~1, ~0, ~3, ~2], cut=2) == [~0, ~1, ~2, ~3]
    assert canonical_frees([~3, ~0, ~2, ~1], cut=2) == [~0, ~3, ~1, ~2]


@settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.data())
def test_a_steady_loop_that_retries_stops_early_with_every_step_s_figures(data):
    # A loop whose segments repeat from one step to the next repeats its retries too: the
    # steps after the one that settled are copied, not replayed. The figures are those of
    # replaying all MAX_LOOP_STEPS steps, retries or not, on budgets tight enough to retry
    # (one draw in twelve copies steps, by a count over 3,000 random logs).
    events: list[int | None] = []
    live: list[int] = []
    seq = 1
    for _ in range(data.draw(st.integers(2, 10))):
        size = data.draw(st.sampled_from(_SIZES))
        events.append(on_stream(size, data.draw(st.sampled_from((0, 0, 1)))))
        live.append(seq)
        seq += 1
        freed = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=2))
        live = [s for s in live if s not in freed]
        events.extend(~s for s in freed)
    kept = data.draw(st.lists(st.sampled_from(live), unique=True)) if live else []
    events.extend(~s for s in live if s not in kept)  # what the step does not keep it frees
    setup = (0, [8 * MIB])
    budget = data.draw(st.sampled_from((None, 40 * MIB, 64 * MIB, 100 * MIB, 200 * MIB)))
    every = replay(setup, (1, events), budget, steps=MAX_LOOP_STEPS)
    loop = replay(setup, (1, events), budget, steps=None)
    if every.out_of_memory or loop.steps == MAX_LOOP_STEPS:
        assert loop == every
    else:  # settled without retrying: it stops there, as it always did
        assert not loop.retries_per_step[-1]
        assert (loop.allocated_bytes, loop.reserved_bytes) == (
            every.allocated_bytes,
            every.reserved_bytes,
        )
