"""When nothing fits: which settings, or which GPU, would make the model train.

For a model that runs out of memory even at batch 1, each candidate change (gradient
checkpointing, bf16 weights, LoRA, their combination, a bigger catalog GPU) is simulated at
batch 1; a simulated step traces to its end even past the GPU's capacity, so the answer says how
far off each one is, not only whether it fits.
This module composes settings and the simulated backend; it never touches a real device, and
imports the engine only when it simulates, so the report can hold `Fix` records without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memorymark import gpus
from memorymark.measurement import Measurement
from memorymark.settings import Settings
from memorymark.units import gib

LORA_RANK = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class Fix:
    """One change and its simulated batch-1 step against the GPU it targets."""

    label: str
    settings: Settings
    gpu: gpus.GPU
    peak_bytes: int
    """Peak of live tensor bytes at batch 1 (the report's "memory")."""
    required_bytes: int
    """What the GPU must hold at batch 1: predicted reserved bytes, as a sweep decides fit."""
    capacity_bytes: int

    @property
    def fits(self) -> bool:
        """True when batch 1 fits within the GPU's usable memory less the margin."""
        return self.required_bytes <= self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        """The fix as one entry of the JSON report's `fixes` list (GiB are 2**30 bytes)."""
        return {
            "label": self.label,
            "gpu_name": self.gpu.name,
            "batch_1_memory_gb": gib(self.peak_bytes),
            "batch_1_required_gb": gib(self.required_bytes),
            "limit_gb": gib(self.capacity_bytes),
            "fits": self.fits,
            "settings": self.settings.to_dict(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FitAnswer:
    """The unchanged settings' batch-1 step, and each way out."""

    required_bytes: int
    """What batch 1 needs as configured (predicted reserved bytes)."""
    fixes: tuple[Fix, ...]


def simulated_step(settings: Settings, gpu: gpus.GPU, batch_size: int = 1) -> Measurement:
    """One simulated step at `batch_size` for `gpu`: past its capacity, the step still traces
    to its end and reports what it would need (`required_bytes`)."""
    from memorymark.devices import simulated_backend

    backend = simulated_backend(replace(settings, backend="sim"), gpu)
    with backend.session():
        return backend.measure(batch_size)


def _variants(s: Settings, gpu: gpus.GPU) -> list[tuple[str, Settings]]:
    out = []
    if not s.grad_checkpointing:
        out.append(("gradient checkpointing", replace(s, grad_checkpointing=True)))
    # bf16 only where the GPU has it: a fix that would fail there is no fix.
    precision = "bf16-true" if gpu.supports_bf16 else s.precision
    if s.precision != precision:
        out.append(("bf16-true weights and optimizer", replace(s, precision=precision)))
    if not s.lora_rank and s.optimizer != "none":
        out.append((f"LoRA rank {LORA_RANK}", replace(s, lora_rank=LORA_RANK)))
    combined = replace(
        s, grad_checkpointing=True, precision=precision, lora_rank=s.lora_rank or LORA_RANK
    )
    if combined != s:
        out.append(("all three together", combined))
    return out


def what_would_fit(settings: Settings) -> FitAnswer:
    """Batch 1 as configured, each candidate change, then the smallest catalog GPU that fits."""
    from memorymark.devices import fit_policy, resolve_gpu

    gpu = resolve_gpu(settings, "sim")
    limit = fit_policy(settings, gpu).limit_bytes
    fixes = []
    for label, variant in _variants(settings, gpu):
        try:
            m = simulated_step(variant, gpu)
        except ValueError:
            continue  # this model has no such switch (checkpointing on a plain ResNet, ...)
        fixes.append(_fix(label, variant, gpu, m, limit))
    base = simulated_step(settings, gpu)
    # Another architecture may pick other attention kernels: one step per architecture.
    by_arch = {gpu.arch: base}
    for bigger in sorted(gpus.CATALOG, key=lambda g: g.usable_bytes):
        if bigger.usable_bytes <= gpu.usable_bytes:
            continue
        if settings.precision in gpus.BF16_PRECISIONS and not bigger.supports_bf16:
            continue
        variant = replace(settings, gpu=bigger.name, gpu_memory_gib=None)
        if bigger.arch not in by_arch:
            by_arch[bigger.arch] = simulated_step(variant, bigger)
        m = by_arch[bigger.arch]
        bigger_limit = fit_policy(variant, bigger).limit_bytes
        if _required(m) <= bigger_limit:
            fixes.append(_fix(f"a bigger GPU: {bigger.name}", variant, bigger, m, bigger_limit))
            break
    return FitAnswer(required_bytes=_required(base), fixes=tuple(fixes))


def _required(m: Measurement) -> int:
    # A simulated step always traces to its end, so it always says what it needs.
    assert m.required_bytes is not None
    return m.required_bytes


def _fix(label: str, settings: Settings, gpu: gpus.GPU, m: Measurement, limit: int) -> Fix:
    return Fix(
        label=label,
        settings=settings,
        gpu=gpu,
        peak_bytes=m.peak_bytes,
        required_bytes=_required(m),
        capacity_bytes=limit,
    )
