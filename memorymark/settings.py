"""Everything a user can choose, in sections that each validate themselves and do no I/O.

`Settings` is three sections: `Workload` (what is trained and how the step runs), `Hardware`
(where: the GPU kind and the backend that measures or simulates it) and `Search` (how batch sizes
are searched and what the answer is compared with). `Costs` holds the price inputs that only the
report uses, so a price slider never re-runs a sweep. New settings go in the section they belong
to: quantization in `Workload`, GPU count and distribution in `Hardware`, limits in `Search`.

Every field also has one flat name (`settings.optimizer` reads `settings.workload.optimizer`): the
CLI flags, URL query parameters and JSON use those names, and round-trip exactly. This module
knows the built-in models' names only through `models.find_model`; it never builds one and never
imports torch.
"""

from __future__ import annotations

import dataclasses
import operator
import shlex
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from memorymark import distribution, gpus, limits, models

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
Find = Literal["batch", "seq-len"]
Backend = Literal["auto", "cuda", "mps", "sim", "cpu"]
Strategy = Literal["fast", "linear"]
Protocol = Literal["full", "inference-style"]
# memorymark/quantization.py METHODS, repeated here: settings never import bitsandbytes or torch.
Quantization = Literal["none", "nf4", "fp4", "int8"]

OPTIMIZERS: tuple[str, ...] = typing.get_args(Optimizer)
MODES: tuple[str, ...] = typing.get_args(Mode)
LOSSES: tuple[str, ...] = typing.get_args(Loss)
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
ATTENTIONS: tuple[str, ...] = typing.get_args(Attention)
BACKENDS: tuple[str, ...] = typing.get_args(Backend)
STRATEGIES: tuple[str, ...] = typing.get_args(Strategy)
PROTOCOLS: tuple[str, ...] = typing.get_args(Protocol)
KERNELS: tuple[str, ...] = typing.get_args(Kernels)
FINDS: tuple[str, ...] = typing.get_args(Find)
QUANTIZATIONS: tuple[str, ...] = typing.get_args(Quantization)
PAGED_OPTIMIZERS = ("paged-adamw-8bit", "paged-adamw-32bit")
"""bitsandbytes' paged optimizers: state in CUDA unified memory (memorymark/paging.py)."""

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
_OPTIMIZER_ALIASES = {hf: ours for ours, hf in HF_OPTIM_NAMES.items()} | _MORE_HF_ALIASES

# Chunks of the output layer and its loss (torchtune's num_output_chunks is 8): past a few dozen
# each chunk is a handful of tokens and nothing more is saved.
MAX_LOSS_CHUNKS = 1024

# The largest batch any sweep tries: past it a "fits" answer is capped, and says so.
DEFAULT_MAX_BATCH = 4096

# Text fields longer than this are refused: no path, module list or margin needs more.
MAX_TEXT_CHARS = 4096

# (field, low, high, why high): every bounded number, checked the same way in each section.
_BATCH_WHY = "256x the default largest batch"
_RANGES = {
    "seq_len": (1, limits.MAX_SEQ_LEN, "8x the longest context in the catalog"),
    "image_size": (8, limits.MAX_IMAGE_SIZE, "36x ImageNet's 224 pixels"),
    "lora_rank": (0, limits.MAX_LORA_RANK, "4x the widest open model's hidden size"),
    "grad_accum": (1, limits.MAX_GRAD_ACCUM, "past 2 micro-batches the peak no longer grows"),
    "gpu_memory_gib": (1, gpus.MAX_CUSTOM_GIB, "the largest custom GPU"),
    "step": (1, limits.MAX_BATCH, _BATCH_WHY),
    "current_batch": (1, limits.MAX_BATCH, _BATCH_WHY),
    "max_batch": (1, limits.MAX_BATCH, _BATCH_WHY),
    "target_batch": (1, limits.MAX_BATCH, _BATCH_WHY),
    "time_limit_seconds": (1, limits.MAX_TIME_LIMIT_SECONDS, "a day"),
    "max_probes": (1, limits.MAX_PROBES, "far past any useful search"),
    "loss_chunks": (0, MAX_LOSS_CHUNKS, "past a few dozen chunks nothing more is saved"),
    "seq_step": (1, limits.MAX_SEQ_LEN, "8x the longest context in the catalog"),
    "nodes": (1, distribution.MAX_NODES, "one GPU a node at the most GPUs searched"),
}


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)} (got {limits.shown(value)})")


