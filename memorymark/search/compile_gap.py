"""A compiled step beside the same step run eagerly: what compiling bought, and why.

`torch.compile` changes what a step holds in two ways the simulation models
(memorymark/step/compiled.py): AOTAutograd's partitioner chooses which activations are saved
for backward and recomputes the rest, and Inductor fuses pointwise chains so their
intermediates are never allocated. A report of a compiled step says so by giving both steps'
largest batch, and at one batch both ran, the peak of each by category: the difference in
saved activations is the partitioner's, the difference in temporaries and logits is fusion's
(the loss's upcasts and log-softmax fuse into fewer buffers). The engine fills it
(`Session.compile_gap`) and the report carries it, as it carries `eval_batch.EvalAnswer`. Pure
data and sentences: no torch, no strategy, no Streamlit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memorymark.measurement import Measurement
from memorymark.units import MIB, gib, gib_or_none, gib_text

_WHY = {
    "activations": (
        "saved activations",
        "the partitioner recomputes cheap ops in backward instead of saving their outputs",
    ),
    "temporary": (
        "temporaries",
        "pointwise intermediates fused into one kernel are never allocated",
    ),
    "logits": ("logits and loss", "the upcast, log-softmax and their gradients fuse"),
}
"""What a difference in each category at the peak comes from, as the report words it."""

SMALLEST_SAID = MIB
"""A category whose peak bytes differ by less than this is left out of the reasons."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompileGap:
    """The compiled step and the eager one at the same settings: each's largest batch that
    fits, and both at one batch."""

    compiled_max: int | None
    """The compiled step's largest batch that fits (None: none does)."""
    eager_max: int | None
    """The eager step's largest batch that fits, from a sweep of its own (None: none does)."""
    at_batch: int
    """The batch both were measured at: the compiled step's largest that fits, else 1."""
    compiled: Measurement
    eager: Measurement
    stopped_by: str | None = None
    """The limit that ended the eager sweep early (its largest is the best known), or None."""
    budget: float = 1.0
    """The compiled step's `activation_memory_budget`."""
    full_budget: Measurement | None = None
    """With a budget below 1: the compiled step at `at_batch` with the default budget (1.0),
    what the budget is measured against; None at the default."""

    def reasons(self) -> list[tuple[str, int, int]]:
        """(category, eager bytes, compiled bytes) at each step's peak for every category that
        differs by at least `SMALLEST_SAID`, the largest difference first; empty when either
        step has no breakdown (it did not run)."""
        eager, compiled = self.eager.breakdown, self.compiled.breakdown
        if eager is None or compiled is None:
            return []
        after = compiled.to_dict()
        rows = [
            (name, before, after[name])
            for name, before in eager.to_dict().items()
            if abs(before - after[name]) >= SMALLEST_SAID
        ]
        return sorted(rows, key=lambda row: -abs(row[1] - row[2]))

    @property
    def stopped_note(self) -> str | None:
        """What a limit that cut the eager sweep short means for its answer, or None."""
        if self.stopped_by is None:
            return None
        return f"the eager sweep stopped at {self.stopped_by}: its largest is the best known"

    def verdict(self) -> str:
        """Both largest batches, then both peaks at `at_batch` and why they differ, e.g.
        "Compiled, the largest batch that fits is 24; eager, 16. At batch 24, ..."."""

        def largest(n: int | None) -> str:
            return "no batch fits" if n is None else f"the largest batch that fits is {n}"

        text = f"Compiled, {largest(self.compiled_max)}; eager, {largest(self.eager_max)}."
        held = _held(self.compiled), _held(self.eager)
        if held[0] is None or held[1] is None:
            return text + f" At batch {self.at_batch} a step did not run to compare peaks."
        text += (
            f" At batch {self.at_batch} the compiled step peaks at {_gib_text(self.compiled)} "
            f"against {_gib_text(self.eager)} eager"
        )
        parts = []
        for name, before, after in self.reasons():
            said, why = _WHY.get(name, (name.replace("_", " "), ""))
            because = f" ({why})" if why and after < before else ""
            parts.append(f"{said} {gib_text(before)} -> {gib_text(after)}{because}")
        text += ": " + "; ".join(parts) + "." if parts else "; no category differs."
        return text + self._budget_sentence()

    def _budget_sentence(self) -> str:
        """What the activation memory budget saved against the default partitioner, or ""."""
        if self.full_budget is None:
            return ""
        held, full = _held(self.compiled), _held(self.full_budget)
        if held is None or full is None:
            return f" At the default budget (1.0) the step did not run at batch {self.at_batch}."
        saved = full - held
        how = f"saved {gib_text(saved)}" if saved >= 0 else f"cost {gib_text(-saved)} more"
        return (
            f" The activation memory budget {self.budget:g} {how} against the default (1.0), "
            f"which needs {gib_text(full)} at batch {self.at_batch}."
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON report's `compile_gap`."""
        return {
            "compiled_max_batch": self.compiled_max,
            "eager_max_batch": self.eager_max,
            "at_batch": self.at_batch,
            "compiled_required_gb": gib_or_none(_held(self.compiled)),
            "eager_required_gb": gib_or_none(_held(self.eager)),
            "compiled_breakdown": _breakdown(self.compiled),
            "eager_breakdown": _breakdown(self.eager),
            "reasons": [
                {"category": name, "eager_gb": gib(before), "compiled_gb": gib(after)}
                for name, before, after in self.reasons()
            ],
            "stopped_by": self.stopped_by,
            "activation_memory_budget": self.budget,
            "full_budget_required_gb": None
            if self.full_budget is None
            else gib_or_none(_held(self.full_budget)),
            "verdict": self.verdict(),
        }


def _held(m: Measurement) -> int | None:
    """What a step must hold: its reserved need, else its live peak when it ran (None: it ran
    out of memory with no need known)."""
    if m.required_bytes is not None:
        return m.required_bytes
    return m.peak_bytes if m.runs else None


def _gib_text(m: Measurement) -> str:
    """A step's live peak and what it must reserve: "8.10 GiB live (10.18 reserved)"."""
    held = _held(m)
    reserved = "" if held is None else f" ({gib(held):.2f} reserved)"
    return f"{gib(m.peak_bytes):.2f} GiB live{reserved}"


def _breakdown(m: Measurement) -> dict[str, int] | None:
    return m.breakdown.to_dict() if m.breakdown is not None else None
