"""The answer, in arithmetic: optimal batch, waste, speedup and savings from the measurements.

Pure functions of the measurements, the GPU and the cost inputs: no torch, no I/O. Moving a
price slider builds a new Report from the same measurements, so it never re-runs a sweep.
Memory figures are bytes inside and GiB (2**30 bytes) only where the JSON contract or a person
reads them (`gib`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memorymark import models
from memorymark.gpus import GPU
from memorymark.measurement import Breakdown, Measurement
from memorymark.settings import Costs, Settings
from memorymark.sweep import best_fit

GIB = 2**30


def gib(n_bytes: float) -> float:
    """Bytes as GiB (2**30 bytes), rounded for display and JSON."""
    return round(n_bytes / GIB, 3)


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """What one sweep found, and what the current batch size costs."""

    settings: Settings
    costs: Costs
    gpu: GPU
    backend: str
    measurements: tuple[Measurement, ...]
    elapsed_seconds: float

    # -- memory --------------------------------------------------------------------------------
    @property
    def measured(self) -> bool:
        """True when memory was measured on the GPU itself; False when simulated."""
        return any(m.measured for m in self.measurements)

    @property
    def memory_source(self) -> str:
        """'measured' or 'simulated': how every memory figure here was obtained."""
        return "measured" if self.measured else "simulated"

    @property
    def optimal(self) -> Measurement | None:
        """The largest batch measured as fitting below every batch that did not fit."""
        return best_fit(list(self.measurements))

    @property
    def current(self) -> Measurement | None:
        """The measurement at the user's current batch size, if it was taken."""
        for m in self.measurements:
            if m.batch_size == self.settings.current_batch:
                return m
        return None

    @property
    def current_fits(self) -> bool:
        """False when the current batch ran out of memory, or a smaller batch already did."""
        current = self.current
        if current is not None:
            return current.fits
        return all(m.fits or m.batch_size > self.settings.current_batch for m in self.measurements)

    @property
    def capped(self) -> bool:
        """True when the search stopped at max_batch with everything fitting."""
        return self.optimal is not None and all(m.fits for m in self.measurements)

    @property
    def waste_bytes(self) -> int:
        """Usable memory the current batch size leaves idle (0 if it does not fit)."""
        current = self.current
        if current is None or not current.fits:
            return 0
        return max(0, self.gpu.usable_bytes - current.peak_bytes)

    @property
    def waste_percent(self) -> float:
        """waste_bytes as a percentage of usable memory."""
        return round(100 * self.waste_bytes / self.gpu.usable_bytes, 1)

    # -- time and money --------------------------------------------------------------------------
    @property
    def batch_ratio(self) -> float | None:
        """optimal batch / current batch: the speedup if throughput grew with batch size."""
        optimal = self.optimal
        if optimal is None:
            return None
        return round(optimal.batch_size / self.settings.current_batch, 3)

    @property
    def usd_per_hour(self) -> float:
        """The price of one GPU-hour: the user's, else the catalog's."""
        if self.costs.usd_per_hour is not None:
            return self.costs.usd_per_hour
        return self.gpu.usd_per_hour

    @property
    def annual_cost_usd(self) -> float:
        """What a year of training runs costs at the current batch size."""
        return self.usd_per_hour * self.costs.hours_per_run * self.costs.runs_per_year

    @property
    def cost_savings_annual(self) -> float:
        """The same samples processed `speedup` times faster: cost * (1 - 1/speedup), at least 0."""
        speedup = self.batch_ratio
        if speedup is None or speedup <= 1 or not self.current_fits:
            return 0.0
        return round(self.annual_cost_usd * (1 - 1 / speedup), 2)

    def with_costs(self, costs: Costs) -> Report:
        """The same measurements priced with other cost inputs."""
        return replace(self, costs=costs)

    # -- words and JSON ---------------------------------------------------------------------------
    def verdict(self) -> str:
        """One sentence a person reads first."""
        optimal, current = self.optimal, self.current
        b = self.settings.current_batch
        if optimal is None:
            return f"No batch size trains on this {self.gpu.name}: even batch 1 runs out of memory."
        above = "" if self.capped else f", {self._first_failure()} does not"
        if not self.current_fits:
            return (
                f"Batch {b} runs out of memory on this {self.gpu.name}; "
                f"batch {optimal.batch_size} trains{above}."
            )
        used = 0.0 if current is None else 100 * current.peak_bytes / self.gpu.usable_bytes
        return (
            f"Batch {b} uses {used:.0f}% of this {self.gpu.name}'s usable memory; "
            f"batch {optimal.batch_size} trains{above}."
        )

    def _first_failure(self) -> int | None:
        return min((m.batch_size for m in self.measurements if not m.fits), default=None)

    def to_dict(self) -> dict[str, Any]:
        """The `analyze --json` object: the original API's /analyze fields plus what was added."""
        optimal, current = self.optimal, self.current
        breakdown: Breakdown | None = optimal.breakdown if optimal else None
        return {
            "model_name": self.settings.model,
            "model_display_name": models.find_model(self.settings.model).display_name,
            "device": self.backend,
            "gpu_name": self.gpu.name,
            "gpu_total_gb": gib(self.gpu.total_bytes),
            "optimal_batch_size": optimal.batch_size if optimal else None,
            "optimal_memory_gb": gib(optimal.peak_bytes) if optimal else None,
            "current_batch_size": self.settings.current_batch,
            "current_memory_gb": gib(current.peak_bytes) if current and current.fits else None,
            "waste_gb": gib(self.waste_bytes),
            "waste_percent": self.waste_percent,
            "speedup": self.batch_ratio,
            "speedup_source": "batch_ratio",
            "cost_savings_annual": self.cost_savings_annual,
            "results": [
                {"batch_size": m.batch_size, "memory_gb": gib(m.peak_bytes), "success": m.fits}
                for m in sorted(self.measurements, key=lambda m: m.batch_size)
            ],
            "backend": self.backend,
            "memory_source": self.memory_source,
            "usable_gb": gib(self.gpu.usable_bytes),
            "current_fits": self.current_fits,
            "capped_at_max_batch": self.capped,
            "verdict": self.verdict(),
            "breakdown": breakdown.to_dict() if breakdown else None,
            "probes": len(self.measurements),
            "elapsed_seconds": round(self.elapsed_seconds, 3),
            "usd_per_hour": self.usd_per_hour,
            "annual_cost_usd": round(self.annual_cost_usd, 2),
            "settings": self.settings.to_dict(),
            "costs": self.costs.to_dict(),
        }
