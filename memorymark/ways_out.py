"""One way out of "nothing fits", as a plain value: `Fix`, and `FitAnswer`, the list of them.

A way out is a change of settings, another GPU, or more GPUs, with the simulated batch-1 step
that judged it (or, marked `lower_bound`, the counted states that already pass its limit), the
limit it was judged against, and for one that fits its estimated throughput and so its price:
GPUs x price per GPU-hour, and the estimated cost of a run of `SAMPLES_PER_RUN` samples. The
report holds these records, so they live beside it (memorymark/report.py imports them, the
analyses that find them import both): this module imports no torch. Must not know how a way out
is found (memorymark/analyses/fixes.py, hardware.py) or shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memorymark import gpus
from memorymark.settings import Settings
from memorymark.units import gib

SAMPLES_PER_RUN = 1_000_000
"""The run a way out's time and cost are estimated for: scaling out's default run
(`Session.scale_out`), since the configured run never ran to give hours of its own."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fix:
    """One change and its simulated batch-1 step against the GPU it targets."""

    label: str
    """What changes, never naming the GPU ("LoRA rank 16", "a bigger GPU")."""
    settings: Settings
    gpu: gpus.GPU
    """The GPU kind the way out runs on (a whole catalog GPU; `gpus` of them)."""
    peak_bytes: int
    """Peak of live tensor bytes at batch 1 (the report's "memory"), on one rank."""
    required_bytes: int
    """What the GPU must hold at batch 1: predicted reserved bytes, as a sweep decides fit."""
    limit_bytes: int
    """What batch 1 must stay within on that GPU: usable memory (less NCCL's buffers on many
    GPUs) less the margin (the fit policy's limit)."""
    lower_bound: bool = False
    """True when the states alone decided it without a step: it needs at least `required_bytes`
    (weights, gradients and optimizer state), which already pass the limit."""
    hardware: bool = False
    """True when the way out is other hardware (another GPU, or more of them): its title names
    where it runs; False for a change of settings on the chosen GPU."""
    samples_per_second: float | None = None
    """Estimated throughput at batch 1 over every GPU (FLOPs and bytes on the roofline, the
    strategy's traffic over the catalog's links); None when it does not fit or is not known."""

    @property
    def fits(self) -> bool:
        """True when batch 1 fits within the GPU's usable memory less the margin."""
        return self.required_bytes <= self.limit_bytes

    @property
    def gpus(self) -> int:
        """How many GPUs the way out trains on."""
        return self.settings.hardware.gpu_count or 1

    @property
    def where(self) -> str:
        """The hardware: "A100 80GB", or "64 x A10" on many GPUs."""
        return self.gpu.name if self.gpus == 1 else f"{self.gpus} x {self.gpu.name}"

    @property
    def title(self) -> str:
        """The way out in a few words: "a bigger GPU: A100 80GB", "LoRA rank 16"."""
        return f"{self.label}: {self.where}" if self.hardware else self.label

    def usd_per_hour(self, usd_per_gpu_hour: float | None = None) -> float:
        """What an hour on every GPU of the way out costs: `usd_per_gpu_hour` (the user's price
        for this kind) or the catalog's, times the GPUs."""
        price = self.gpu.usd_per_hour if usd_per_gpu_hour is None else usd_per_gpu_hour
        return round(self.gpus * price, 4)

    @property
    def est_hours_per_run(self) -> float | None:
        """Estimated hours of a run of `SAMPLES_PER_RUN` samples at batch 1; None when the
        run time cannot be estimated (the way out does not fit, or has no throughput)."""
        if not self.samples_per_second:
            return None
        return SAMPLES_PER_RUN / self.samples_per_second / 3600

    def cost_per_run_usd(self, usd_per_gpu_hour: float | None = None) -> float | None:
        """Estimated cost of a run of `SAMPLES_PER_RUN` samples; None when its time is not."""
        hours = self.est_hours_per_run
        return None if hours is None else round(hours * self.usd_per_hour(usd_per_gpu_hour), 2)

    def cost_note(self, usd_per_gpu_hour: float | None = None) -> str:
        """The price in words, saying what is estimated and what could not be."""
        hourly = f"${self.usd_per_hour(usd_per_gpu_hour):,.2f}/h"
        if self.gpus > 1:
            hourly += f" ({self.gpus} GPUs)"
        cost = self.cost_per_run_usd(usd_per_gpu_hour)
        if cost is None:
            return f"{hourly}; run time not estimated"
        return (
            f"{hourly}, about ${cost:,.2f} per run of {SAMPLES_PER_RUN:,} samples at batch 1 "
            f"({self.est_hours_per_run:,.1f} h, estimated)"
        )

    def to_dict(self, usd_per_gpu_hour: float | None = None) -> dict[str, Any]:
        """The fix as one entry of the JSON report's `fixes` list (GiB are 2**30 bytes); the
        price per GPU-hour is `usd_per_gpu_hour` (the user's, for the chosen kind) or the
        catalog's."""
        return {
            "label": self.label,
            "title": self.title,
            "gpu_name": self.gpu.name,
            "gpus": self.gpus,
            "dist": self.settings.hardware.dist,
            "batch_1_memory_gb": gib(self.peak_bytes),
            "batch_1_required_gb": gib(self.required_bytes),
            "limit_gb": gib(self.limit_bytes),
            "fits": self.fits,
            "at_least": self.lower_bound,
            "memory_source": "simulated",
            "usd_per_hour": self.usd_per_hour(usd_per_gpu_hour),
            "samples_per_second": None
            if self.samples_per_second is None
            else round(self.samples_per_second, 4),
            "samples_per_run": SAMPLES_PER_RUN,
            "est_hours_per_run": None
            if self.est_hours_per_run is None
            else round(self.est_hours_per_run, 2),
            "cost_per_run_usd": self.cost_per_run_usd(usd_per_gpu_hour),
            "cost_note": self.cost_note(usd_per_gpu_hour),
            "settings": self.settings.to_dict(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FitAnswer:
    """The unchanged settings' batch-1 step, and each way out found."""

    required_bytes: int | None
    """What batch 1 needs as configured (predicted reserved bytes); None when the search ran
    out of time before it knew."""
    fixes: tuple[Fix, ...]
    stopped_by: str | None = None
    """The limit that ended the search before it finished ("the time limit (120 s)"); None
    when every stage ended."""
    not_finished: tuple[str, ...] = ()
    """When a limit stopped it: the ways out it did not finish looking at (their labels)."""
