"""From the batch that fits to the global batch a user wants: micro-batch x accumulation steps.

With gradient accumulation, every gradient stays alive through the next micro-batch's forward and
backward, so a micro-batch that fits alone may not fit while accumulating. A plan therefore takes
the largest micro-batch that divides the target exactly *and* fits with accumulation, checked by
the caller's `fits_accumulating` (a measured or simulated step with accumulation). The largest
divisor is checked first; when it does not fit, memory growing with the micro-batch, the rest are
bisected, not all tried. Pure arithmetic apart from that
callback: no torch.
Must not know how the step is measured, nor how the plan is shown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingPlan:
    """How to reach a global batch: per data-parallel rank, micro-batches accumulated."""

    micro_batch: int
    """Samples per forward/backward (per_device_train_batch_size)."""
    accumulation_steps: int
    """Micro-batches whose gradients add up before each optimizer step."""
    target_batch: int | None
    """The global batch asked for; None when none was (the plan is then the optimal batch)."""
    data_parallel_ranks: int = 1
    """Data-parallel ranks, each stepping its own micro-batches (tensor, context and pipeline
    ranks of one replica share its batch)."""

    @property
    def effective_batch(self) -> int:
        """Samples per optimizer step: micro_batch x accumulation_steps x replicas."""
        return self.micro_batch * self.accumulation_steps * self.data_parallel_ranks

    def factors(self) -> str:
        """The factors in words: "micro-batch 4 x 8 accumulation steps x 32 data-parallel
        ranks" (the ranks only where there are several)."""
        replicas = self.data_parallel_ranks
        ranks = f" x {replicas} data-parallel ranks" if replicas > 1 else ""
        return (
            f"micro-batch {self.micro_batch} x {self.accumulation_steps} accumulation steps{ranks}"
        )

    def says(self) -> str:
        """The product in words: `factors()` "= 1024 samples"."""
        return f"{self.factors()} = {self.effective_batch} samples"

    def to_dict(self) -> dict[str, int | None]:
        """The plan as the JSON report's `plan` object."""
        return {
            "micro_batch": self.micro_batch,
            "accumulation_steps": self.accumulation_steps,
            "data_parallel_ranks": self.data_parallel_ranks,
            "effective_batch": self.effective_batch,
            "target_batch": self.target_batch,
        }


def divisors_up_to(n: int, largest: int) -> list[int]:
    """The divisors of `n` that are at most `largest`, smallest first."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({d for d in small + [n // d for d in small] if d <= largest})


def plan_for_target(
    target_batch: int,
    largest_fit: int,
    fits_accumulating: Callable[[int], bool],
    *,
    accumulation_measured: bool = False,
    replicas: int = 1,
    multiple: int = 1,
) -> TrainingPlan | None:
    """The exact plan for `target_batch` with the largest micro-batch, or None when no divisor of
    the target's share of each of `replicas` data-parallel ranks fits with accumulation (or the
    target is not a multiple of `replicas`: every rank steps the same micro-batches). Only
    micro-batches that are multiples of `multiple` are planned: a pipeline splits each into
    that many microbatches.

    `largest_fit` is the largest micro-batch measured to fit (with the settings' own
    accumulation). When `accumulation_measured`, those measurements already accumulated, so any
    divisor up to it fits; otherwise a divisor below the target is checked with
    `fits_accumulating(micro_batch)`.
    """
    if target_batch % replicas:
        return None
    share = target_batch // replicas
    if share <= largest_fit and share % multiple == 0:
        return TrainingPlan(
            micro_batch=share,
            accumulation_steps=1,
            target_batch=target_batch,
            data_parallel_ranks=replicas,
        )
    candidates = [d for d in divisors_up_to(share, largest_fit) if d % multiple == 0]
    # The largest divisor first: accumulating adds only the gradients kept through the next
    # micro-batch, so it usually fits too and one step settles the plan (each check builds and
    # steps the model afresh: 8 s for Llama-3.1-70B on 24 fake ranks). Bisect the rest if not.
    if not accumulation_measured and candidates and not fits_accumulating(candidates[-1]):
        candidates.pop()
        lo, hi = -1, len(candidates)  # candidates[lo] fits (-1: none known), candidates[hi] not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits_accumulating(candidates[mid]) else (lo, mid)
        candidates = candidates[: lo + 1]
    if not candidates:
        return None
    micro = candidates[-1]
    return TrainingPlan(
        micro_batch=micro, accumulation_steps=share // micro, target_batch=target_batch,
        data_parallel_ranks=replicas,
    )  # fmt: skip
