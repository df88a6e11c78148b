"""The changes of settings that could make a step fit, each as the settings it makes.

Owns the candidates a search for ways out tries on one GPU (gradient checkpointing, bf16 weights,
LoRA, 8-bit AdamW, their combination, the QLoRA recipe, Liger's fused loss for a causal LM) and
their labels. Must not know how a step is measured, or which GPUs are tried: it composes
settings only (memorymark/analyses/fixes.py steps them).
"""

from __future__ import annotations

from memorymark import gpus
from memorymark.settings import Settings

LORA_RANK = 16
"""The rank of the LoRA a change adds, where the settings have none (the labels name it)."""
QLORA = "QLoRA: NF4 + LoRA + checkpointing"


def _together(s: Settings, combined: Settings) -> str | None:
    """The title of the fix that makes several of the changes above at once, naming them
    ("gradient checkpointing + bf16-true + LoRA rank 16 together"); None when fewer than two
    change, as that fix is then one already listed."""
    parts = []
    if combined.workload.checkpointing != s.workload.checkpointing:
        parts.append(_full_checkpointing(s))
    if combined.workload.precision != s.workload.precision:
        parts.append(combined.workload.precision)
    if combined.workload.lora_rank != s.workload.lora_rank:
        parts.append(f"LoRA rank {combined.workload.lora_rank}")
    return f"{' + '.join(parts)} together" if len(parts) >= 2 else None


def settings_changes(s: Settings, gpu: gpus.GPU) -> list[tuple[str, Settings]]:
    """Each change of `s` that could make its step fit on `gpu`, with its label, in the order
    a search tries them; a change the GPU cannot run (bf16 on a T4) or the model does not take
    is not listed."""
    out = []
    # Full checkpointing keeps the least of any mode: offered from selective ones too.
    if s.workload.checkpointing != "full":
        out.append((_full_checkpointing(s), s.replace(checkpointing="full")))
    # bf16 only where the GPU has it: a fix that would fail there is no fix.
    precision = "bf16-true" if gpu.supports_bf16 else s.workload.precision
    if s.workload.precision != precision:
        out.append(("bf16-true weights and optimizer", s.replace(precision=precision)))
    if not s.workload.lora_rank and s.workload.optimizer != "none":
        out.append((f"LoRA rank {LORA_RANK}", s.replace(lora_rank=LORA_RANK)))
    if s.workload.optimizer in ("adamw", "adamw-fused", "adamw-forloop"):
        out.append(("8-bit AdamW (bitsandbytes)", s.replace(optimizer="adamw-8bit")))
    combined = s.replace(
        checkpointing="full", precision=precision, lora_rank=s.workload.lora_rank or LORA_RANK
    )
    together = _together(s, combined)
    if together is not None:
        out.append((together, combined))
    qlora = qlora_recipe(s, gpu)
    if qlora is not None and qlora != s:
        out.append((QLORA, qlora))
    fused = _fused_loss(s)
    if fused is not None:
        out.append(("Liger kernels (fused cross-entropy, no full logits)", fused))
    return out


def _full_checkpointing(s: Settings) -> str:
    """The label of full checkpointing as a change of `s`: "gradient checkpointing" from none,
    naming the mode it replaces otherwise."""
    if s.workload.checkpointing == "none":
        return "gradient checkpointing"
    return f"full checkpointing (instead of {s.workload.checkpointing})"


def qlora_recipe(s: Settings, gpu: gpus.GPU) -> Settings | None:
    """The QLoRA recipe (Dettmers et al. 2023, as PEFT's docs run it) for these settings: NF4
    base weights with double quant, bf16 compute where the GPU has it, LoRA, checkpointing.
    None for a model bitsandbytes does not quantize here (timm, torchvision) or inference."""
    if s.workload.optimizer == "none" or s.workload.forward_only:
        return None
    precision = "bf16-mixed" if gpu.supports_bf16 else "16-mixed"
    try:
        return s.replace(
            quantization="nf4",
            double_quant=True,
            lora_rank=s.workload.lora_rank or LORA_RANK,
            checkpointing="full",
            precision=precision,
        )
    except ValueError:
        return None


def _fused_loss(s: Settings) -> Settings | None:
    """The settings with Liger's kernels, whose fused loss never holds a causal LM's whole
    logits (memorymark/step/fused_loss.py); None where they do not apply."""
    if s.workload.kernels == "liger" or s.workload.loss != "task":
        return None
    try:
        return s.replace(kernels="liger", loss_chunks=0, backend=_simulable(s.hardware.backend))
    except ValueError:  # not a causal LM
        return None


def _simulable(backend: str) -> str:
    # Liger's kernels have no CPU build: the advice for a CPU run is simulated for the GPU.
    return "sim" if backend == "cpu" else backend
