"""What changes the trained model itself: LoRA adapters and gradient checkpointing.

LoRA goes through `peft`: base weights are frozen (no gradients, no optimizer state), small
adapter matrices train, and classification heads stay trainable. Gradient checkpointing uses each
library's own switch (transformers' `gradient_checkpointing_enable`, timm's
`set_grad_checkpointing`), so the step recomputes exactly what the real training run would.
This module knows nothing about devices or measurement.
"""

from __future__ import annotations

import warnings

from torch import nn

from memorymark import models

# Default LoRA targets where peft's own table has none (module names in transformers 5).
_EXTRA_LORA_TARGETS = {
    "distilbert": ["q_lin", "v_lin"],
    "vit": ["q_proj", "v_proj"],
    "convnext": ["pwconv1", "pwconv2"],
    "resnet": ["convolution"],
    "efficientnet": ["expand_conv", "project_conv"],
}

_PEFT_TASK_TYPES = {
    models.CAUSAL_LM: "CAUSAL_LM",
    models.SEQUENCE_CLASSIFICATION: "SEQ_CLS",
    models.SEQ2SEQ_LM: "SEQ_2_SEQ_LM",
}


def default_lora_targets(model: nn.Module) -> list[str]:
    """The modules LoRA adapts by default for this architecture (attention projections)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    targets = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type)
    targets = targets or _EXTRA_LORA_TARGETS.get(model_type)
    if not targets:
        raise ValueError(
            f"no default LoRA targets for {model_type or type(model).__name__}; "
            "name the modules to adapt with --lora-targets (e.g. q_proj,v_proj)"
        )
    return list(targets)


def apply_lora(model: nn.Module, task: str, rank: int, targets: str) -> nn.Module:
    """Wrap `model` with rank-`rank` LoRA adapters on `targets` (comma-separated; "" = default)."""
    from peft import LoraConfig, get_peft_model

    modules = [t.strip() for t in targets.split(",") if t.strip()] or default_lora_targets(model)
    task_type = _PEFT_TASK_TYPES.get(task)
    # Image classifiers have no peft task type; their head must still train.
    to_save = ["classifier"] if task_type is None and hasattr(model, "classifier") else None
    # GPT-2 stores its projections transposed (Conv1D); peft needs to be told, or it warns.
    transposed = any(
        type(m).__name__ == "Conv1D"
        for name, m in model.named_modules()
        if name.rsplit(".", 1)[-1] in modules
    )
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=modules,
        task_type=task_type,
        modules_to_save=to_save,
        fan_in_fan_out=transposed,
    )
    try:
        with warnings.catch_warnings():
            # peft reads transformers' deprecated is_gradient_checkpointing (renamed in 5.x);
            # the warning is about peft's code, not the user's settings.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*deprecated")
            return get_peft_model(model, config)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"LoRA: {str(exc).splitlines()[0]}") from None


def enable_checkpointing(model: nn.Module) -> None:
    """Turn on gradient checkpointing with the model's own switch, or say it has none."""
    # Non-reentrant, as PyTorch recommends: it needs no input that requires grad (LoRA).
    kwargs = {"use_reentrant": False}
    supported = getattr(model, "supports_gradient_checkpointing", True)
    if supported and hasattr(model, "activation_checkpointing_enable"):  # transformers 5
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        return
    if supported and hasattr(model, "gradient_checkpointing_enable"):  # transformers 4
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return
    if hasattr(model, "set_grad_checkpointing"):
        model.set_grad_checkpointing(True)
        return
    raise ValueError(
        f"{type(model).__name__} does not support gradient checkpointing; "
        "turn --grad-checkpointing off or pick another model"
    )
