"""The tracker counts each live storage once, frees it when it dies, and enforces a budget."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from memorymark.measurement import CATEGORIES, Category
from memorymark.tracker import MemoryTracker


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


def test_categories_keep_their_names_for_the_ui_and_json():
    assert CATEGORIES == ("parameters", "gradients", "optimizer_state", "activations", "temporary")
    assert tuple(Category) == CATEGORIES  # members are their names
    tracker = MemoryTracker()
    with tracker:
        kept = torch.zeros(8)
    assert list(tracker.peak_breakdown().to_dict()) == list(CATEGORIES)
    assert type(next(iter(tracker.peak_breakdown().to_dict()))) is str
    del kept
