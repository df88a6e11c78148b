"""The choices: the names each option accepts, the ranges each number must stay in, and the check.

Every `Literal` here is the one list of a setting's choices: the sections' field types, the CLI's
`choices=` and the app's select boxes all read it. `validate` checks a section's (or `Costs`')
every field against its type, choices and range in one line each; `parse_margin` reads a margin.
Must not know: sections, torch, or how anything is shown.
"""

from __future__ import annotations

import typing
from dataclasses import fields
from functools import cache
from typing import Any, Literal

from memorymark import gpus, limits
from memorymark.distributed import topology
from memorymark.units import GIB, MIB

Optimizer = Literal[
    "adamw",
    "adamw-fused",
    "adamw-forloop",
    "sgd",
    "sgd-forloop",
    "adafactor",
    "adamw-8bit",
    "paged-adamw-8bit",
    "paged-adamw-32bit",
    "lion-8bit",
    "none",
]
Mode = Literal["train", "eval"]
Loss = Literal["task", "logits-mean"]
Precision = Literal["32-true", "bf16-mixed", "16-mixed", "bf16-true"]
Attention = Literal["sdpa", "eager", "flash_attention_2"]
Kernels = Literal["none", "liger"]
# torchao's Float8 training recipes (torchao/float8/config.py `Float8LinearRecipeName`): none,
# one scale per tensor, or one per row (rowwise). memorymark/step/float8.py applies them.
Float8 = Literal["none", "tensorwise", "rowwise"]
Find = Literal["batch", "seq-len"]
BackendName = Literal["auto", "cuda", "mps", "sim", "cpu"]
StrategyName = Literal["symbolic", "fast", "linear"]
# replay: trace the model built with a few of its blocks and replay its full depth by arithmetic
# (memorymark/accounting/depth.py); trace: every block (memorymark/backends/sim.py).
DepthMode = Literal["replay", "trace"]
ProtocolName = Literal["full", "inference-style"]
# None, bitsandbytes' 4-bit NF4 or FP4, or LLM.int8(): what memorymark/step/quantization.py builds.
Quantization = Literal["none", "nf4", "fp4", "int8"]

# Activation checkpointing, as torchtitan's `activation_checkpoint` config names the modes
# (torchtitan/config/job_config.py: mode none|full|selective, selective_ac_option op|<int>): no
# checkpointing, every block, op-level selective (matmul and attention outputs kept), or every
# K-th block. memorymark/step/checkpointing.py applies them.
CHECKPOINTING_MODES: tuple[str, ...] = ("none", "full", "selective-op", "layers:K")
# A bound on K, so a pasted number stays a number: past a model's depth no block is checkpointed.
MAX_CHECKPOINT_EVERY = 1024
_CHECKPOINTING_HELP = (
    "none, full, selective-op or layers:K with K a whole number of at least 1 "
    "(layers:2 checkpoints every second block)"
)

OPTIMIZERS: tuple[str, ...] = typing.get_args(Optimizer)
MODES: tuple[str, ...] = typing.get_args(Mode)
LOSSES: tuple[str, ...] = typing.get_args(Loss)
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
ATTENTIONS: tuple[str, ...] = typing.get_args(Attention)
BACKENDS: tuple[str, ...] = typing.get_args(BackendName)
STRATEGIES: tuple[str, ...] = typing.get_args(StrategyName)
DEPTH_MODES: tuple[str, ...] = typing.get_args(DepthMode)
PROTOCOLS: tuple[str, ...] = typing.get_args(ProtocolName)
KERNELS: tuple[str, ...] = typing.get_args(Kernels)
FINDS: tuple[str, ...] = typing.get_args(Find)
QUANTIZATIONS: tuple[str, ...] = typing.get_args(Quantization)
FLOAT8_RECIPES: tuple[str, ...] = typing.get_args(Float8)
PAGED_OPTIMIZERS = ("paged-adamw-8bit", "paged-adamw-32bit")
"""bitsandbytes' paged optimizers: state in CUDA unified memory (memorymark/step/paging.py)."""

# Hugging Face Trainer's `optim` values (transformers' OptimizerNames) for the same optimizers:
# accepted as input. The for-loop variants have no Trainer name, and Trainer's "sgd" has no
# momentum, so the HF snippet hands Trainer those three built (see snippets.py).
HF_OPTIM_NAMES = {
    "adamw": "adamw_torch",
    "adamw-fused": "adamw_torch_fused",
    "sgd": "sgd",
    "adafactor": "adafactor",
    "adamw-8bit": "adamw_bnb_8bit",
    "paged-adamw-8bit": "paged_adamw_8bit",
    "paged-adamw-32bit": "paged_adamw_32bit",
    "lion-8bit": "lion_8bit",
}
# More Trainer names for the same bitsandbytes optimizers (transformers' OptimizerNames).
_MORE_HF_ALIASES = {"adamw_8bit": "adamw-8bit", "adamw_torch_8bit": "adamw-8bit"}
OPTIMIZER_ALIASES = {hf: ours for ours, hf in HF_OPTIM_NAMES.items()} | _MORE_HF_ALIASES

# Chunks of the output layer and its loss (torchtune's num_output_chunks is 8): past a few dozen
# each chunk is a handful of tokens and nothing more is saved.
MAX_LOSS_CHUNKS = 1024

# The largest batch any sweep tries: past it a "fits" answer is capped, and says so.
DEFAULT_MAX_BATCH = 4096

