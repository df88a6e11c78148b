"""From the largest batch that fits to the batch a user wants: micro-batch x accumulation steps.

Pure arithmetic on the report's answer. Memory grows with batch size, so any micro-batch at or
below the largest measured fit also fits; the plan picks the fewest accumulation steps and then
the smallest micro-batch that still reaches the target, so no step is wasted on padding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingPlan:
    """How to reach a global batch on one GPU."""

    micro_batch: int
    """Samples per forward/backward (per_device_train_batch_size)."""
    accumulation_steps: int
    """Micro-batches whose gradients add up before each optimizer step."""
    target_batch: int | None
    """The global batch asked for; None when none was (the plan is then the optimal batch)."""

    @property
    def effective_batch(self) -> int:
        """Samples per optimizer step: micro_batch x accumulation_steps."""
        return self.micro_batch * self.accumulation_steps

    def to_dict(self) -> dict[str, int | None]:
        """The plan as the JSON report's `plan` object."""
        return {
            "micro_batch": self.micro_batch,
            "accumulation_steps": self.accumulation_steps,
            "effective_batch": self.effective_batch,
            "target_batch": self.target_batch,
        }


def plan_batches(optimal_batch: int, target_batch: int | None) -> TrainingPlan:
    """The fewest accumulation steps that reach `target_batch` with micro-batches that fit."""
    if optimal_batch < 1:
        raise ValueError("no batch size fits, so there is nothing to accumulate")
    if target_batch is None:
        return TrainingPlan(micro_batch=optimal_batch, accumulation_steps=1, target_batch=None)
    steps = math.ceil(target_batch / optimal_batch)
    # ceil keeps micro x steps >= target; with the fewest steps, this micro-batch <= optimal.
    micro = math.ceil(target_batch / steps)
    return TrainingPlan(micro_batch=micro, accumulation_steps=steps, target_batch=target_batch)
