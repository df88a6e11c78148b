"""Everything a user can choose, in sections that each validate themselves and do no I/O.

`Settings` is three sections: `Workload` (what is trained and how the step runs), `Hardware`
(where: the GPU kind and the backend that measures or simulates it) and `Search` (how batch sizes
are searched and what the answer is compared with). `Costs` holds the price inputs that only the
report uses, so a price slider never re-runs a sweep. New settings go in the section they belong
to: quantization in `Workload`, GPU count and distribution in `Hardware`, limits in `Search`.

Code reads a setting by its section (`settings.workload.optimizer`), as torchtitan's trainer reads
`config.training.steps`. Each field also has one flat name (`optimizer`), for the interfaces
whose form is flat: the CLI flags, URL query parameters and JSON use those names and round-trip
exactly, and `Settings(...)` and `Settings.replace(...)` take them. The string
under each field is that setting's help, written for users: the CLI's --help and the app's
tooltips read it (`field_docs`), so a setting is documented here and only here. This module
knows the built-in models' names only through `models.find_model`; it never builds one and never
imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from functools import cache
from typing import Any

from memorymark import gpus, limits, models
from memorymark.distributed import layout, topology
from memorymark.settings import codecs
from memorymark.settings.choices import (
    DEFAULT_MAX_BATCH,
    OPTIMIZER_ALIASES,
    PAGED_OPTIMIZERS,
    PROTOCOLS,
    Attention,
    BackendName,
    DepthMode,
    Find,
    Float8,
    Kernels,
    Loss,
    Mode,
    Optimizer,
    Precision,
    Quantization,
    StrategyName,
    check_choice,
    checkpointing_mode,
    field_types,
    parse_margin,
    validate,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What is trained: the model, its inputs, precision, optimizer, adapters and the loop."""

    model: str = "bert"
    """A key of the built-in model catalog (`memorymark models`), or file:PATH (a transformers
    config.json), hf:ORG/NAME, timm:NAME or torchvision:NAME."""
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
    tf32: bool = False
    """fp32 matmuls on TF32 tensor cores (Ampere and newer), as a script that sets
    torch.backends.cuda.matmul.allow_tf32 = True (or torch.set_float32_matmul_precision("high"),
    or Trainer's tf32=True) runs them; PyTorch leaves it off by default since 1.12. Changes the
    speed only (estimated from the GPU's TF32 rate when simulated), not the memory."""
    attention: Attention = "sdpa"
    """sdpa (torch's scaled_dot_product_attention, as CUDA dispatches it), eager (matmuls) or
    flash_attention_2 (the flash-attn package, Ampere or newer, fp16/bf16 only)."""
    checkpointing: str = "none"
    """Activation checkpointing: recompute in backward what the forward did not keep. none;
    full (every block, the model's own switch; --grad-checkpointing is the same); selective-op
    (every block, keeping the matmul and attention outputs and recomputing the rest, as
    torchtitan's selective op mode); layers:K (every K-th block in full: blocks K, 2K, ...,
    as torchtitan's selective layer mode counts them)."""
    lora_rank: int = 0
    """Rank of LoRA adapters (peft); 0 trains every weight."""
    lora_targets: str = ""
    """Comma-separated module names LoRA adapts (e.g. q_proj,v_proj); empty takes the
    architecture's default."""
    quantization: Quantization = "none"
    """Base weights as bitsandbytes stores them: none, nf4 or fp4 (4-bit, QLoRA), or int8
    (LLM.int8()). Needs LoRA to train (the quantized weights are frozen)."""
    double_quant: bool = False
    """4-bit only: quantize the absmax statistics too (bnb_4bit_use_double_quant), about 0.37
    bits per weight saved."""
    grad_accum: int = 1
    """Micro-batches whose gradients accumulate before each optimizer step (the loop measured:
    N forward/backward passes, then clipping and one optimizer step)."""
    max_grad_norm: float | None = None
    """Clip the gradients' total norm to this before the optimizer step, as HF Trainer does
    (its default is 1.0); None: no clipping."""
    eval_batch: int | None = None
    """Also run HF Trainer's evaluation pass between training steps, at this eval batch
    (per_device_eval_batch_size): model.eval(), no_grad, forward with labels, the predictions
    kept on the GPU beside the weights and optimizer state. The loop must fit with it; the
    report adds the largest eval batch that fits. None: no evaluation pass."""
    eval_accumulation: int | None = None
    """Trainer's eval_accumulation_steps: eval batches whose predictions (logits, labels, loss)
    stay on the GPU, concatenated batch after batch, before they move to the CPU. None with
    an eval batch: one batch is measured, as eval_accumulation_steps=1 keeps it; left unset,
    Trainer keeps every batch's predictions on the GPU until the eval set ends, which no
    batch size bounds (the hf snippet sets what was measured)."""
    kernels: Kernels = "none"
    """none, or liger: Liger's Triton kernels (RMSNorm, SwiGLU, RoPE, and a fused linear
    cross-entropy that never holds the whole logits), as `use_liger_kernel=True` applies them;
    causal LMs only."""
    loss_chunks: int = 0
    """Output layer and cross-entropy in this many sequence chunks, each upcast to fp32 alone
    (torchtune's CEWithChunkedOutputLoss); 0: transformers' one loss over all the logits."""
    compile: bool = False
    """torch.compile the model: each transformer block in place, as torchtitan's apply_compile
    (the whole model where it has no blocks). Simulated through Dynamo and AOTAutograd with
    Inductor's partitioner on fake tensors, fused pointwise intermediates not allocated
    (memorymark/step/compiled.py); on a GPU, Inductor itself."""
    activation_memory_budget: float = 1.0
    """With --compile: torch._functorch.config.activation_memory_budget, the fraction of the
    activations' memory the partitioner may save for backward (it recomputes the rest); 1.0
    is PyTorch's default."""
    float8: Float8 = "none"
    """Float8 training of the linear layers with torchao's convert_to_float8_training: none,
    tensorwise or rowwise (its recipes). Needs a GPU with FP8 matmuls (compute capability
    8.9 or newer: Ada, Hopper, Blackwell)."""
    forward_only: bool = False
    """Run the forward pass under no_grad and nothing else (used by the backward-pass proof)."""

    def __post_init__(self) -> None:
        if self.optimizer in OPTIMIZER_ALIASES:
            object.__setattr__(self, "optimizer", OPTIMIZER_ALIASES[self.optimizer])
        validate(self)
        object.__setattr__(self, "checkpointing", checkpointing_mode(self.checkpointing))
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
        if self.eval_accumulation is not None and self.eval_batch is None:
            raise ValueError("eval_accumulation needs an evaluation pass: set --eval-batch N")
        if source == "catalog":
            _check_model_entry(self, models.find_model(self.model))

    @property
    def grad_checkpointing(self) -> bool:
        """True when any block recomputes its activations in backward (any mode but none)."""
        return self.checkpointing != "none"

    @property
    def checkpoint_every(self) -> int | None:
        """K for layers:K (every K-th block checkpointed), else None."""
        mode = self.checkpointing
        return int(mode.removeprefix("layers:")) if mode.startswith("layers:") else None

    @property
    def paged_optimizer(self) -> bool:
        """True when the optimizer keeps its state in CUDA unified memory (bitsandbytes' paged)."""
        return self.optimizer in PAGED_OPTIMIZERS

    @property
    def resolved_task(self) -> str:
        """The task this run trains: the chosen one or the model's default."""
        return self.task or models.find_model(self.model).default_task

    @property
    def eval_batches_kept(self) -> int:
        """Eval batches whose predictions are on the GPU together at the eval pass's peak
        (`eval_accumulation`, else the one batch measured); 0 with no evaluation pass."""
        if self.eval_batch is None:
            return 0
        return self.eval_accumulation or 1

    @property
    def protocol(self) -> str:
        """inference-style when the step is what forward-only tools measure, else full."""
        inference = (self.mode, self.loss, self.optimizer) == ("eval", "logits-mean", "none")
        return "inference-style" if inference else "full"


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """Where it trains: the GPU kind, how many and how the step is spread over them, and the
    backend that measures or simulates it."""

    gpu: str | None = None
    """A catalog GPU name or alias (`memorymark gpus`) to simulate or check; None: the GPU in
    this machine, else an A10."""
    gpu_memory_gib: float | None = None
    """Total memory of a GPU that is not in the catalog, in GiB as PyTorch reports it."""
    backend: BackendName = "auto"
    """auto (cuda, else mps, else sim), cuda, mps, sim (fake tensors) or cpu (real, tracked)."""

    # How many GPUs, and how the step is spread over them: the choices are
    # memorymark/distributed/topology.py's.
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

    # Model parallelism beside the data parallelism `dist` names: memorymark/distributed/
    # layout.py's degrees, on one device mesh as torchtitan builds it.
    tp: int = 1
    """Tensor-parallel degree: each block's attention and MLP split over this many GPUs of a
    node (parallelize_module with the model's plan, sequence parallel norms); 1: none."""
    cp: int = 1
    """Context-parallel degree: the sequence split over this many GPUs, attention as a ring
    (torch's context_parallel); 1: none."""
    pp: int = 1
    """Pipeline-parallel degree: the blocks split into this many stages on different GPUs;
    1: none."""
    pp_schedule: str = "1f1b"
    """The pipeline schedule: 1f1b, gpipe, or interleaved-1f1b (with --virtual-stages)."""
    microbatches: int | None = None
    """Microbatches each pipeline step splits the local batch into; None: one per stage."""
    virtual_stages: int = 1
    """Pipeline stages each GPU holds (interleaved-1f1b takes 2 or more)."""

    def __post_init__(self) -> None:
        validate(self)
        for name in ("tp", "cp", "pp"):  # before the GPU count is checked against them
            limits.check_range(name, getattr(self, name), 1, topology.MAX_GPUS, "the GPU cap")
        self._check_distribution()
        self._check_layout()

    def _check_layout(self) -> None:
        check_choice("pp_schedule", self.pp_schedule, layout.PP_SCHEDULES)
        limits.check_range("virtual_stages", self.virtual_stages, 1, 64, "a stage a layer")
        if self.microbatches is not None:
            limits.check_range("microbatches", self.microbatches, 1, 4096, "a pipeline step")
        if self.virtual_stages > 1 and self.pp_schedule != "interleaved-1f1b":
            raise ValueError(
                f"--virtual-stages {self.virtual_stages} is for --pp-schedule interleaved-1f1b"
            )
        if self.pp_schedule == "interleaved-1f1b" and self.pp > 1 and self.virtual_stages < 2:
            raise ValueError("interleaved-1f1b holds 2 or more stages a GPU: add "
                             "--virtual-stages 2")  # fmt: skip
        count = self.gpu_count
        if count is not None:
            self.layout(count)

    def layout(self, gpus: int | None = None) -> layout.Layout:
        """The parallel layout over `gpus` GPUs (the count asked for when not given)."""
        count = gpus if gpus is not None else (self.gpu_count or 1)
        return layout.Layout(
            gpus=count, dist=self.dist, tp=self.tp, cp=self.cp, pp=self.pp,
            nodes=topology.nodes_for(count, self.nodes),
        )  # fmt: skip

    def _check_distribution(self) -> None:
        check_choice("dist", self.dist, topology.DIST_STRATEGIES)
        check_choice("offload", self.offload, topology.OFFLOADS)
        check_choice("mp_policy", self.mp_policy, topology.MP_POLICIES)
        count = self.gpu_count
        if self.dist == "none" and (count is None or count > self.model_parallel):
            raise ValueError(
                f"--gpus {self.gpus} needs a distributed strategy: --dist ddp, zero1, fsdp, "
                "fsdp-no-reshard or hsdp"
            )
        if self.offload != "none" and self.dist not in topology.SHARDED:
            raise ValueError("--offload cpu is FSDP2's: use it with --dist fsdp, "
                             "fsdp-no-reshard or hsdp")  # fmt: skip
        if count is not None and self.nodes is not None:
            if self.nodes > count or count % self.nodes:
                raise ValueError(f"{count} GPUs cannot spread evenly over {self.nodes} nodes")
        if self.dist == "hsdp" and count is not None:
            nodes = topology.nodes_for(count, self.nodes)
            if count % nodes:
                raise ValueError(f"hsdp needs the same GPUs in every node ({count} over {nodes})")

    @property
    def pipeline_microbatches(self) -> int:
        """Microbatches a pipeline step splits the local batch into: `microbatches`, else one
        per pipeline rank (the fewest Schedule1F1B takes). torchtitan's default is
        microbatches of 1 sample; every figure of a pipeline here is for this split."""
        return self.microbatches or self.pp

    @property
    def micro_batch_multiple(self) -> int:
        """What every local batch a step runs is a multiple of: a pipeline's microbatches (it
        splits the batch into them), else 1."""
        return self.pipeline_microbatches if self.pp > 1 else 1

    @property
    def model_parallel(self) -> int:
        """GPUs one data-parallel rank spans: the tensor, context and pipeline degrees."""
        return self.tp * self.cp * self.pp

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
        limits.check_range("gpus", count, 1, topology.MAX_GPUS, "128 eight-GPU nodes")
        return count

    @property
    def node_count(self) -> int:
        """Nodes the GPUs span (a count is needed: not for `--gpus auto`)."""
        count = self.gpu_count
        if count is None:
            raise ValueError("--gpus auto has no node count until the search picks one")
        return topology.nodes_for(count, self.nodes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Search:
    """How batch sizes are searched, and the batches the answer is compared with."""

    strategy: StrategyName = "symbolic"
    """symbolic (trace two batches, replay every other one by arithmetic, trace the answer;
    fast where replays do not hold), fast (trace two batches, predict, verify, converge) or
    linear (step, 2*step, ... until the first OOM: the prototype's protocol)."""
    depth: DepthMode = "replay"
    """How a simulated sweep steps a deep model: replay (trace the model built with a few of its
    blocks and replay its full depth by arithmetic; the full model is traced where the structure
    is not found, and the report says why) or trace (trace every block of the model: slower on
    deep models)."""
    step: int = 8
    """Batch-size granularity of the search."""
    current_batch: int = 16
    """The batch size you train with today; a sequence-length search (find seq-len) searches at
    it."""
    find: Find = "batch"
    """batch (the largest batch at seq_len) or seq-len (the longest sequence at current_batch)."""
    seq_step: int = 1024
    """Granularity, in tokens, of a sequence-length search (shorter below the first step)."""
    max_batch: int = DEFAULT_MAX_BATCH
    """The search never tries a larger batch."""
    target_batch: int | None = None
    """The global batch you want per optimizer step: the answer plans micro-batch x gradient
    accumulation steps to reach it."""
    margin: str = "2%"
    """Headroom kept free below usable memory: a percentage ("2%") or bytes ("512MiB", "1GiB"),
    because an under-prediction means a crash at step one."""
    time_limit_seconds: float | None = None
    """Wall time the sweep may take; it stops before a probe that would pass it. None: no limit.
    A model whose estimated sweep cannot fit in it is refused before the first probe."""
    max_probes: int | None = None
    """Training steps the sweep may measure; None: as many as the strategy needs."""
    ways_out_time_limit_seconds: float | None = None
    """Wall time the search for ways out may take when nothing fits, apart from the sweep's
    time limit; it stops before a step that would pass it, and the answer lists the ways out
    found and names those not finished. None: no limit."""

    def __post_init__(self) -> None:
        validate(self)
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
    >>> s.workload.precision, s.hardware.gpu
    ('bf16-mixed', 'a10')
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
        flat = _legacy_names(flat)
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

    def replace(self, **changes: Any) -> Settings:
        """These settings with `changes`: flat names (as `Settings(...)` takes them, the names
        the CLI, URL and JSON use) or whole sections, validated again.

        >>> Settings(model="gpt2").replace(precision="bf16-mixed").workload.precision
        'bf16-mixed'
        """
        sections = {"workload": self.workload, "hardware": self.hardware, "search": self.search}
        return Settings(**{**sections, **changes})

    def margin_bytes(self, usable_bytes: int) -> int:
        """The margin in bytes for a GPU with `usable_bytes` of usable memory."""
        return parse_margin(self.search.margin, usable_bytes)

    def with_protocol(self, protocol: str) -> Settings:
        """Apply a protocol shortcut: inference-style = eval + logits.mean() + no optimizer."""
        check_choice("protocol", protocol, PROTOCOLS)
        if protocol == "inference-style":
            return self.replace(mode="eval", loss="logits-mean", optimizer="none")
        return self.replace(mode="train", loss="task", optimizer="adamw")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field by its flat name (the inverse of `from_dict`)."""
        return {name: getattr(getattr(self, s), name) for name, s in _SECTION_OF.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Settings:
        """Build from a dict such as `to_dict` writes; unknown keys are an error."""
        data = _legacy_names(data)
        unknown = sorted(set(data) - set(_SECTION_OF))
        if unknown:
            known = ", ".join(sorted(_SECTION_OF))
            raise ValueError(f"unknown setting {limits.shown(unknown[0])}; known: {known}")
        return cls(**dict(data))

    def to_query(self) -> dict[str, str]:
        """URL query parameters for the fields that differ from the defaults."""
        return codecs.to_query(self.to_dict(), Settings().to_dict())

    def to_command_line(self) -> str:
        """The `memorymark analyze` command that runs these settings: every field that differs
        from the defaults, as the flags the CLI reads back into the same Settings."""
        return codecs.command_line(self.workload.model, self.to_query())

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> Settings:
        """Parse URL query parameters (strings); unknown keys are ignored, bad values raise."""
        parsed = codecs.parse_query(flat_types(), params)
        if LEGACY_CHECKPOINTING in params:
            raw = str(params[LEGACY_CHECKPOINTING])
            try:
                parsed[LEGACY_CHECKPOINTING] = codecs.parse_value(raw, bool)
            except ValueError:
                raise ValueError(
                    f"bad value for {LEGACY_CHECKPOINTING}: {limits.shown(raw)}"
                ) from None
        return cls(**parsed)


LEGACY_CHECKPOINTING = "grad_checkpointing"
"""The on/off setting `checkpointing` replaced: still read (True is full), never written, so
saved JSON, history rows, links and scripts from before keep working."""


def _legacy_names(flat: Mapping[str, Any]) -> dict[str, Any]:
    """`flat` with `grad_checkpointing` read as `checkpointing` (on: full, off: none); a
    `checkpointing` given beside it wins."""
    out = dict(flat)
    if LEGACY_CHECKPOINTING not in out:
        return out
    on = out.pop(LEGACY_CHECKPOINTING)
    if not isinstance(on, bool):
        raise ValueError(f"{LEGACY_CHECKPOINTING} must be a bool (got {limits.shown(on)})")
    out.setdefault("checkpointing", "full" if on else "none")
    return out


@cache
def flat_types() -> dict[str, Any]:
    """Each flat name's field type (query parameters and command-line flags parse by it)."""
    return {name: field_types(SECTIONS[s])[name] for name, s in _SECTION_OF.items()}


def _check_kernels(w: Workload) -> None:
    """The kernel and loss choices that need a particular precision or each other."""
    if w.attention == "flash_attention_2" and w.precision == "32-true":
        raise ValueError(
            "flash_attention_2 runs in fp16 or bf16 only: choose precision bf16-mixed, "
            "16-mixed or bf16-true"
        )
    if w.kernels == "liger" and w.loss_chunks:
        raise ValueError("liger's fused cross-entropy already chunks the loss: drop loss_chunks")
    if w.activation_memory_budget != 1.0 and not w.compile:
        raise ValueError(
            "activation_memory_budget steers the compiled step's partitioner: add --compile"
        )
    if w.float8 != "none" and w.quantization != "none":
        raise ValueError(
            "float8 training and bitsandbytes quantization both replace the "
            "linear layers: choose one"
        )


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
    if w.float8 != "none":
        _check_float8_gpu(s)


# torchao's float8 training runs `torch._scaled_mm`, whose FP8 kernels need compute capability
# 8.9 or newer (torchao/float8/README.md; its tests gate on `is_sm_at_least_89`).
FLOAT8_CAPABILITY = (8, 9)


def _check_float8_gpu(s: Settings) -> None:
    """Refuse float8 on a GPU without FP8 matmuls, in one line (the default GPU is an A10)."""
    name = s.hardware.gpu
    if name is None and s.hardware.gpu_memory_gib is not None:
        raise ValueError("float8 needs a GPU with FP8 matmuls: name it with --gpu (h100, h200...)")
    if name is None and s.hardware.backend == "sim":
        name = gpus.DEFAULT_SIMULATED_GPU  # what the simulation targets when none is named
    gpu = gpus.find_gpu(name) if name is not None else None  # else this machine's GPU
    if gpu is not None and gpu.compute_capability < FLOAT8_CAPABILITY:
        raise ValueError(
            f"float8 training needs FP8 matmuls (compute capability 8.9+: Ada, Hopper, "
            f"Blackwell); the {gpu.name} has {gpu.compute_capability[0]}."
            f"{gpu.compute_capability[1]}: drop --float8 or pick --gpu h100"
        )


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


def check_model(settings: Settings) -> models.ModelEntry:
    """Resolve the model `settings` name (a `file:` spec reads its config, `hf:` the hub) and
    refuse a task it does not train, a seq_len past its positions, a fused loss for a model
    that is not a causal LM, or a sequence search of an image model (one-line ValueErrors).
    Returns the model's entry, so the caller need not look it up again."""
    entry = models.find_model(settings.workload.model)
    _check_model_entry(settings.workload, entry)
    _check_search_axis(settings, entry)
    return entry