# Text fields longer than this are refused: no path, module list or margin needs more.
MAX_TEXT_CHARS = 4096

# (field, low, high, why high): every bounded number, checked the same way in each section.
_BATCH_WHY = "256x the default largest batch"
RANGES = {
    "seq_len": (1, limits.MAX_SEQ_LEN, "8x the longest context in the catalog"),
    "image_size": (8, limits.MAX_IMAGE_SIZE, "36x ImageNet's 224 pixels"),
    "lora_rank": (0, limits.MAX_LORA_RANK, "4x the widest open model's hidden size"),
    "grad_accum": (1, limits.MAX_GRAD_ACCUM, "past 2 micro-batches the peak no longer grows"),
    "eval_batch": (1, limits.MAX_BATCH, _BATCH_WHY),
    "eval_accumulation": (1, limits.MAX_EVAL_ACCUMULATION, "one forward pass each, every probe"),
    "gpu_memory_gib": (1, gpus.MAX_CUSTOM_GIB, "the largest custom GPU"),
    "step": (1, limits.MAX_BATCH, _BATCH_WHY),
    "current_batch": (1, limits.MAX_BATCH, _BATCH_WHY),
    "max_batch": (1, limits.MAX_BATCH, _BATCH_WHY),
    "target_batch": (1, limits.MAX_BATCH, _BATCH_WHY),
    "time_limit_seconds": (1, limits.MAX_TIME_LIMIT_SECONDS, "a day"),
    "max_probes": (1, limits.MAX_PROBES, "far past any useful search"),
    "ways_out_time_limit_seconds": (1, limits.MAX_TIME_LIMIT_SECONDS, "a day"),
    "loss_chunks": (0, MAX_LOSS_CHUNKS, "past a few dozen chunks nothing more is saved"),
    "seq_step": (1, limits.MAX_SEQ_LEN, "8x the longest context in the catalog"),
    "nodes": (1, topology.MAX_NODES, "one GPU a node at the most GPUs searched"),
    # torch._functorch.config.activation_memory_budget: a fraction of the activations' memory.
    "activation_memory_budget": (0, 1, "a fraction: 1 saves as the default partitioner does"),
}


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)} (got {limits.shown(value)})")


def validate(obj: Any) -> None:
    """Check every field's type, choice and range in one line each (a JSON dict or a URL can
    hold anything): the shared part of each section's `__post_init__`."""
    cls: type = type(obj)
    hints = field_types(cls)
    for f in fields(obj):
        value, kind = getattr(obj, f.name), hints[f.name]
        if typing.get_origin(kind) is Literal:
            check_choice(f.name, value, typing.get_args(kind))  # a non-str is never a member
            continue
        args = typing.get_args(kind)
        if value is None and type(None) in args:
            continue
        base = next((a for a in args if a is not type(None)), kind)
        if typing.get_origin(base) is Literal:
            check_choice(f.name, value, typing.get_args(base))  # a non-str is never a member
            continue
        ok = isinstance(value, base) and not (base is not bool and isinstance(value, bool))
        if base is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            raise ValueError(f"{f.name} must be a {base.__name__} (got {limits.shown(value)})")
        if base is str and len(value) > MAX_TEXT_CHARS:
            raise ValueError(f"{f.name} must be at most {MAX_TEXT_CHARS} characters")
        if f.name in RANGES:
            low, high, why = RANGES[f.name]
            limits.check_range(f.name, value, low, high, why)


def checkpointing_mode(value: object) -> str:
    """`value` as the `checkpointing` setting stores it ("off" reads as "none"), or a one-line
    ValueError that lists the modes."""
    text = value.strip().lower() if isinstance(value, str) else None
    if text == "off":
        return "none"
    if text in ("none", "full", "selective-op"):
        return text
    if text is not None and text.startswith("layers:"):
        every = text.removeprefix("layers:").strip()
        if every.isdigit() and 1 <= int(every) <= MAX_CHECKPOINT_EVERY:
            return f"layers:{int(every)}"
    raise ValueError(f"checkpointing must be {_CHECKPOINTING_HELP} (got {limits.shown(value)})")


@cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved type of each field of a settings dataclass (its annotations are strings)."""
    return typing.get_type_hints(cls)


_UNITS = {"b": 1, "kib": 2**10, "mib": MIB, "gib": GIB, "kb": 10**3, "mb": 10**6, "gb": 10**9}


# A margin written as a size is at most the largest custom GPU (2048 GiB).
MAX_MARGIN_BYTES = int(gpus.MAX_CUSTOM_GIB * GIB)


def parse_margin(text: str, usable_bytes: int) -> int:
    """Bytes of a margin written as a percentage of `usable_bytes` or as a size with a unit."""
    raw = text.strip().lower().replace(" ", "")
    try:
        if raw.endswith("%"):
            percent = float(raw[:-1])
            if not 0 <= percent < 50:  # False for nan
                raise ValueError
            return int(usable_bytes * percent / 100)
        number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = raw[len(number) :] or "b"
        value = float(number) * _UNITS[unit]
        if not 0 <= value <= MAX_MARGIN_BYTES:  # False for nan and inf ("1e400GiB")
            raise ValueError
        return int(value)
    except (ValueError, KeyError):
        raise ValueError(
            f'margin must be a percentage below 50 ("2%") or a size up to '
            f'{gpus.MAX_CUSTOM_GIB:g} GiB ("512MiB", "1GiB"); got {limits.shown(text)}'
        ) from None
