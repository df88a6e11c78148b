"""When nothing fits: which settings, or which GPU, would make the model train.

For a model that runs out of memory even at batch 1, each candidate change (gradient
checkpointing, bf16 weights, LoRA, their combination, a bigger catalog GPU) is simulated at
batch 1 with no budget, so the answer says how far off each one is, not only whether it fits.
This module composes settings and the simulated backend; it never touches a real device, and
imports the engine only when it simulates, so the report can hold `Fix` records without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memorymark import gpus
from memorymark.settings import Settings

# No budget: the peak of a step that would not fit is what we want to know.
_UNBOUNDED = 2**62
LORA_RANK = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class Fix:
    """One change and its simulated peak at batch 1 against the GPU it targets."""

    label: str
    settings: Settings
    gpu: gpus.GPU
    peak_bytes: int
    capacity_bytes: int

    @property
    def fits(self) -> bool:
        """True when batch 1 fits within the GPU's usable memory less the margin."""
        return self.peak_bytes <= self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        """The fix as one entry of the JSON report's `fixes` list (GiB are 2**30 bytes)."""
        return {
            "label": self.label,
            "gpu_name": self.gpu.name,
            "batch_1_peak_gb": round(self.peak_bytes / 2**30, 3),
            "limit_gb": round(self.capacity_bytes / 2**30, 3),
            "fits": self.fits,
            "settings": self.settings.to_dict(),
        }


def simulated_peak(settings: Settings, batch_size: int = 1) -> int:
    """The simulated peak of one step at `batch_size`, however large."""
    from memorymark.sim import SimBackend
    from memorymark.workload import Workload

    backend = SimBackend(Workload(replace(settings, backend="sim")), capacity_bytes=_UNBOUNDED)
    with backend.session():
        return backend.measure(batch_size).peak_bytes


def _variants(s: Settings) -> list[tuple[str, Settings]]:
    out = []
    if not s.grad_checkpointing:
        out.append(("gradient checkpointing", replace(s, grad_checkpointing=True)))
    if s.precision != "bf16-true":
        out.append(("bf16-true weights and optimizer", replace(s, precision="bf16-true")))
    if not s.lora_rank and s.optimizer != "none":
        out.append((f"LoRA rank {LORA_RANK}", replace(s, lora_rank=LORA_RANK)))
    combined = replace(
        s, grad_checkpointing=True, precision="bf16-true", lora_rank=s.lora_rank or LORA_RANK
    )
    if combined != s:
        out.append(("all three together", combined))
    return out


def what_would_fit(settings: Settings) -> list[Fix]:
    """Each candidate change with its batch-1 peak, then the smallest catalog GPU that fits."""
    from memorymark.devices import capacity_bytes, resolve_gpu

    gpu = resolve_gpu(settings, "sim")
    fixes = []
    for label, variant in _variants(settings):
        try:
            peak = simulated_peak(variant)
        except ValueError:
            continue  # this model has no such switch (checkpointing on a plain ResNet, ...)
        fixes.append(
            Fix(
                label=label,
                settings=variant,
                gpu=gpu,
                peak_bytes=peak,
                capacity_bytes=capacity_bytes(settings, gpu),
            )
        )
    peak = simulated_peak(settings)
    for bigger in sorted(gpus.CATALOG, key=lambda g: g.usable_bytes):
        variant = replace(settings, gpu=bigger.name, gpu_memory_gib=None)
        capacity = capacity_bytes(variant, bigger)
        if bigger.usable_bytes > gpu.usable_bytes and peak <= capacity:
            fixes.append(
                Fix(
                    label=f"a bigger GPU: {bigger.name}",
                    settings=variant,
                    gpu=bigger,
                    peak_bytes=peak,
                    capacity_bytes=capacity,
                )
            )
            break
    return fixes
