"""What changes the trained model itself: LoRA adapters (activation checkpointing is
memorymark/step/checkpointing.py's).

LoRA goes through `peft`: base weights are frozen (no gradients, no optimizer state), small
adapter matrices train, and classification heads stay trainable. This module knows nothing
about devices or measurement, and imports torch and peft only when a function needs them, so
the snippets can ask it for the LoRA config without loading torch.
"""

from __future__ import annotations

import copy
import functools
import warnings
from typing import TYPE_CHECKING, Any

from memorymark import models

if TYPE_CHECKING:
    from torch import nn

# Default LoRA targets where peft's own table has none (module names in transformers 5).
_EXTRA_LORA_TARGETS = {
    "distilbert": ["q_lin", "v_lin"],
    "vit": ["q_proj", "v_proj"],
    "convnext": ["pwconv1", "pwconv2"],
    "resnet": ["convolution"],
    "efficientnet": ["expand_conv", "project_conv"],
    # peft's table has qwen3 but not its MoE sibling, whose attention is the same module.
    "qwen3_moe": ["q_proj", "v_proj"],
}

_PEFT_TASK_TYPES = {
    models.CAUSAL_LM: "CAUSAL_LM",
    models.SEQUENCE_CLASSIFICATION: "SEQ_CLS",
    models.SEQ2SEQ_LM: "SEQ_2_SEQ_LM",
}


def default_targets_for(model_type: str | None) -> list[str] | None:
    """The modules LoRA adapts by default for a transformers `model_type` (attention
    projections): peft's own table, then ours; None when neither has one."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    if model_type is None:
        return None
    targets = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type)
    targets = targets or _EXTRA_LORA_TARGETS.get(model_type)
    return list(targets) if targets else None


def default_lora_targets(model: nn.Module) -> list[str]:
    """The modules LoRA adapts by default for this architecture (attention projections)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    targets = default_targets_for(model_type)
    if not targets:
        raise ValueError(
            f"no default LoRA targets for {model_type or type(model).__name__}; "
            "name the modules to adapt with --lora-targets (e.g. q_proj,v_proj)"
        )
    return targets


def lora_config_kwargs(model: nn.Module, task: str, rank: int, targets: str) -> dict[str, Any]:
    """`LoraConfig`'s keyword arguments for rank-`rank` adapters on `targets` of `model`
    (comma-separated; "" = the architecture's default). Arguments left at peft's defaults are
    left out, except the dropout, which a training script would otherwise be tempted to set."""
    modules = [t.strip() for t in targets.split(",") if t.strip()] or default_lora_targets(model)
    # lora_dropout 0.0 is peft's default; above 0 each adapted layer keeps a dropped copy of its
    # input for backward, memory this step did not have.
    kwargs: dict[str, Any] = {
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": modules,
    }
    task_type = _PEFT_TASK_TYPES.get(task)
    if task_type is not None:
        kwargs["task_type"] = task_type
    elif hasattr(model, "classifier"):
        # Image classifiers have no peft task type; their head must still train.
        kwargs["modules_to_save"] = ["classifier"]
    # GPT-2 stores its projections transposed (Conv1D); peft needs to be told, or it warns.
    if any(
        type(m).__name__ == "Conv1D"
        for name, m in model.named_modules()
        if name.rsplit(".", 1)[-1] in modules
    ):
        kwargs["fan_in_fan_out"] = True
    return kwargs


def lora_config_for(model_key: str, task: str, rank: int, targets: str) -> dict[str, Any]:
    """`lora_config_kwargs` for the model a `Settings.model` key names, without its weights."""
    return copy.deepcopy(_lora_config_on_meta(model_key, task, rank, targets))


@functools.cache
def _lora_config_on_meta(model_key: str, task: str, rank: int, targets: str) -> dict[str, Any]:
    # The targets' defaults, the head's name and Conv1D layers are read off the model itself, so
    # it is built as `apply_lora` sees it; on the meta device that takes no memory and ~50 ms.
    # Cached because the app renders three snippets on every rerun.
    import torch

    with torch.device("meta"):
        model = models.build_model(models.find_model(model_key), task)
    return lora_config_kwargs(model, task, rank, targets)


def apply_lora(model: nn.Module, task: str, rank: int, targets: str) -> nn.Module:
    """Wrap `model` with rank-`rank` LoRA adapters on `targets` (comma-separated; "" = default)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(**lora_config_kwargs(model, task, rank, targets))
    try:
        with warnings.catch_warnings():
            # peft reads transformers' deprecated is_gradient_checkpointing (renamed in 5.x);
            # the warning is about peft's code, not the user's settings.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*deprecated")
            return get_peft_model(model, config)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"LoRA: {str(exc).splitlines()[0]}") from None
