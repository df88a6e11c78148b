"""The built-in model catalog, and building a catalog model from its shipped architecture config.

Every model is built from a config.json shipped in `memorymark/models/configs/` with random weights:
memory does not depend on weight values, and no hub is reachable at run time. This module knows
nothing about devices, fake tensors or measurement; callers choose where the model is built
(`torch.device("meta")` for simulation, a real device otherwise).
"""

from __future__ import annotations

import difflib
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memorymark import limits
from memorymark.models import config_checks, depth

# The tasks and the entry record live in entry.py, so that sources.py (entries for configs
# outside the catalog) needs nothing from this module; the package re-exports them.
from memorymark.models.entry import (
    CAUSAL_LM,
    DECODER_TASKS,
    IMAGE_CLASSIFICATION,
    SEQ2SEQ_LM,
    SEQUENCE_CLASSIFICATION,
    TEXT_CLASSIFIERS,
    ModelEntry,
)
from memorymark.models.parameter_counts import PARAMETERS

if TYPE_CHECKING:
    from torch import nn

CONFIG_DIR = Path(__file__).parent / "configs"

CATALOG: tuple[ModelEntry, ...] = (
    ModelEntry(
        key="bert",
        display_name="BERT-base (uncased)",
        config_file="bert-base-uncased.json",
        tasks=(SEQUENCE_CLASSIFICATION,),
        default_task=SEQUENCE_CLASSIFICATION,
        max_positions=512,
    ),
    ModelEntry(
        key="gpt2",
        display_name="GPT-2 124M",
        config_file="gpt2.json",
        tasks=(CAUSAL_LM, SEQUENCE_CLASSIFICATION),
        default_task=CAUSAL_LM,
        max_positions=1024,
    ),
    ModelEntry(
        key="resnet",
        display_name="ResNet-50",
        config_file="resnet-50.json",
        tasks=(IMAGE_CLASSIFICATION,),
        default_task=IMAGE_CLASSIFICATION,
        num_labels=1000,
    ),
    ModelEntry(
        key="distilbert",
        display_name="DistilBERT-base (uncased)",
        config_file="distilbert-base-uncased.json",
        tasks=TEXT_CLASSIFIERS,
        default_task=SEQUENCE_CLASSIFICATION,
        max_positions=512,
    ),
    ModelEntry(
        key="roberta",
        display_name="RoBERTa-base",
        config_file="roberta-base.json",
        tasks=TEXT_CLASSIFIERS,
        default_task=SEQUENCE_CLASSIFICATION,
        max_positions=512,  # 514 position embeddings, two of them reserved by the padding offset
    ),
    ModelEntry(
        key="bert-large",
        display_name="BERT-large (uncased)",
        config_file="bert-large-uncased.json",
        tasks=TEXT_CLASSIFIERS,
        default_task=SEQUENCE_CLASSIFICATION,
        max_positions=512,
    ),
    ModelEntry(
        key="gpt2-medium",
        display_name="GPT-2 medium 355M",
        config_file="gpt2-medium.json",
        tasks=DECODER_TASKS,
        default_task=CAUSAL_LM,
        max_positions=1024,
    ),
    ModelEntry(
        key="t5-small",
        display_name="T5-small",
        config_file="t5-small.json",
        tasks=(SEQ2SEQ_LM,),
        default_task=SEQ2SEQ_LM,
    ),
    ModelEntry(
        key="vit",
        display_name="ViT-B/16",
        config_file="vit-base-patch16-224.json",
        tasks=(IMAGE_CLASSIFICATION,),
        default_task=IMAGE_CLASSIFICATION,
        num_labels=1000,
    ),
    ModelEntry(
        key="convnext",
        display_name="ConvNeXt-Tiny",
        config_file="convnext-tiny-224.json",
        tasks=(IMAGE_CLASSIFICATION,),
        default_task=IMAGE_CLASSIFICATION,
        num_labels=1000,
    ),
    ModelEntry(
        key="efficientnet",
        display_name="EfficientNet-B0",
        config_file="efficientnet-b0.json",
        tasks=(IMAGE_CLASSIFICATION,),
        default_task=IMAGE_CLASSIFICATION,
        num_labels=1000,
    ),
    ModelEntry(
        key="qwen2.5-0.5b",
        display_name="Qwen2.5-0.5B",
        config_file="qwen2.5-0.5b.json",
        tasks=DECODER_TASKS,
        default_task=CAUSAL_LM,
        max_positions=32768,
    ),
    ModelEntry(
        key="llama-3.2-1b",
        display_name="Llama-3.2-1B",
        config_file="llama-3.2-1b.json",
        tasks=DECODER_TASKS,
        default_task=CAUSAL_LM,
        max_positions=131072,
    ),
    ModelEntry(
        key="mistral-7b",
        display_name="Mistral-7B (v0.1)",
        config_file="mistral-7b-v0.1.json",
        tasks=DECODER_TASKS,
        default_task=CAUSAL_LM,
        max_positions=32768,
    ),
    ModelEntry(
        key="llama-3.1-8b",
        display_name="Llama-3.1-8B",
        config_file="llama-3.1-8b.json",
        tasks=DECODER_TASKS,
        default_task=CAUSAL_LM,
        max_positions=131072,
    ),
    ModelEntry(
        key="llama-3.1-70b",
        display_name="Llama-3.1-70B",
        config_file="llama-3.1-70b.json",
        tasks=DECODER_TASKS,
        default_task=CAUSAL_LM,
        max_positions=131072,
    ),
    ModelEntry(
        key="qwen3-8b",
        display_name="Qwen3-8B",
        config_file="qwen3-8b.json",  # https://huggingface.co/Qwen/Qwen3-8B
        tasks=DECODER_TASKS,
        default_task=CAUSAL_LM,
        max_positions=40960,
    ),
    ModelEntry(
        key="gemma-3-1b",
        display_name="Gemma 3 1B (text)",
        config_file="gemma-3-1b.json",  # https://huggingface.co/google/gemma-3-1b-pt
        tasks=DECODER_TASKS,
        default_task=CAUSAL_LM,
        max_positions=32768,
    ),
    # Mixture of experts: all 128 experts of every layer are resident (transformers keeps them as
    # fused 3-D weights); each token runs 8. Trains in bf16 only: torch's grouped_mm, which
    # transformers' experts call, takes bf16 inputs.
    ModelEntry(
        key="qwen3-30b-a3b",
        display_name="Qwen3-30B-A3B (MoE, 128 experts)",
        config_file="qwen3-30b-a3b.json",  # https://huggingface.co/Qwen/Qwen3-30B-A3B
        tasks=DECODER_TASKS,
        default_task=CAUSAL_LM,
        max_positions=40960,
    ),
    # Tiny models: seconds to measure for real on a CPU; the test suite and quick demos use them.
    ModelEntry(
        key="tiny-bert",
        display_name="Tiny BERT (2 layers, for tests)",
        config_file="tiny-bert.json",
        tasks=(SEQUENCE_CLASSIFICATION,),
        default_task=SEQUENCE_CLASSIFICATION,
        max_positions=128,
    ),
    ModelEntry(
        key="tiny-gpt2",
        display_name="Tiny GPT-2 (2 layers, for tests)",
        config_file="tiny-gpt2.json",
        tasks=(CAUSAL_LM, SEQUENCE_CLASSIFICATION),
        default_task=CAUSAL_LM,
        max_positions=128,
    ),
    ModelEntry(
        key="tiny-llama",
        display_name="Tiny Llama (2 layers, for tests)",
        config_file="tiny-llama.json",
        tasks=DECODER_TASKS,
        default_task=CAUSAL_LM,
        max_positions=4096,
    ),
    ModelEntry(
        key="tiny-resnet",
        display_name="Tiny ResNet (2 stages, for tests)",
        config_file="tiny-resnet.json",
        tasks=(IMAGE_CLASSIFICATION,),
        default_task=IMAGE_CLASSIFICATION,
        num_labels=10,
    ),
)