def _validate(obj: Any) -> None:
    """Check every field's type, choice and range in one line each (a JSON dict or a URL can
    hold anything): the shared part of each section's `__post_init__`."""
    hints = _FIELD_TYPES[type(obj)]
    for f in fields(obj):
        value, kind = getattr(obj, f.name), hints[f.name]
        if typing.get_origin(kind) is Literal:
            _choice(f.name, value, typing.get_args(kind))  # a non-str is never a member
            continue
        args = typing.get_args(kind)
        if value is None and type(None) in args:
            continue
        base = next((a for a in args if a is not type(None)), kind)
        if typing.get_origin(base) is Literal:
            _choice(f.name, value, typing.get_args(base))  # a non-str is never a member
            continue
        ok = isinstance(value, base) and not (base is not bool and isinstance(value, bool))
        if base is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            raise ValueError(f"{f.name} must be a {base.__name__} (got {limits.shown(value)})")
        if base is str and len(value) > MAX_TEXT_CHARS:
            raise ValueError(f"{f.name} must be at most {MAX_TEXT_CHARS} characters")
        if f.name in _RANGES:
            low, high, why = _RANGES[f.name]
            limits.check_range(f.name, value, low, high, why)


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What is trained: the model, its inputs, precision, optimizer, adapters and the loop."""

    model: str = "bert"
    """A key of the built-in model catalog (`memorymark models`)."""
    task: str | None = None
    """sequence-classification, causal-lm or image-classification; None: the model's default."""
    seq_len: int = 128
    """Tokens per sample, for text models."""
    image_size: int = 224
    """Height and width in pixels, for image models."""
    optimizer: Optimizer = "adamw"
    """adamw or sgd (momentum 0.9) as PyTorch runs them on CUDA by default (foreach kernels),
    adamw-fused (the fused kernel), adamw-forloop / sgd-forloop (foreach=False), adafactor,
    bitsandbytes' adamw-8bit, paged-adamw-8bit, paged-adamw-32bit and lion-8bit, or none (no
    state, no step). Hugging Face Trainer's `optim` names (adamw_torch, adamw_torch_fused,
    adamw_bnb_8bit, paged_adamw_8bit, paged_adamw_32bit, lion_8bit) are accepted and stored
    as ours."""
    mode: Mode = "train"
    """train (dropout on, batch-norm statistics updated) or eval."""
    loss: Loss = "task"
    """task (the model's own loss from labels) or logits-mean (what inference-style tools use)."""
    precision: Precision = "32-true"
    """Lightning's names: 32-true, bf16-mixed / 16-mixed (autocast; fp16 adds a GradScaler),
    bf16-true (weights and optimizer state in bf16)."""
    attention: Attention = "sdpa"
    """sdpa (torch's scaled_dot_product_attention, as CUDA dispatches it), eager (matmuls) or
    flash_attention_2 (the flash-attn package, Ampere or newer, fp16/bf16 only)."""
    grad_checkpointing: bool = False
    """Recompute activations in backward instead of keeping them (the model's own switch)."""
    lora_rank: int = 0
    """Rank of LoRA adapters (peft); 0 trains every weight."""
    lora_targets: str = ""
    """Comma-separated module names LoRA adapts; empty takes the architecture's default."""
    quantization: Quantization = "none"
    """Base weights as bitsandbytes stores them: none, nf4 or fp4 (4-bit, QLoRA), or int8
    (LLM.int8()). Needs LoRA to train (the quantized weights are frozen)."""
    double_quant: bool = False
    """4-bit only: quantize the absmax statistics too (bnb_4bit_use_double_quant)."""
    grad_accum: int = 1
    """Micro-batches whose gradients accumulate before each optimizer step (the loop measured:
    N forward/backward passes, then clipping and one optimizer step)."""
    max_grad_norm: float | None = None
    """Clip the gradients' total norm to this before the optimizer step, as HF Trainer does
    (its default is 1.0); None: no clipping."""
    kernels: Kernels = "none"
    """none, or liger: Liger's Triton kernels (RMSNorm, SwiGLU, RoPE, fused linear
    cross-entropy), as `use_liger_kernel=True` applies them; causal LMs only."""
    loss_chunks: int = 0
    """Output layer and cross-entropy in this many sequence chunks, each upcast to fp32 alone
    (torchtune's CEWithChunkedOutputLoss); 0: transformers' one loss over all the logits."""
    forward_only: bool = False
    """Run the forward pass under no_grad and nothing else (used by the backward-pass proof)."""

    def __post_init__(self) -> None:
        if self.optimizer in _OPTIMIZER_ALIASES:
            object.__setattr__(self, "optimizer", _OPTIMIZER_ALIASES[self.optimizer])
        _validate(self)
        # No I/O here: a `file:` or `hf:` model is read, and what depends on it checked, where
        # it is resolved (`check_model`, which the engine's Session calls). A catalog model's
        # entry is in memory, so its checks come at once.
        source = models.check_model_spec(self.model)
        norm = self.max_grad_norm
        # Compared without float(): a huge int would overflow it.
        if norm is not None and not (0 < norm <= sys.float_info.max):  # False for nan
            raise ValueError(f"max_grad_norm must be a positive number (got {limits.shown(norm)})")
        _check_quantization(self, source)
        _check_kernels(self)
        if source == "catalog":
            _check_model_entry(self, models.find_model(self.model))


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """Where it trains: the GPU kind, how many and how the step is spread over them, and the
    backend that measures or simulates it."""

    gpu: str | None = None
    """A catalog GPU name or alias; None means the GPU in this machine, else an A10."""
    gpu_memory_gib: float | None = None
    """Total memory of a GPU that is not in the catalog, in GiB as PyTorch reports it."""
    backend: Backend = "auto"
    """auto (cuda, else mps, else sim), cuda, mps, sim (fake tensors) or cpu (real, tracked)."""

    # How many GPUs, and how the step is spread over them: the choices are
    # memorymark/distribution.py's.
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
        _validate(self)
        self._check_distribution()

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Search:
    """How batch sizes are searched, and the batches the answer is compared with."""

    strategy: Strategy = "fast"
    """fast (trace, predict, verify, bisect) or linear (step, 2*step, ... until the first OOM)."""
    step: int = 8
    """Batch-size granularity of the search."""
    current_batch: int = 16
    """The batch size the user trains with today."""
    find: Find = "batch"
    """batch (the largest batch at seq_len) or seq-len (the longest sequence at current_batch)."""
    seq_step: int = 1024
    """Granularity, in tokens, of a sequence-length search (shorter below the first step)."""
    max_batch: int = DEFAULT_MAX_BATCH
    """The search never tries a larger batch."""
    target_batch: int | None = None
    """The global batch the user wants; the report plans micro-batch x accumulation for it."""
    margin: str = "2%"
    """Headroom kept free below usable memory: a percentage ("2%") or bytes ("512MiB", "1GiB"),
    because an under-prediction means a crash at step one."""
    time_limit_seconds: float | None = None
    """Wall time the sweep may take; it stops before a probe that would pass it. None: no limit.
    A model whose estimated sweep cannot fit in it is refused before the first probe."""
    max_probes: int | None = None
    """Training steps the sweep may measure; None: as many as the strategy needs."""

    def __post_init__(self) -> None:
        _validate(self)
        parse_margin(self.margin, 1)


