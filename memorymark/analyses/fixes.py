"""When nothing fits: which settings, which GPU, or how many GPUs would make the model train.

For a model that runs out of memory even at batch 1, each candidate change (gradient
checkpointing, bf16 weights, LoRA, 8-bit AdamW, their combination, QLoRA, Liger's fused loss for a
causal LM) is simulated at batch 1 on the chosen GPU; a simulated step traces to its end even
past the GPU's capacity, so the answer says how far off each one is, not only whether it fits.
Then other hardware (memorymark/analyses/hardware.py): the cheapest bigger catalog GPU that
trains batch 1, the fewest GPUs of the chosen kind under FSDP, and, when no change fits here,
the change that comes closest on the cheapest bigger GPU that trains it. What the states alone
decide is not stepped: the weights, gradients and optimizer state all live at the optimizer
step, so when their bytes (memorymark/analyses/states.py) already pass a limit, the change is
reported as needing at least that. Every peak a way out states otherwise is its own simulated
step, with the settings it applies, on the GPU it names. This module composes settings and the
simulated backend; it never touches a real device, and imports the engine only when it
simulates; the records (`Fix`, `FitAnswer`) live in memorymark/analyses/ways_out.py.
"""

from __future__ import annotations

from dataclasses import replace

from memorymark import gpus
from memorymark.analyses import hardware
from memorymark.analyses.states import counted_states, state_bytes
from memorymark.analyses.ways_out import FitAnswer, Fix
from memorymark.backends import selection
from memorymark.measurement import Measurement
from memorymark.settings import Settings

__all__ = ["FitAnswer", "Fix", "simulated_step", "state_bytes", "what_would_fit"]

LORA_RANK = 16


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


def what_would_fit(settings: Settings, batch_1: Measurement | None = None) -> FitAnswer:
    """Batch 1 as configured, each candidate change, then other hardware: the cheapest bigger
    catalog GPU, the fewest GPUs of this kind under FSDP, and, when no change fits here, the
    cheapest bigger GPU for the change that comes closest.

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
    # A change of settings that needs no less than batch 1 as configured, in live or reserved
    # bytes, is no way out: not offered (other hardware helps by its capacity instead).
    helpful = [
        f
        for f in fixes
        if f.required_bytes < hardware.required(base)
        or (not f.lower_bound and f.peak_bytes < base.peak_bytes)
    ]
    states, parameters = counted_states(settings)
    elsewhere = _other_hardware(settings, gpu, states, parameters)
    if not any(f.fits for f in helpful):
        elsewhere += _closest_change_elsewhere(helpful, gpu, elsewhere)
    return FitAnswer(required_bytes=hardware.required(base), fixes=(*helpful, *elsewhere))


def _step(settings: Settings, gpu: gpus.GPU) -> Measurement:
    return simulated_step(settings, gpu)  # looked up at each call: tests count the steps


def _other_hardware(settings: Settings, gpu: gpus.GPU, states: int, parameters: int) -> list[Fix]:
    """The cheapest bigger GPU that fits (or, when the states alone overflow the biggest, that
    bound on it), and the fewest GPUs of this kind under FSDP, with gradient checkpointing too
    when no count trains the settings as they are."""
    out = []
    cheapest = hardware.cheapest_gpu(settings, gpu, _step, states)
    if cheapest is not None:
        out.append(cheapest)
    else:
        biggest = max(gpus.CATALOG, key=lambda g: g.usable_bytes)
        on_it = replace(settings, gpu=biggest.name, gpu_memory_gib=None)
        limit = hardware.limit_bytes(on_it, biggest)
        if biggest.usable_bytes > gpu.usable_bytes and states > limit:
            out.append(replace(_bound(hardware.BIGGER_GPU, on_it, biggest, states, limit),
                               hardware=True))  # fmt: skip
    several = hardware.fewest_gpus(settings, gpu, _step, states, parameters)
    if several is not None:
        out.append(several)
    if several is not None and not several.fits and not settings.grad_checkpointing:
        # Sharding leaves activations whole: checkpointing is what lets more GPUs help.
        try:
            checkpointed = replace(settings, grad_checkpointing=True)
        except ValueError:
            return out  # this model has no such switch
        label = f"gradient checkpointing, on {hardware.SEVERAL_GPUS}"
        several = hardware.fewest_gpus(checkpointed, gpu, _step, states, parameters, label)
        out += [several] if several is not None else []
    if several is not None and not several.fits:
        out += _qlora_sharded(settings, gpu)
    return out


def _qlora_sharded(settings: Settings, gpu: gpus.GPU) -> list[Fix]:
    """QLoRA sharded with FSDP over the fewest GPUs of this kind, when no count trains the
    model as configured: the 4-bit base weights are what is left to shard (Llama-3.1-70B: 4 x
    A10, where 72 in fp32 do not train it: docs/cli.md, "When nothing fits")."""
    qlora = _qlora(settings, gpu)
    if qlora is None or qlora == settings:
        return []
    states, parameters = counted_states(qlora)
    label = f"QLoRA: NF4 + LoRA + checkpointing, on {hardware.SEVERAL_GPUS}"
    found = hardware.fewest_gpus(qlora, gpu, _step, states, parameters, label)
    return [found] if found is not None else []


def _closest_change_elsewhere(changes: list[Fix], gpu: gpus.GPU, others: list[Fix]) -> list[Fix]:
    """The change that needs least here, on the cheapest bigger GPU where it fits: offered when
    that GPU is cheaper than the one the unchanged settings need (or none does)."""
    if not changes:
        return []
    closest = min(changes, key=lambda f: f.required_bytes)
    # A bound is the states themselves: not counted again (a 70B model takes seconds).
    states = closest.required_bytes if closest.lower_bound else state_bytes(closest.settings)
    label = f"{closest.label}, on {hardware.BIGGER_GPU}"
    found = hardware.cheapest_gpu(closest.settings, gpu, _step, states, label)
    unchanged = next((f for f in others if f.gpus == 1 and f.fits), None)
    if found is None or (
        unchanged is not None and unchanged.gpu.usd_per_hour <= found.gpu.usd_per_hour
    ):
        return []
    return [found]


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


def _fix(label: str, settings: Settings, gpu: gpus.GPU, m: Measurement, limit: int) -> Fix:
    return Fix(
        label=label,
        settings=settings,
        gpu=gpu,
        peak_bytes=m.peak_bytes,
        required_bytes=hardware.required(m),
        limit_bytes=limit,
        samples_per_second=m.samples_per_second if hardware.required(m) <= limit else None,
    )