class UnknownModelError(ValueError):
    """A model name that is not in the catalog."""


def find_model(key: str) -> ModelEntry:
    """The entry for a catalog key (case-insensitive) or a `file:`, `hf:`, `timm:` or
    `torchvision:` spec; UnknownModelError (a ValueError) names the choices."""
    if ":" in key:
        from memorymark.models import sources

        return sources.resolve(key.strip())
    wanted = key.strip().lower()
    shown = limits.shown(key)
    for entry in CATALOG:
        if entry.key == wanted:
            return entry
    keys = [e.key for e in CATALOG]
    close = difflib.get_close_matches(wanted[:100], keys, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UnknownModelError(
        f"unknown model {shown}; {hint}known: {', '.join(keys)}, or file:PATH, hf:ORG/NAME, "
        "timm:NAME, torchvision:NAME"
    )


def check_model_spec(key: str) -> str:
    """The source a model string names ("catalog", "file", "hf", "timm", "torchvision"), or
    refuse, with no I/O, one that cannot name a model: an unknown catalog key, or a `file:`,
    `hf:`, `timm:` or `torchvision:` spec of the wrong form. Whether a spec's file or
    repository really holds a model is known only when it is read (`find_model`)."""
    if ":" in key:
        from memorymark.models import sources

        return sources.check_spec(key.strip())[0]
    find_model(key)
    return "catalog"


def check_task_and_length(entry: ModelEntry, task: str | None, seq_len: int, name: str) -> None:
    """Refuse a task the model (`name`, as the user wrote it) does not train, or more tokens
    than it has positions."""
    if task is not None and task not in entry.tasks:
        raise ValueError(
            f"model {limits.shown(name)} supports tasks {', '.join(entry.tasks)} "
            f"(got {limits.shown(task)})"
        )
    if entry.max_positions is not None and seq_len > entry.max_positions:
        raise ValueError(f"seq_len {seq_len} exceeds {name}'s {entry.max_positions} positions")


def model_keys() -> list[str]:
    """Catalog keys, in catalog order."""
    return [e.key for e in CATALOG]


@cache
def _config_dict(config_file: str) -> dict[str, Any]:
    # A file: entry's absolute path replaces CONFIG_DIR; read with the same checks as at resolve.
    data = config_checks.read_config(CONFIG_DIR / config_file)
    return {k: v for k, v in data.items() if not k.startswith("_")}


def config_of(entry: ModelEntry) -> dict[str, Any] | None:
    """The config.json a catalog or file entry is built from; None for timm and torchvision."""
    if entry.source in ("timm", "torchvision"):
        return None
    return _config_dict(entry.config_file)


def build_model(
    entry: ModelEntry,
    task: str,
    *,
    image_size: int | None = None,
    attn_implementation: str = "sdpa",
    emulate_flash_attention: bool = False,
    layers: int | None = None,
) -> nn.Module:
    """A randomly initialised model for `task`, on whatever device is current (meta, cpu, cuda).

    `layers` builds the same model with that many blocks (memorymark/models/depth.py), as the
    depth replay traces it; None: as many as its config says.

    `image_size` resizes models whose config fixes it (ViT's position embeddings), so they train
    at the size asked for, as fine-tuning at another resolution does. `attn_implementation` is
    the attention of transformers models: "sdpa" leaves transformers' default, which is SDPA for
    every model that supports it (a model with no attention would refuse the name), "eager" the
    matmul-softmax-matmul modules, "flash_attention_2" the flash-attn package (with
    `emulate_flash_attention`, the model is built with SDPA and then told to call
    flash_attention_2, which `cuda_rules.flash_attn2` answers in the simulation).
    """
    if entry.source in ("timm", "torchvision"):
        from memorymark.models import sources

        return sources.build_library_model(entry, image_size)
    import transformers

    config_data = dict(_config_dict(entry.config_file))
    if layers is not None:
        plan = depth.layer_plan(config_data)
        if isinstance(plan, str):
            raise ValueError(f"{entry.display_name} cannot be built with {layers} blocks: {plan}")
        config_data = depth.with_layers(config_data, plan, layers)
    model_type = config_data.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **config_data)
    # No KV cache: training never reads it, and it would keep every layer's keys alive.
    config.use_cache = False
    if image_size is not None and hasattr(config, "image_size"):
        config.image_size = image_size
    if task in (SEQUENCE_CLASSIFICATION, IMAGE_CLASSIFICATION):
        config.num_labels = entry.num_labels
    if task == SEQUENCE_CLASSIFICATION and getattr(config, "pad_token_id", None) is None:
        # GPT-2 has no pad token; classification heads need one to find each sequence's end.
        config.pad_token_id = config.eos_token_id
    auto_class = {
        SEQUENCE_CLASSIFICATION: transformers.AutoModelForSequenceClassification,
        CAUSAL_LM: transformers.AutoModelForCausalLM,
        IMAGE_CLASSIFICATION: transformers.AutoModelForImageClassification,
        SEQ2SEQ_LM: transformers.AutoModelForSeq2SeqLM,
    }[task]
    attn = None if attn_implementation == "sdpa" else attn_implementation
    emulated = attn == "flash_attention_2" and emulate_flash_attention
    try:
        model = auto_class.from_config(config, attn_implementation=None if emulated else attn)
    except ImportError as exc:  # transformers' check that flash_attn is installed
        raise ValueError(
            f"{attn_implementation} cannot run here ({str(exc).strip().splitlines()[0][:120]}); "
            "--backend sim models it without the package"
        ) from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError) as exc:
        # A user's config.json can hold values transformers' config accepts and its modules
        # do not (a string activation it does not know, heads that do not divide the width).
        if entry.source == "catalog":
            raise
        reason = str(exc).strip().splitlines()[0][:100] if str(exc).strip() else ""
        raise ValueError(
            f"{entry.display_name}: transformers cannot build this config "
            f"({type(exc).__name__}: {reason})"
        ) from None
    if emulated:
        if not getattr(model, "_supports_flash_attn", False):
            raise ValueError(f"{entry.display_name} does not support flash_attention_2")
        model.config._attn_implementation = attn  # answered by cuda_rules.flash_attn2
    return model


def parameter_count(entry: ModelEntry, task: str | None = None) -> int:
    """Parameters of the model: the shipped count for a catalog model (no torch), otherwise
    counted by building it (`count_parameters`)."""
    task = task or entry.default_task
    if entry.source == "catalog" and (entry.key, task) in PARAMETERS:
        return PARAMETERS[(entry.key, task)]
    return count_parameters(entry, task)


def count_parameters(entry: ModelEntry, task: str | None = None) -> int:
    """Parameters of the model, counted on the meta device (no memory, but torch and
    transformers load: seconds before the first count)."""
    import torch

    with torch.device("meta"):
        model = build_model(entry, task or entry.default_task)
    return sum(p.numel() for p in model.parameters())