SECTIONS: dict[str, type] = {"workload": Workload, "hardware": Hardware, "search": Search}
# Each flat name and the section that holds it, in the order the sections list them.
_SECTION_OF = {f.name: name for name, cls in SECTIONS.items() for f in fields(cls)}
FIELD_NAMES: tuple[str, ...] = tuple(_SECTION_OF)


@dataclass(frozen=True, slots=True, init=False)
class Settings:
    """One analysis: the training step to measure, where, and how to search batch sizes.

    Build it from flat names, sections, or both (flat names override the sections given):

    >>> s = Settings(model="gpt2", gpu="a10", precision="bf16-mixed")
    >>> s.workload.precision, s.precision, s.hardware.gpu
    ('bf16-mixed', 'bf16-mixed', 'a10')
    """

    workload: Workload
    hardware: Hardware
    search: Search

    def __init__(
        self,
        *,
        workload: Workload | None = None,
        hardware: Hardware | None = None,
        search: Search | None = None,
        **flat: Any,
    ) -> None:
        unknown = sorted(set(flat) - set(_SECTION_OF))
        if unknown:
            raise TypeError(f"Settings() got an unexpected keyword argument {unknown[0]!r}")
        given = {"workload": workload, "hardware": hardware, "search": search}
        for name, cls in SECTIONS.items():
            mine = {k: v for k, v in flat.items() if _SECTION_OF[k] == name}
            section = given[name]
            if section is None:
                section = cls(**mine)
            elif not isinstance(section, cls):
                raise ValueError(f"{name} must be a {cls.__name__} (got {limits.shown(section)})")
            elif mine:
                section = replace(section, **mine)
            object.__setattr__(self, name, section)
        _check_across(self)

    @property
    def paged_optimizer(self) -> bool:
        """True when the optimizer keeps its state in CUDA unified memory (bitsandbytes' paged)."""
        return self.optimizer in PAGED_OPTIMIZERS

    @property
    def gpu_count(self) -> int | None:
        """The number of GPUs asked for, or None for `--gpus auto`."""
        return self.hardware.gpu_count

    @property
    def node_count(self) -> int:
        """Nodes the GPUs span (a count is needed: not for `--gpus auto`)."""
        return self.hardware.node_count

    def margin_bytes(self, usable_bytes: int) -> int:
        """The margin in bytes for a GPU with `usable_bytes` of usable memory."""
        return parse_margin(self.search.margin, usable_bytes)

    @property
    def resolved_task(self) -> str:
        """The task this run trains: the chosen one or the model's default."""
        return self.workload.task or models.find_model(self.workload.model).default_task

    @property
    def protocol(self) -> str:
        """inference-style when the step is what forward-only tools measure, else full."""
        w = self.workload
        inference = (w.mode, w.loss, w.optimizer) == ("eval", "logits-mean", "none")
        return "inference-style" if inference else "full"

    def with_protocol(self, protocol: str) -> Settings:
        """Apply a protocol shortcut: inference-style = eval + logits.mean() + no optimizer."""
        _choice("protocol", protocol, PROTOCOLS)
        if protocol == "inference-style":
            return replace(self, mode="eval", loss="logits-mean", optimizer="none")
        return replace(self, mode="train", loss="task", optimizer="adamw")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field by its flat name (the inverse of `from_dict`)."""
        return {name: getattr(getattr(self, s), name) for name, s in _SECTION_OF.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Settings:
        """Build from a dict such as `to_dict` writes; unknown keys are an error."""
        unknown = sorted(set(data) - set(_SECTION_OF))
        if unknown:
            known = ", ".join(sorted(_SECTION_OF))
            raise ValueError(f"unknown setting {limits.shown(unknown[0])}; known: {known}")
        return cls(**dict(data))

    def to_query(self) -> dict[str, str]:
        """URL query parameters for the fields that differ from the defaults."""
        return _to_query(self.to_dict(), Settings().to_dict())

    def to_command_line(self) -> str:
        """The `memorymark analyze` command that runs these settings: every field that differs
        from the defaults, as the flags the CLI reads back into the same Settings."""
        words = ["memorymark", "analyze", shlex.quote(self.workload.model)]
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
        return cls(**_parse_query(_FLAT_TYPES, params))

    # Read-only flat views of the sections' fields (`settings.optimizer`), added below.
    if typing.TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...


# One flat name per setting, read from its section: the names the CLI, URL and JSON use, so
# code that only reads a setting need not know which section holds it.
for _name, _section in _SECTION_OF.items():
    setattr(Settings, _name, property(operator.attrgetter(f"{_section}.{_name}")))


def _check_kernels(w: Workload) -> None:
    """The kernel and loss choices that need a particular precision or each other."""
    if w.attention == "flash_attention_2" and w.precision == "32-true":
        raise ValueError(
            "flash_attention_2 runs in fp16 or bf16 only: choose precision bf16-mixed, "
            "16-mixed or bf16-true"
        )
    if w.kernels == "liger" and w.loss_chunks:
        raise ValueError("liger's fused cross-entropy already chunks the loss: drop loss_chunks")


def _check_model_entry(w: Workload, entry: models.ModelEntry) -> None:
    """What the resolved model decides: its tasks, its positions, the fused losses' causal LM."""
    models.check_task_and_length(entry, w.task, w.seq_len, w.model)
    fused = w.kernels == "liger" or w.loss_chunks
    if fused and (w.task or entry.default_task) != models.CAUSAL_LM:
        raise ValueError("liger kernels and loss_chunks train causal LMs (task causal-lm)")


