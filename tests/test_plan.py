"""Accumulation plans hit the target exactly, with the largest micro-batch that fits while
accumulating: the largest checked first (it usually fits), the rest bisected when it does not."""

import pytest

from memorymark.search.plan import divisors_up_to, plan_for_target

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)


def test_divisors_up_to():
    assert divisors_up_to(1024, 248) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert divisors_up_to(36, 36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert divisors_up_to(97, 50) == [1]


def _fits_below(limit, checked):
    def fits(micro):
        checked.append(micro)
        return micro <= limit

    return fits


def test_the_largest_divisor_that_fits_with_accumulation_wins():
    # BERT on an A10: 248 fits alone, 256 does not; with accumulation 128 x 8 = 1024 fits.
    checked = []
    plan = plan_for_target(1024, 248, _fits_below(200, checked))
    assert (plan.micro_batch, plan.accumulation_steps, plan.effective_batch) == (128, 8, 1024)
    assert len(checked) <= 4  # bisected over the 8 divisors up to 248
    assert checked[-1] in (64, 128)


def test_the_largest_divisor_is_checked_first_and_settles_the_plan_when_it_fits():
    # Llama-3.1-70B on 24 H100s: batch 3 fits alone, the current 16 does not; 2 x 8 fits.
    checked = []
    plan = plan_for_target(16, 3, _fits_below(2, checked))
    assert (plan.micro_batch, plan.accumulation_steps) == (2, 8)
    assert checked == [2]


def test_when_the_largest_divisor_does_not_fit_the_rest_are_bisected():
    checked = []
    plan = plan_for_target(1024, 248, _fits_below(20, checked))
    assert (plan.micro_batch, plan.accumulation_steps) == (16, 64)
    assert checked[0] == 128 and 128 not in checked[1:]
    assert len(checked) <= 4


def test_accumulation_can_push_the_micro_batch_below_the_single_step_answer():
    plan = plan_for_target(1000, 176, _fits_below(100, []))
    assert (plan.micro_batch, plan.accumulation_steps) == (100, 10)


def test_a_target_that_fits_in_one_step_needs_no_check():
    checked = []
    plan = plan_for_target(64, 176, _fits_below(0, checked))
    assert (plan.micro_batch, plan.accumulation_steps) == (64, 1)
    assert checked == []


def test_accumulating_measurements_need_no_further_check():
    checked = []
    plan = plan_for_target(1024, 248, _fits_below(0, checked), accumulation_measured=True)
    assert (plan.micro_batch, plan.accumulation_steps) == (128, 8)
    assert checked == []


@pytest.mark.parametrize("target", [97, 1024])
def test_no_plan_when_no_divisor_fits_with_accumulation(target):
    assert plan_for_target(target, 50, _fits_below(0, [])) is None


def test_a_prime_target_still_has_its_exact_plan_of_ones():
    plan = plan_for_target(97, 50, _fits_below(10, []))
    assert (plan.micro_batch, plan.accumulation_steps, plan.effective_batch) == (1, 97, 97)


def test_a_global_target_is_shared_by_the_data_parallel_ranks():
    # Llama-3.1-70B, FSDP 32 x TP 4 x PP 2 on 256 H100s: batch 4 fits a rank; 1024 samples
    # are 32 ranks' 32 each, so 4 x 8 accumulation steps, not 4 x 256.
    checked = []
    plan = plan_for_target(1024, 4, _fits_below(4, checked), replicas=32)
    assert (plan.micro_batch, plan.accumulation_steps, plan.data_parallel_ranks) == (4, 8, 32)
    assert plan.effective_batch == 1024 and checked == [4]
    assert plan.says() == (
        "micro-batch 4 x 8 accumulation steps x 32 data-parallel ranks = 1024 samples"
    )
    assert plan.to_dict()["data_parallel_ranks"] == 32


def test_a_target_the_ranks_cannot_share_evenly_has_no_plan():
    assert plan_for_target(1000, 8, _fits_below(8, []), replicas=48) is None


def test_a_pipeline_plans_only_multiples_of_its_microbatches():
    # 12 a rank, 5 fits: 4 x 3, not 3 x 4 or 6 (the pipeline splits each into 2 microbatches).
    plan = plan_for_target(12, 5, _fits_below(5, []), multiple=2)
    assert (plan.micro_batch, plan.accumulation_steps) == (4, 3)
    assert plan_for_target(9, 8, _fits_below(8, []), multiple=2) is None
