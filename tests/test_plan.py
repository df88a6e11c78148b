"""Gradient accumulation plans reach the target with the fewest steps and fitting micro-batches."""

import pytest

from memorymark.plan import plan_batches


@pytest.mark.parametrize(
    ("optimal", "target", "micro", "steps", "effective"),
    [
        (176, None, 176, 1, 176),
        (176, 64, 64, 1, 64),  # the target fits in one micro-batch
        (176, 256, 128, 2, 256),  # two steps; 128 evens them out
        (176, 1000, 167, 6, 1002),  # 1000/176 -> 6 steps of 167 (2 samples over)
        (1, 32, 1, 32, 32),
    ],
)
def test_plans(optimal, target, micro, steps, effective):
    plan = plan_batches(optimal, target)
    assert (plan.micro_batch, plan.accumulation_steps, plan.effective_batch) == (
        micro,
        steps,
        effective,
    )
    assert plan.micro_batch <= optimal
    assert target is None or plan.effective_batch >= target


def test_nothing_fits():
    with pytest.raises(ValueError, match="no batch size fits"):
        plan_batches(0, 64)