def _check_search_axis(s: Settings, entry: models.ModelEntry) -> None:
    if s.search.find == "seq-len" and entry.input_kind != "text":
        raise ValueError("find seq-len searches a text model's sequence length")


def _check_across(s: Settings) -> None:
    """The choices that involve two sections: each section has validated itself already."""
    w = s.workload
    cuda_only = (w.attention == "flash_attention_2", w.kernels == "liger")
    if any(cuda_only) and s.hardware.backend == "cpu":
        name = "flash_attention_2" if cuda_only[0] else "liger"
        raise ValueError(f"{name} runs CUDA kernels only: use --backend sim (or a GPU)")
    if ":" not in w.model:  # a catalog entry is in memory; other models in check_model
        _check_search_axis(s, models.find_model(w.model))


def _check_quantization(s: Workload, source: str) -> None:
    if s.double_quant and s.quantization not in ("nf4", "fp4"):
        raise ValueError("double_quant needs 4-bit quantization (--quantization nf4 or fp4)")
    if s.quantization == "none":
        return
    if source in ("timm", "torchvision"):
        raise ValueError(f"quantization needs a transformers model (got {s.model})")
    if s.lora_rank == 0 and not s.forward_only:
        raise ValueError(
            f"quantized weights ({s.quantization}) are frozen: training them needs LoRA "
            "(--lora-rank 16, as QLoRA does)"
        )


