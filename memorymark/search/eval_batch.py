"""The largest evaluation batch that fits beside the training state: the sweep over eval_batch.

HF Trainer evaluates at `per_device_eval_batch_size` with the weights and optimizer state still
resident, and keeps every batch's predictions on the GPU until `eval_accumulation_steps` moves
them to the CPU: a batch that trains can still run out of memory at evaluation. `EvalMeasurer`
hands the sweep generator and the strategies (memorymark/search/sweep.py, strategies.py) eval
batch sizes as their axis: each probe runs the same resident model and optimizer state at one
training batch with the probed eval batch, and the measurement comes back relabelled (the eval
batch where the strategy reads a batch, the evaluation pass's peak where it reads the peak, no
timeline, so the fast strategy's two traces extrapolate the line through the eval peaks), as
memorymark/search/seq_len.py does for sequence lengths. `EvalAnswer` is what the report says
about the evaluation pass. This module knows nothing about how a step is measured or shown.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memorymark.measurement import Measurement
from memorymark.search.sweep import best_fit
from memorymark.search.variant import VariantMeasurer
from memorymark.units import gib


def relabelled(m: Measurement, eval_batch: int) -> Measurement:
    """`m` (the loop with an evaluation pass) as the sweep over eval batches reads it."""
    peak = m.eval_peak_bytes if m.eval_peak_bytes is not None else m.peak_bytes
    return replace(m, batch_size=eval_batch, peak_bytes=peak, timeline=())


class EvalMeasurer(VariantMeasurer):
    """A backend seen by the sweep as measuring eval batch sizes at one training batch."""

    field = "eval_batch"

    def kept(self, measurement: Measurement) -> Measurement:
        # The step's timeline is the training step's: nothing reads it for another eval batch.
        return replace(measurement, timeline=())

    def relabelled(self, measurement: Measurement, value: int) -> Measurement:
        return relabelled(measurement, value)


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalAnswer:
    """The evaluation pass the settings ask for, at the recommended training batch: whether the
    loop with it fits, and the largest eval batch that would."""

    batch: int
    """The eval batch asked for (`per_device_eval_batch_size`)."""
    accumulation: int | None
    """`eval_accumulation` as set (None: unset, one batch measured)."""
    at_batch: int
    """The training batch the loop was judged at: the recommended one, else 1."""
    measurement: Measurement
    """The loop at `at_batch` with the eval batch asked for."""
    probes: tuple[tuple[int, Measurement], ...] = ()
    """(eval batch, the loop's measurement at `at_batch`) of the search, in the order tried."""
    stopped_by: str | None = None
    """The limit that ended the search early (the answer is the best known), or None."""

    @property
    def kept_batches(self) -> int:
        """Eval batches whose predictions were on the GPU together at the measured peak."""
        return self.accumulation or 1

    @property
    def peak_bytes(self) -> int | None:
        """The evaluation pass's allocated peak, training state included (None: the training
        step failed first)."""
        return self.measurement.eval_peak_bytes

    @property
    def fits(self) -> bool:
        """True when the loop at `at_batch`, evaluating between steps, fits with the margin."""
        return self.measurement.fits

    @property
    def max_eval_batch(self) -> int | None:
        """The largest eval batch measured to fit beside the training state at `at_batch`,
        below every one that did not (None: not even the smallest tried)."""
        tried = [(self.batch, self.measurement), *self.probes]
        best = best_fit([relabelled(m, n) for n, m in tried])
        return best.batch_size if best is not None else None

    @property
    def note(self) -> str | None:
        """What the figures assume about predictions left on the GPU, when it matters."""
        if self.accumulation is not None:
            return None
        return (
            "eval_accumulation unset: measured with one batch's predictions on the GPU, as "
            "eval_accumulation_steps=1 keeps them; with eval_accumulation_steps unset, Trainer "
            "keeps every eval batch's predictions on the GPU until the eval set ends"
        )

    def verdict(self) -> str:
        """One sentence: does evaluating fit, and the largest eval batch that does."""
        kept = self.kept_batches
        held = f"{kept} batch{'es' if kept > 1 else ''} of predictions kept"
        where = f"beside training batch {self.at_batch}"
        best = self.max_eval_batch
        largest = (
            "; no eval batch tried fits"
            if best is None
            else f"; the largest eval batch that fits is {best}"
        )
        peak = "" if self.peak_bytes is None else f", peak {gib(self.peak_bytes):.2f} GiB"
        answer = "fits" if self.fits else "does not fit"
        return f"Evaluation at eval batch {self.batch} ({held}{peak}) {answer} {where}{largest}."

    def to_dict(self) -> dict[str, Any]:
        """The `analyze --json` `eval` block (GiB are 2**30 bytes)."""
        peak = self.peak_bytes
        return {
            "batch": self.batch,
            "accumulation": self.kept_batches,
            "peak_gb": None if peak is None else gib(peak),
            "fits": self.fits,
            "max_eval_batch": self.max_eval_batch,
            "at_batch": self.at_batch,
            "note": self.note,
            "stopped_by": self.stopped_by,
            "probes": [
                {
                    "eval_batch": n,
                    "eval_peak_gb": None if m.eval_peak_bytes is None else gib(m.eval_peak_bytes),
                    "required_bytes": m.required_bytes,
                    "success": m.fits,
                    "runs": m.runs,
                }
                for n, m in self.probes
            ],
        }
