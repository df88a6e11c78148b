"""The one fit policy every backend uses (issue 8): runs, fits, and the margin between them."""

import pytest

from memorymark.fit import FitPolicy

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)

GIB = 2**30
POLICY = FitPolicy(capacity_bytes=20 * GIB, margin_bytes=GIB)


@pytest.mark.parametrize(
    ("oom", "retries", "reserved", "runs", "fits"),
    [
        (False, 0, 18 * GIB, True, True),
        (False, 0, 19 * GIB, True, True),  # exactly at the limit
        (False, 0, 19 * GIB + 1, True, False),  # inside the margin: runs, not recommended
        (False, 0, 20 * GIB + 1, False, False),  # past the capacity
        (True, None, None, False, False),  # a measured OOM: its need is unknown
        (False, 1, 10 * GIB, True, False),  # ran only after a cache flush and a retry
        (False, None, None, True, True),  # a device that reports neither (MPS)
    ],
)
def test_verdicts(oom, retries, reserved, runs, fits):
    verdict = POLICY.judge(oom=oom, alloc_retries=retries, reserved_bytes=reserved)
    assert (verdict.runs, verdict.fits) == (runs, fits)


def test_limit_is_capacity_less_margin():
    assert POLICY.limit_bytes == 19 * GIB


@pytest.mark.parametrize(("capacity", "margin"), [(0, 0), (GIB, GIB), (GIB, -1)])
def test_impossible_policies_are_one_line_errors(capacity, margin):
    with pytest.raises(ValueError, match="capacity must be positive|margin"):
        FitPolicy(capacity_bytes=capacity, margin_bytes=margin)