def check_model(settings: Settings) -> None:
    """Resolve the model `settings` name (a `file:` spec reads its config, `hf:` the hub) and
    refuse a task it does not train, a seq_len past its positions, a fused loss for a model
    that is not a causal LM, or a sequence search of an image model (one-line ValueErrors)."""
    entry = models.find_model(settings.model)
    _check_model_entry(settings.workload, entry)
    _check_search_axis(settings, entry)


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
        _validate(self)
        if self.usd_per_hour is not None:
            limits.check_range("usd_per_hour", self.usd_per_hour, 0, limits.MAX_USD_PER_HOUR,
                               "over 100x the dearest catalog GPU")  # fmt: skip
        limits.check_range("hours_per_run", self.hours_per_run, 0, limits.MAX_HOURS_PER_RUN,
                           "a leap year")  # fmt: skip
        limits.check_range("runs_per_year", self.runs_per_year, 0, limits.MAX_RUNS_PER_YEAR,
                           "one every five minutes")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field."""
        return dataclasses.asdict(self)

    def to_query(self) -> dict[str, str]:
        """URL query parameters for the fields that differ from the defaults."""
        return _to_query(self.to_dict(), Costs().to_dict())

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> Costs:
        """Parse URL query parameters (strings); unknown keys are ignored, bad values raise."""
        return cls(**_parse_query(_FIELD_TYPES[Costs], params))


COST_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Costs))

# Fields whose CLI flag is not the field's name with dashes (memorymark/cli.py).
_FLAG_NAMES = {"gpu_memory_gib": "--gpu-memory", "time_limit_seconds": "--time-limit"}


def _to_query(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, value in values.items():
        if value != defaults[name]:
            out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _parse_query(types: Mapping[str, Any], params: Mapping[str, str]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for name, kind in types.items():
        if name not in params:
            continue
        raw = str(params[name])
        try:
            parsed[name] = _parse_value(raw, kind)
        except ValueError:
            raise ValueError(f"bad value for {name}: {limits.shown(raw)}") from None
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
    return raw  # str, and a Literal's choices (validated by the section)


_FIELD_TYPES = {cls: typing.get_type_hints(cls) for cls in (*SECTIONS.values(), Costs)}
_FLAT_TYPES = {name: _FIELD_TYPES[SECTIONS[s]][name] for name, s in _SECTION_OF.items()}
