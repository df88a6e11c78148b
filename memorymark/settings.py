"""Everything a user can choose, validated once, in two frozen dataclasses.

`Settings` says what is trained, how, on which GPU and how the batch sizes are searched;
`Costs` holds the price inputs that only the report uses (so a price slider never re-runs a sweep).
Both round-trip to JSON-able dicts and to URL query parameters. This module knows the names of the
built-in models (to validate them) but never builds one, and never imports torch.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from memorymark import distribution, gpus, limits, models

OPTIMIZERS = ("adamw", "adamw-fused", "adamw-forloop", "sgd", "sgd-forloop", "adafactor", "none")
# Hugging Face Trainer's `optim` values (transformers' OptimizerNames) for the same optimizers:
# accepted as input. The for-loop variants have no Trainer name, and Trainer's "sgd" has no
# momentum, so the HF snippet hands Trainer those three built (see snippets.py).
HF_OPTIM_NAMES = {
    "adamw": "adamw_torch",
    "adamw-fused": "adamw_torch_fused",
    "sgd": "sgd",
    "adafactor": "adafactor",
}
_OPTIMIZER_ALIASES = {hf: ours for ours, hf in HF_OPTIM_NAMES.items()}
MODES = ("train", "eval")
LOSSES = ("task", "logits-mean")
BACKENDS = ("auto", "cuda", "mps", "sim", "cpu")
STRATEGIES = ("fast", "linear")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true")
ATTENTIONS = ("sdpa", "eager")
PROTOCOLS = ("full", "inference-style")

# The largest batch any sweep tries: past it a "fits" answer is capped, and says so.
DEFAULT_MAX_BATCH = 4096


# Text fields longer than this are refused: no path, module list or margin needs more.
MAX_TEXT_CHARS = 4096
# (field, low, high, why high): every number a Settings holds, checked the same way.
_RANGES = (
    ("seq_len", 1, limits.MAX_SEQ_LEN, "8x the longest context in the catalog"),
    ("image_size", 8, limits.MAX_IMAGE_SIZE, "36x ImageNet's 224 pixels"),
    ("step", 1, limits.MAX_BATCH, "256x the default largest batch"),
    ("current_batch", 1, limits.MAX_BATCH, "256x the default largest batch"),
    ("max_batch", 1, limits.MAX_BATCH, "256x the default largest batch"),
    ("target_batch", 1, limits.MAX_BATCH, "256x the default largest batch"),
    ("lora_rank", 0, limits.MAX_LORA_RANK, "4x the widest open model's hidden size"),
    ("grad_accum", 1, limits.MAX_GRAD_ACCUM, "past 2 micro-batches the peak no longer grows"),
    ("gpu_memory_gib", 1, gpus.MAX_CUSTOM_GIB, "the largest custom GPU"),
    ("nodes", 1, distribution.MAX_NODES, "one GPU a node at the most GPUs searched"),
)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)} (got {limits.shown(value)})")


def _at_least(
    name: str, value: float, low: float, high: float | None = None, why: str = ""
) -> None:
    limits.check_range(name, value, low, high, why)


def _check_types(obj: Any) -> None:
    """Refuse a field of the wrong type in one line (a JSON dict can hold anything)."""
    for f in fields(obj):
        value, kind = getattr(obj, f.name), _FIELD_TYPES[type(obj)][f.name]
        args = typing.get_args(kind)
        if value is None and type(None) in args:
            continue
        base = next((a for a in args if a is not type(None)), kind)
        ok = isinstance(value, base) and not (base is not bool and isinstance(value, bool))
        if base is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            raise ValueError(f"{f.name} must be a {base.__name__} (got {limits.shown(value)})")
        if base is str and len(value) > MAX_TEXT_CHARS:
            raise ValueError(f"{f.name} must be at most {MAX_TEXT_CHARS} characters")


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """One analysis: the training step to measure, where, and how to search batch sizes."""

    model: str = "bert"
    """A key of the built-in model catalog (`memorymark models`)."""
    task: str | None = None
    """sequence-classification, causal-lm or image-classification; None: the model's default."""
    seq_len: int = 128
    """Tokens per sample, for text models."""
    image_size: int = 224
    """Height and width in pixels, for image models."""
    optimizer: str = "adamw"
    """adamw or sgd (momentum 0.9) as PyTorch runs them on CUDA by default (foreach kernels),
    adamw-fused (the fused kernel), adamw-forloop / sgd-forloop (foreach=False), adafactor, or
    none (no state, no step). Hugging Face Trainer's `optim` names (adamw_torch,
    adamw_torch_fused) are accepted and stored as ours."""
    mode: str = "train"
    """train (dropout on, batch-norm statistics updated) or eval."""
    loss: str = "task"
    """task (the model's own loss from labels) or logits-mean (what inference-style tools use)."""
    precision: str = "32-true"
    """Lightning's names: 32-true, bf16-mixed / 16-mixed (autocast; fp16 adds a GradScaler),
    bf16-true (weights and optimizer state in bf16)."""
    attention: str = "sdpa"
    """sdpa (torch's scaled_dot_product_attention, as CUDA dispatches it) or eager (matmuls)."""
    grad_checkpointing: bool = False
    """Recompute activations in backward instead of keeping them (the model's own switch)."""
    lora_rank: int = 0
    """Rank of LoRA adapters (peft); 0 trains every weight."""
    lora_targets: str = ""
    """Comma-separated module names LoRA adapts; empty takes the architecture's default."""
    grad_accum: int = 1
    """Micro-batches whose gradients accumulate before each optimizer step (the loop measured:
    N forward/backward passes, then clipping and one optimizer step)."""
    max_grad_norm: float | None = None
    """Clip the gradients' total norm to this before the optimizer step, as HF Trainer does
    (its default is 1.0); None: no clipping."""
    forward_only: bool = False
    """Run the forward pass under no_grad and nothing else (used by the backward-pass proof)."""
    gpu: str | None = None
    """A catalog GPU name or alias; None means the GPU in this machine, else an A10."""
    gpu_memory_gib: float | None = None
    """Total memory of a GPU that is not in the catalog, in GiB as PyTorch reports it."""
    backend: str = "auto"
    """auto (cuda, else mps, else sim), cuda, mps, sim (fake tensors) or cpu (real, tracked)."""
    strategy: str = "fast"
    """fast (trace, predict, verify, bisect) or linear (step, 2*step, ... until the first OOM)."""
    step: int = 8
    """Batch-size granularity of the search."""
    current_batch: int = 16
    """The batch size the user trains with today."""
    max_batch: int = DEFAULT_MAX_BATCH
    """The search never tries a larger batch."""
    target_batch: int | None = None
    """The global batch the user wants; the report plans micro-batch x accumulation for it."""
    margin: str = "2%"
    """Headroom kept free below usable memory: a percentage ("2%") or bytes ("512MiB", "1GiB"),
    because an under-prediction means a crash at step one."""
    # -- where: how many GPUs, and how the step is spread over them (memorymark/distribution.py)
    dist: str = "none"
    """none (one GPU), ddp, zero1 (DDP + ZeroRedundancyOptimizer), fsdp (FSDP2, ZeRO-3),
    fsdp-no-reshard (ZeRO-2), hsdp (shard inside a node, replicate across nodes)."""
    gpus: str = "1"
    """GPUs of the kind named, as a whole number up to 1024, or auto: the smallest count a
    cluster offers (1-8, then whole 8-GPU nodes) that trains batch 1."""
    nodes: int | None = None
    """Nodes the GPUs span; None: as few 8-GPU nodes as hold them."""
    offload: str = "none"
    """none, or cpu: FSDP2's CPUOffloadPolicy (sharded states in host memory)."""
    mp_policy: str = "auto"
    """auto: FSDP2's MixedPrecisionPolicy from the precision (bf16 compute, fp32 reduction);
    none: fp32 parameters and autocast alone."""

    def __post_init__(self) -> None:
        _check_types(self)
        for name, low, high, why in _RANGES:
            if getattr(self, name) is not None:
                _at_least(name, getattr(self, name), low, high, why)
        entry = models.find_model(self.model)
        if self.task is not None and self.task not in entry.tasks:
            raise ValueError(
                f"model {limits.shown(self.model)} supports tasks {', '.join(entry.tasks)} "
                f"(got {limits.shown(self.task)})"
            )
        if entry.max_positions is not None and self.seq_len > entry.max_positions:
            raise ValueError(
                f"seq_len {self.seq_len} exceeds {self.model}'s {entry.max_positions} positions"
            )
        if self.optimizer in _OPTIMIZER_ALIASES:
            object.__setattr__(self, "optimizer", _OPTIMIZER_ALIASES[self.optimizer])
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("mode", self.mode, MODES)
        _choice("loss", self.loss, LOSSES)
        _choice("backend", self.backend, BACKENDS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("attention", self.attention, ATTENTIONS)
        parse_margin(self.margin, 1)
        _choice("strategy", self.strategy, STRATEGIES)
        self._check_distribution()
        norm = self.max_grad_norm
        # Compared without float(): a huge int would overflow it.
        if norm is not None and not (0 < norm <= sys.float_info.max):  # False for nan
            raise ValueError(f"max_grad_norm must be a positive number (got {limits.shown(norm)})")

    def _check_distribution(self) -> None:
        _choice("dist", self.dist, distribution.DIST_STRATEGIES)
        _choice("offload", self.offload, distribution.OFFLOADS)
        _choice("mp_policy", self.mp_policy, distribution.MP_POLICIES)
        count = self.gpu_count
        if self.dist == "none" and (count is None or count > 1):
            raise ValueError(
                f"--gpus {self.gpus} needs a distributed strategy: --dist ddp, zero1, fsdp, "
                "fsdp-no-reshard or hsdp"
            )
        if self.offload != "none" and self.dist not in distribution.SHARDED:
            raise ValueError("--offload cpu is FSDP2's: use it with --dist fsdp, "
                             "fsdp-no-reshard or hsdp")  # fmt: skip
        if count is not None and self.nodes is not None:
            if self.nodes > count or count % self.nodes:
                raise ValueError(f"{count} GPUs cannot spread evenly over {self.nodes} nodes")
        if self.dist == "hsdp" and count is not None:
            nodes = distribution.nodes_for(count, self.nodes)
            if count % nodes:
                raise ValueError(f"hsdp needs the same GPUs in every node ({count} over {nodes})")

    @property
    def gpu_count(self) -> int | None:
        """The number of GPUs asked for, or None for `--gpus auto`."""
        text = self.gpus.strip().lower()
        if text == "auto":
            return None
        try:
            count = int(text)
        except ValueError:
            raise ValueError(
                f"gpus must be a whole number or auto (got {limits.shown(self.gpus)})"
            ) from None
        limits.check_range("gpus", count, 1, distribution.MAX_GPUS, "128 eight-GPU nodes")
        return count

    @property
    def node_count(self) -> int:
        """Nodes the GPUs span (a count is needed: not for `--gpus auto`)."""
        count = self.gpu_count
        if count is None:
            raise ValueError("--gpus auto has no node count until the search picks one")
        return distribution.nodes_for(count, self.nodes)

    def margin_bytes(self, usable_bytes: int) -> int:
        """The margin in bytes for a GPU with `usable_bytes` of usable memory."""
        return parse_margin(self.margin, usable_bytes)

    @property
    def resolved_task(self) -> str:
        """The task this run trains: the chosen one or the model's default."""
        return self.task or models.find_model(self.model).default_task

    @property
    def protocol(self) -> str:
        """inference-style when the step is what forward-only tools measure, else full."""
        inference = (self.mode, self.loss, self.optimizer) == ("eval", "logits-mean", "none")
        return "inference-style" if inference else "full"

    def with_protocol(self, protocol: str) -> Settings:
        """Apply a protocol shortcut: inference-style = eval + logits.mean() + no optimizer."""
        _choice("protocol", protocol, PROTOCOLS)
        if protocol == "inference-style":
            return replace(self, mode="eval", loss="logits-mean", optimizer="none")
        return replace(self, mode="train", loss="task", optimizer="adamw")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field (the inverse of `from_dict`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Settings:
        """Build from a dict such as `to_dict` writes; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown setting {unknown[0]!r}; known: {', '.join(sorted(known))}")
        return cls(**dict(data))

    def to_query(self) -> dict[str, str]:
        """URL query parameters for the fields that differ from the defaults."""
        return _to_query(self, Settings())

    def to_command_line(self) -> str:
        """The `memorymark analyze` command that runs these settings: every field that differs
        from the defaults, as the flags the CLI reads back into the same Settings."""
        words = ["memorymark", "analyze", shlex.quote(self.model)]
        for name, value in self.to_query().items():
            if name == "model":
                continue
            flag = _FLAG_NAMES.get(name, "--" + name.replace("_", "-"))
            if value == "true":  # an on/off flag
                words.append(flag)
            elif value != "false":
                words += [flag, shlex.quote(value)]
        return " ".join(words)

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> Settings:
        """Parse URL query parameters (strings); unknown keys are ignored, bad values raise."""
        return cls(**_parse_query(cls, params))


_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


# A margin written as a size is at most the largest custom GPU (2048 GiB).
MAX_MARGIN_BYTES = int(gpus.MAX_CUSTOM_GIB * 2**30)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Costs:
    """What a training run costs: the report's inputs, never the sweep's."""

    usd_per_hour: float | None = None
    """Price of one GPU-hour; None takes the GPU catalog's default."""
    hours_per_run: float = 2.0
    """Wall-clock hours of one training run at the current batch size."""
    runs_per_year: float = 100.0
    """Training runs per year."""

    def __post_init__(self) -> None:
        _check_types(self)
        if self.usd_per_hour is not None:
            _at_least("usd_per_hour", self.usd_per_hour, 0, limits.MAX_USD_PER_HOUR, "over 100x "
                      "the dearest catalog GPU")  # fmt: skip
        _at_least("hours_per_run", self.hours_per_run, 0, limits.MAX_HOURS_PER_RUN, "a leap year")
        _at_least("runs_per_year", self.runs_per_year, 0, limits.MAX_RUNS_PER_YEAR,
                  "one every five minutes")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field."""
        return dataclasses.asdict(self)

    def to_query(self) -> dict[str, str]:
        """URL query parameters for the fields that differ from the defaults."""
        return _to_query(self, Costs())

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> Costs:
        """Parse URL query parameters (strings); unknown keys are ignored, bad values raise."""
        return cls(**_parse_query(cls, params))


# Fields whose CLI flag is not the field's name with dashes (memorymark/cli.py).
_FLAG_NAMES = {"gpu_memory_gib": "--gpu-memory"}


def _to_query(obj: Any, default: Any) -> dict[str, str]:
    out = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value != getattr(default, f.name):
            out[f.name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _parse_query(cls: type, params: Mapping[str, str]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    parsed: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in params:
            continue
        raw = str(params[f.name])
        kind = hints[f.name]
        try:
            parsed[f.name] = _parse_value(raw, kind)
        except ValueError:
            raise ValueError(f"bad value for {f.name}: {limits.shown(raw)}") from None
    return parsed


def _parse_value(raw: str, kind: Any) -> Any:
    args = typing.get_args(kind)
    if args and type(None) in args:
        if raw in ("", "None", "none", "null"):
            return None
        kind = next(a for a in args if a is not type(None))
    if kind is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(raw)
        return raw.lower() in ("true", "1")
    if kind is int:
        return int(raw)
    if kind is float:
        return float(raw)
    return raw


_FIELD_TYPES = {cls: typing.get_type_hints(cls) for cls in (Settings, Costs)}
