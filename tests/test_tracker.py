"""The tracker counts each live storage once, frees it when it dies, and enforces a budget."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from memorymark.accounting import tracker as tracker_module
from memorymark.accounting.tracker import MemoryTracker
from memorymark.measurement import CATEGORIES, Category

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)


def test_counts_new_storage_once_and_not_views():
    tracker = MemoryTracker()
    with tracker:
        x = torch.zeros(1000)  # 4000 bytes
        view = x[:10]
        y = x.view(10, 100)
    assert tracker.live_bytes == 4000
    assert tracker.peak_bytes == 4000
    del x, view, y


def test_frees_when_the_last_reference_dies():
    tracker = MemoryTracker()
    with tracker:
        a = torch.zeros(256)
        b = a * 2
    assert tracker.live_bytes == 2048
    del a
    assert tracker.live_bytes == 1024
    del b
    assert tracker.live_bytes == 0
    assert tracker.peak_bytes == 2048


def test_fake_tensors_count_the_same_bytes_as_real_ones():
    mode = FakeTensorMode()
    tracker = MemoryTracker()
    with mode, tracker:
        big = torch.empty(1024, 1024)  # 4 MiB, never allocated
        total = big.sum(dim=0)
    assert tracker.live_bytes == 4 * 2**20 + 4 * 1024
    del big, total


def test_budget_raises_the_cuda_oom_type():
    tracker = MemoryTracker(budget_bytes=10_000)
    with tracker:
        keep = torch.zeros(2000)  # 8000 bytes fit
        with pytest.raises(torch.OutOfMemoryError, match="simulated out of memory"):
            torch.zeros(1000)  # 4000 more would not
    assert tracker.live_bytes == 8000
    del keep


def test_categories_follow_the_phase_and_relabels_move_bytes():
    tracker = MemoryTracker()
    with tracker:
        act = torch.zeros(100)
        tracker.phase_category = Category.TEMPORARY
        tmp = torch.zeros(50)
    tracker.track(tmp, Category.GRADIENTS)
    breakdown = tracker.peak_breakdown()
    assert (breakdown.activations, breakdown.temporary) == (400, 200)  # at the peak
    assert tracker.live_by_category[Category.GRADIENTS] == 200
    assert tracker.live_by_category[Category.TEMPORARY] == 0
    del act, tmp
    assert tracker.live_by_category[Category.GRADIENTS] == 0


def test_timeline_records_live_bytes_after_each_op():
    tracker = MemoryTracker()
    with tracker:
        a = torch.zeros(10)
        b = a + 1
        del a
        c = b + 1
    assert tracker.timeline == [40, 80, 80]
    del b, c


def test_event_log_numbers_allocations_and_logs_frees_by_number():
    tracker = MemoryTracker()
    with tracker:
        a = torch.zeros(10)  # allocation 0: 40 bytes
        b = a + 1  # allocation 1
    tracker.mark_baseline()  # setup done: what a fresh process holds before its step
    del a  # freed after the setup: logged in the step's events
    tracker.reset_peak()
    with tracker:
        c = b * 2  # allocation 2
        del b
    assert tracker.baseline_events == (0, [40, 40])
    # The setup's `a` was freed before this step began: the step's log starts with that free.
    assert (tracker.events_first_seq, tracker.events) == (2, [~0, 40, ~1])
    del c
    assert tracker.events[-1] == ~2


def test_work_counter_sees_every_operator_but_device_queries():
    seen = []

    class Counter:
        def count(self, func, args, kwargs, out):
            seen.append(func.__name__)

    tracker = MemoryTracker()
    tracker.work_counter = Counter()
    with FakeTensorMode(), tracker:
        x = torch.zeros(4)
        _ = (x + 1).device
    assert seen == ["zeros.default", "add.Tensor"]


def _fake_training_step() -> tuple:
    """A tracked forward, backward and AdamW step on fake tensors: every figure it leaves."""
    seen = []

    class Counter:
        def count(self, func, args, kwargs, out):
            seen.append(func.__name__)

    mode, tracker = FakeTensorMode(), MemoryTracker()
    tracker.work_counter = Counter()
    with mode:
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    with mode, tracker:
        model(torch.zeros(3, 8)).logsumexp(-1).mean().backward()
        torch.optim.AdamW(model.parameters()).step()
    figures = tracker.timeline, tracker.events, tracker.peak_bytes, tracker.peak_breakdown()
    return figures, seen


def test_above_a_fake_mode_it_counts_what_dispatching_each_operator_again_counts(monkeypatch):
    # The fast path answers device queries itself and hands operators to the fake mode's
    # dispatch directly; without either, each operator is dispatched again, as it used to be.
    fast = _fake_training_step()
    monkeypatch.setattr(tracker_module, "FakeTensor", type("NotAFakeTensor", (), {}))
    monkeypatch.setattr(
        tracker_module, "_fake_dispatch", lambda _, func, __, args, kw: func(*args, **kw)
    )
    assert _fake_training_step() == fast
    assert len(fast[0][0]) == len(fast[1]) > 20  # one timeline entry per operator counted


def test_categories_keep_their_names_for_the_ui_and_json():
    assert CATEGORIES == (
        "parameters",
        "gradients",
        "optimizer_state",
        "activations",
        "logits",
        "temporary",
    )
    assert tuple(Category) == CATEGORIES  # members are their names
    tracker = MemoryTracker()
    with tracker:
        kept = torch.zeros(8)
    assert list(tracker.peak_breakdown().to_dict()) == list(CATEGORIES)
    assert type(next(iter(tracker.peak_breakdown().to_dict()))) is str
    del kept


def _replace_state(state):
    """A stretch like an optimizer step: a temporary, and state replaced (the old one freed)."""
    tmp = torch.ones(50)
    state["kept"] = tmp * 2
    del tmp


def _steps(tracker, stretch, n=4):
    """`n` steps of a batch-sized tensor and then `stretch` (state made before, as priming)."""
    with tracker:
        state = {"kept": torch.zeros(50)}
        for batch in range(1, n + 1):
            activations = torch.zeros(10 * batch)
            stretch(state)
            del activations
    return state


def test_a_spliced_segment_counts_what_running_it_again_counts():
    ran = MemoryTracker()
    kept = _steps(ran, _replace_state)  # the state lives on, as the optimizer's does

    spliced = MemoryTracker()
    records = []

    def record_or_splice(state):
        if records and records[-1] is not None:
            spliced.splice(records[-1])
            return
        spliced.start_segment()
        _replace_state(state)
        records.append(spliced.finish_segment())

    kept_too = _steps(spliced, record_or_splice)
    # The first stretch frees what was made before it, so the second one's record repeats.
    assert records[0] is None and records[1] is not None and len(records) == 2
    assert spliced.timeline == ran.timeline
    assert spliced.events == ran.events
    assert (spliced.peak_bytes, spliced.peak_breakdown()) == (ran.peak_bytes, ran.peak_breakdown())
    assert spliced.live_bytes == ran.live_bytes
    del kept, kept_too


def test_a_segment_that_relabels_or_frees_older_storage_is_not_reusable():
    tracker = MemoryTracker()
    with tracker:
        older = torch.zeros(10)
        tracker.start_segment()
        del older
        assert tracker.finish_segment() is None
        kept = torch.zeros(10)
        tracker.start_segment()
        tracker.track(kept, Category.GRADIENTS)
        assert tracker.finish_segment() is None
        tracker.start_segment()
        _ = torch.zeros(10) + 1
        assert tracker.finish_segment(completed=False) is None
        tracker.start_segment()
        tmp = torch.zeros(10) + 1
        del tmp
        segment = tracker.finish_segment()
    assert segment is not None and segment.allocations == 2 and not segment.survivors


def test_a_tracker_with_a_budget_runs_every_step():
    tracker = MemoryTracker(budget_bytes=10_000)
    tracker.start_segment()
    segment = tracker.finish_segment()
    with pytest.raises(ValueError, match="must run every step for real"):
        tracker.splice(segment)


def test_a_storage_resized_in_place_is_freed_and_counted_again():
    # FSDP2 frees a gathered parameter with resize_(0) and gathers into the same storage.
    tracker = MemoryTracker()
    with tracker:
        x = torch.zeros(1000)
    x.untyped_storage().resize_(0)
    tracker.resized(x, Category.PARAMETERS)
    assert tracker.live_bytes == 0
    x.untyped_storage().resize_(4000)
    tracker.resized(x, Category.PARAMETERS)
    assert tracker.live_by_category[Category.PARAMETERS] == tracker.live_bytes == 4000
    assert tracker.events[-2:] == [~0, 4000]  # freed as allocation 0, allocated again as 1
    del x
    assert tracker.live_bytes == 0 and tracker.events[-1] == ~1


def test_a_sharded_dtensor_counts_its_local_shard_not_its_global_size():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (4,))
        tracker = MemoryTracker()
        with FakeTensorMode(), tracker:
            d = distribute_tensor(torch.empty(100, 8), mesh, [Shard(0)])
        tracker.track(d, Category.PARAMETERS)
        assert tracker.live_by_category[Category.PARAMETERS] == 25 * 8 * 4
        del d
    finally:
        dist.destroy_process_group()


def test_a_pass_apart_keeps_its_own_log_and_peak_and_gives_the_step_its_own_back():
    tracker = MemoryTracker()
    with tracker:
        tracker.reset_peak()
        kept = torch.zeros(256)  # the step's 1024 bytes, still live during the pass

    class Counter:
        def __init__(self) -> None:
            self.ops = 0

        def count(self, *args: object) -> None:
            self.ops += 1

    counter = Counter()
    tracker.work_counter = counter
    with tracker.pass_apart() as apart, tracker:
        assert tracker.work_counter is None  # the pass's operators are not the step's work
        out = torch.zeros(1024) + 1  # two 4096-byte storages, both live at once
        del out
    # The pass's log is numbered after the step's allocation (seq 0): 1 and 2, then freed.
    assert apart.log == (1, [4096, 4096, ~1, ~2])
    assert apart.peak_bytes == 1024 + 2 * 4096
    assert (tracker.events_first_seq, tracker.events) == (0, [1024])
    assert (tracker.peak_bytes, tracker.timeline) == (1024, [1024])
    assert tracker.work_counter is counter and counter.ops == 0
    del kept
