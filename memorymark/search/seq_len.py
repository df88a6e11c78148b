"""The longest sequence that trains at a fixed batch: the same sweep and strategies, over seq_len.

`analyze --find seq-len --batch-size N` searches the other axis of a long-context fine-tune. The
sweep generator and the strategies (memorymark/search/sweep.py, strategies.py) search any integer
axis whose memory grows with it; they call it "batch size". `SeqLenMeasurer` hands them sequence
lengths as that axis: each probe steps the same resident model and optimizer state (they do not
depend on the sequence length) at batch N with the probed length, and the measurement comes back
relabelled so the strategy reads the length where it reads a batch. The real measurements are
kept as taken (`SeqLenAnswer.probes`). This module knows nothing about how a step is measured or
displayed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memorymark.measurement import Measurement
from memorymark.search.sweep import best_fit
from memorymark.search.variant import VariantMeasurer
from memorymark.settings import Settings
from memorymark.units import gib

UNBOUNDED_CONTEXT = 131_072
"""Where a search stops for a model whose config sets no position limit (T5's relative
attention): the catalog's longest context, Llama 3.1's 128k."""


def search_cap(settings: Settings, max_positions: int | None) -> int:
    """The longest sequence a search may try: the model's positions (or the catalog's longest
    context), a whole number of `seq_step` tokens when at least one step fits under it."""
    cap = max_positions or UNBOUNDED_CONTEXT
    return (
        cap // settings.search.seq_step * settings.search.seq_step
        if settings.search.seq_step <= cap
        else cap
    )


class SeqLenMeasurer(VariantMeasurer):
    """A backend seen by the sweep as measuring sequence lengths at one batch size."""

    field = "seq_len"


@dataclass(frozen=True, slots=True, kw_only=True)
class SeqLenAnswer:
    """The longest sequence that trains at `batch_size`, and every probe that says so."""

    settings: Settings
    batch_size: int
    probes: tuple[tuple[int, Measurement], ...]
    """(sequence length, measurement) in the order tried."""
    search_cap: int
    """The longest length the search could try (the model's positions)."""
    gpu_name: str
    gpu_total_bytes: int
    usable_bytes: int
    memory_source: str
    elapsed_seconds: float
    search_fallback: str | None = None
    """Why the symbolic search traced lengths it would have replayed (None: it replayed, or
    another strategy searched)."""

    def _best(self, *, runs: bool) -> tuple[int, Measurement] | None:
        relabelled = [replace(m, batch_size=n) for n, m in self.probes]
        best = best_fit(relabelled, runs=runs)
        if best is None:
            return None
        return best.batch_size, dict(self.probes)[best.batch_size]

    @property
    def optimal_seq_len(self) -> int | None:
        """The longest length that fits with the margin (None: not even the shortest tried)."""
        best = self._best(runs=False)
        return best[0] if best else None

    @property
    def max_seq_len(self) -> int | None:
        """The longest length that runs at all (no margin)."""
        best = self._best(runs=True)
        return best[0] if best else None

    @property
    def capped(self) -> bool:
        """True when the model's positions, not memory, end the search."""
        return self.optimal_seq_len == self.search_cap

    def verdict(self) -> str:
        """One sentence: the answer and what it is bounded by."""
        best = self._best(runs=False)
        if best is None:
            return (
                f"no sequence length trains at batch {self.batch_size} on the {self.gpu_name} "
                f"(the shortest tried was {min(n for n, _ in self.probes)} tokens)"
            )
        seq_len, m = best
        bound = " (the model's position limit)" if self.capped else ""
        return (
            f"the longest sequence that trains at batch {self.batch_size} on the {self.gpu_name} "
            f"is {seq_len:,} tokens{bound}: peak {gib(m.peak_bytes):.2f} GiB "
            f"({self.memory_source})"
        )

    def to_dict(self) -> dict[str, Any]:
        """The `analyze --find seq-len --json` object."""
        best = self._best(runs=False)
        return {
            "model_name": self.settings.workload.model,
            "find": "seq-len",
            "gpu_name": self.gpu_name,
            "gpu_total_gb": round(gib(self.gpu_total_bytes), 4),
            "usable_gb": round(gib(self.usable_bytes), 4),
            "batch_size": self.batch_size,
            "optimal_seq_len": self.optimal_seq_len,
            "optimal_memory_gb": round(gib(best[1].peak_bytes), 4) if best else None,
            "max_seq_len": self.max_seq_len,
            "search_cap": self.search_cap,
            "capped_by_positions": self.capped,
            "memory_source": self.memory_source,
            "elapsed_seconds": round(self.elapsed_seconds, 3),
            "strategy": self.settings.search.strategy,
            "search_fallback": self.search_fallback,
            "results": [
                {
                    "seq_len": n,
                    "memory_gb": round(gib(m.peak_bytes), 4),
                    "required_gb": None
                    if m.required_bytes is None
                    else round(gib(m.required_bytes), 4),
                    "success": m.fits,
                    "runs": m.runs,
                    "replayed": m.replayed,
                    "breakdown": m.breakdown.to_dict() if m.breakdown else None,
                }
                for n, m in self.probes
            ],
            "settings": self.settings.to_dict(),
        }
