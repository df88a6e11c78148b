"""When nothing fits: which settings, or which GPU, would make the model train.

For a model that runs out of memory even at batch 1, each candidate change (gradient
checkpointing, bf16 weights, LoRA, 8-bit AdamW, their combination, QLoRA, Liger's fused loss for a
causal LM, a bigger catalog GPU) is simulated at
batch 1; a simulated step traces to its end even past the GPU's capacity, so the answer says how
far off each one is, not only whether it fits. What the states alone decide is not stepped: the
weights, gradients and optimizer state all live at the optimizer step, so when their bytes
(counted on the meta device, in seconds even for a 70B model) already pass a limit, the change is
reported as needing at least that. This module composes settings and the simulated backend; it
never touches a real device, and imports the engine only when it simulates, so the report can
hold `Fix` records without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memorymark import gpus
from memorymark.backends import selection
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
    limit_bytes: int
    """What batch 1 must stay within on that GPU: usable memory less the margin (the fit
    policy's limit)."""
    lower_bound: bool = False
    """True when the states alone decided it without a step: it needs at least `required_bytes`
    (weights, gradients and optimizer state), which already pass the limit."""

    @property
    def fits(self) -> bool:
        """True when batch 1 fits within the GPU's usable memory less the margin."""
        return self.required_bytes <= self.limit_bytes

    def to_dict(self) -> dict[str, Any]:
        """The fix as one entry of the JSON report's `fixes` list (GiB are 2**30 bytes)."""
        return {
            "label": self.label,
            "gpu_name": self.gpu.name,
            "batch_1_memory_gb": gib(self.peak_bytes),
            "batch_1_required_gb": gib(self.required_bytes),
            "limit_gb": gib(self.limit_bytes),
            "fits": self.fits,
            "at_least": self.lower_bound,
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
    from memorymark.backends.resolve import resolve

    backend = resolve(replace(settings, backend="sim"), gpu=gpu).open_backend()
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
    if s.optimizer in ("adamw", "adamw-fused", "adamw-forloop"):
        out.append(("8-bit AdamW (bitsandbytes)", replace(s, optimizer="adamw-8bit")))
    combined = replace(
        s, grad_checkpointing=True, precision=precision, lora_rank=s.lora_rank or LORA_RANK
    )
    if combined != s:
        out.append(("all three together", combined))
    qlora = _qlora(s, gpu)
    if qlora is not None and qlora != s:
        out.append(("QLoRA: NF4 + LoRA + checkpointing", qlora))
    fused = _fused_loss(s)
    if fused is not None:
        out.append(("Liger kernels (fused cross-entropy, no full logits)", fused))
    return out


def _qlora(s: Settings, gpu: gpus.GPU) -> Settings | None:
    """The QLoRA recipe (Dettmers et al. 2023, as PEFT's docs run it) for these settings: NF4
    base weights with double quant, bf16 compute where the GPU has it, LoRA, checkpointing.
    None for a model bitsandbytes does not quantize here (timm, torchvision) or inference."""
    if s.optimizer == "none" or s.forward_only:
        return None
    precision = "bf16-mixed" if gpu.supports_bf16 else "16-mixed"
    try:
        return replace(
            s,
            quantization="nf4",
            double_quant=True,
            lora_rank=s.lora_rank or LORA_RANK,
            grad_checkpointing=True,
            precision=precision,
        )
    except ValueError:
        return None


def _fused_loss(s: Settings) -> Settings | None:
    """The settings with Liger's kernels, whose fused loss never holds a causal LM's whole
    logits (memorymark/step/fused_loss.py); None where they do not apply."""
    if s.kernels == "liger" or s.loss != "task":
        return None
    try:
        return replace(s, kernels="liger", loss_chunks=0, backend=_simulable(s.backend))
    except ValueError:  # not a causal LM
        return None


def _simulable(backend: str) -> str:
    # Liger's kernels have no CPU build: the advice for a CPU run is simulated for the GPU.
    return "sim" if backend == "cpu" else backend


def state_bytes(settings: Settings) -> int:
    """A lower bound on any training step's peak under `settings`: the bytes of the weights and,
    for the parameters that train, their gradients and the optimizer's state, all alive at the
    optimizer step. Counted on the meta device: nothing is allocated or run."""
    import torch

    from memorymark.step.catalog import CatalogStep

    with torch.device("meta"):
        model = CatalogStep(settings).build_model()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if settings.forward_only or settings.optimizer == "none":
        return weights
    trained = [p for p in model.parameters() if p.requires_grad]
    trainable = sum(p.numel() * p.element_size() for p in trained)
    return weights + trainable + _state_lower_bound(settings.optimizer, trained)


def _state_lower_bound(optimizer: str, trained: list[Any]) -> int:
    """Bytes the optimizer's state takes at least, inside the allocator."""
    like_weights = sum(p.numel() * p.element_size() for p in trained)
    numel = sum(p.numel() for p in trained)
    # AdamW keeps two buffers like each trained weight, SGD's momentum one; bitsandbytes' 8-bit
    # ones a byte per value (two for AdamW, one for Lion), more for small tensors and absmax;
    # paged state lives outside the allocator, and Adafactor's factored moments are small: they
    # count as none (a lower bound stays a lower bound).
    per_optimizer = {
        "adamw": 2 * like_weights,
        "adamw-fused": 2 * like_weights,
        "adamw-forloop": 2 * like_weights,
        "sgd": like_weights,
        "sgd-forloop": like_weights,
        "adamw-8bit": 2 * numel,
        "lion-8bit": numel,
    }
    return per_optimizer.get(optimizer, 0)


def what_would_fit(settings: Settings, batch_1: Measurement | None = None) -> FitAnswer:
    """Batch 1 as configured, each candidate change, then the smallest catalog GPU that fits.

    `batch_1` is the sweep's own simulated step at batch 1 as configured, when it took one: it
    is not stepped again."""
    from memorymark.backends.resolve import resolve_gpu  # torch: only when nothing fits

    gpu = resolve_gpu(settings, "sim")
    limit = selection.fit_policy(settings, gpu).limit_bytes
    fixes = []
    for label, variant in _variants(settings, gpu):
        try:
            states = state_bytes(variant)
        except ValueError:
            continue  # this model has no such switch (checkpointing on a plain ResNet, ...)
        if states > limit:
            fixes.append(_bound(label, variant, gpu, states, limit))
            continue
        fixes.append(_fix(label, variant, gpu, simulated_step(variant, gpu), limit))
    base = batch_1 if batch_1 is not None and not batch_1.measured else None
    base = base if base is not None and base.required_bytes is not None else None
    base = base or simulated_step(settings, gpu)
    states = state_bytes(settings)
    # Another compute capability may pick other attention kernels: one step per capability,
    # and none for a GPU the states alone overflow.
    by_arch = {gpu.compute_capability: base}
    for bigger in sorted(gpus.CATALOG, key=lambda g: g.usable_bytes):
        if bigger.usable_bytes <= gpu.usable_bytes:
            continue
        if settings.precision in gpus.BF16_PRECISIONS and not bigger.supports_bf16:
            continue
        variant = replace(settings, gpu=bigger.name, gpu_memory_gib=None)
        bigger_limit = selection.fit_policy(variant, bigger).limit_bytes
        if states > bigger_limit:
            continue
        if bigger.compute_capability not in by_arch:
            by_arch[bigger.compute_capability] = simulated_step(variant, bigger)
        m = by_arch[bigger.compute_capability]
        if _required(m) <= bigger_limit:
            fixes.append(_fix(f"a bigger GPU: {bigger.name}", variant, bigger, m, bigger_limit))
            break
    # A change of settings that needs no less than batch 1 as configured, in live or reserved
    # bytes, is no way out: not offered (a bigger GPU helps by its capacity instead).
    helpful = tuple(
        f
        for f in fixes
        if f.gpu is not gpu
        or f.required_bytes < _required(base)
        or (not f.lower_bound and f.peak_bytes < base.peak_bytes)
    )
    return FitAnswer(required_bytes=_required(base), fixes=helpful)


def _bound(label: str, settings: Settings, gpu: gpus.GPU, states: int, limit: int) -> Fix:
    return Fix(
        label=label,
        settings=settings,
        gpu=gpu,
        peak_bytes=states,
        required_bytes=states,
        limit_bytes=limit,
        lower_bound=True,
    )


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
        limit_bytes=limit,
    )
