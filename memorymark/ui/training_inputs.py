"""The sidebar's training and search settings: precision, optimizer, checkpointing, LoRA,
quantized base weights (QLoRA), the loop (accumulation, clipping, the evaluation pass), mode,
batch sizes and strategy, then the advanced ones
(attention, kernels, loss chunks, sequence step, loss, protocol, backend, depth, step, largest
batch, margin, forward only).

Each widget writes its `Settings` field's session-state key (`mm_<field>`); one that does not
apply to the chosen model is not drawn. A widget's help is its field's docstring (`field_help`),
written once for the CLI and the app, unless the app has more to say (the optimizers' state,
quantization's preparation, the server's ceilings). Must not know how a sweep runs or how
results are drawn.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from memorymark import limits, models
from memorymark.settings import Settings, choices, field_help
from memorymark.ui.model_inputs import applicable
from memorymark.ui.state_keys import key

PROTOCOL_KEY = "mm_protocol"
OPTIMIZER_HELP = (
    "adamw: two state buffers per weight, foreach kernels as on CUDA (HF Trainer: adamw_torch); "
    "adamw-fused: one CUDA kernel (adamw_torch_fused; real runs need CUDA); -forloop: "
    "foreach=False; sgd: momentum, one buffer; adafactor: factored state (transformers); "
    "adamw-8bit / lion-8bit: bitsandbytes, one byte per state value (adamw_bnb_8bit, "
    "lion_8bit); paged-adamw-8bit / -32bit: state in CUDA unified memory, outside the peak, "
    "paging to host when the GPU is full (paged_adamw_8bit, paged_adamw_32bit); "
    "none: no optimizer step"
)
QUANTIZATION_HELP = (
    "Base weights as bitsandbytes stores them, dequantized per layer in forward and backward: "
    "nf4 / fp4 are 4-bit (QLoRA: needs a LoRA rank), int8 is LLM.int8(). The model is prepared "
    "as peft's prepare_model_for_kbit_training does: other weights (embeddings, head, norms) "
    "in fp32."
)


def _quantization_inputs(sb: Any, use: dict[str, bool]) -> dict[str, Any]:
    if not use.get("quantization", True):
        return {}
    method = sb.selectbox(
        "Quantized base weights",
        choices.QUANTIZATIONS,
        key=key("quantization"),
        help=QUANTIZATION_HELP,
    )
    if method not in ("nf4", "fp4"):
        return {"double_quant": False}
    sb.checkbox(
        "Double quantization",
        key=key("double_quant"),
        help=field_help("double_quant"),
    )
    return {}


def _protocol_of_state() -> str:
    """The protocol the mode, loss and optimizer widgets add up to."""
    chosen = (st.session_state[key(n)] for n in ("mode", "loss", "optimizer"))
    return "inference-style" if tuple(chosen) == ("eval", "logits-mean", "none") else "full"


def _apply_protocol() -> None:
    """Protocol callback: set mode, loss and optimizer as the CLI's --protocol does."""
    applied = Settings().with_protocol(st.session_state[PROTOCOL_KEY])
    for name in ("mode", "loss", "optimizer"):
        st.session_state[key(name)] = getattr(applied.workload, name)


def _lora_inputs(sb: Any) -> dict[str, Any]:
    rank = sb.number_input(
        "LoRA rank (0: train every weight)",
        min_value=0,
        step=4,
        key=key("lora_rank"),
        help="Adapters through peft: base weights frozen, no gradients or optimizer state "
        "for them.",
    )
    if not rank:
        return {"lora_targets": ""}
    sb.text_input(
        "LoRA target modules",
        key=key("lora_targets"),
        placeholder="the architecture's default",
        help=field_help("lora_targets"),
    )
    return {}


def _loop_inputs(sb: Any) -> dict[str, Any]:
    sb.number_input(
        "Gradient accumulation steps",
        min_value=1,
        key=key("grad_accum"),
        help="Micro-batches whose gradients add up before each optimizer step. The step "
        "measured is the whole loop: from the second micro-batch on, every gradient is alive "
        "through forward and backward.",
    )
    sb.number_input(
        "Clip gradients at norm (optional)",
        min_value=0.0001,
        value=None,
        key=key("max_grad_norm"),
        placeholder="off",
        help="clip_grad_norm_ before the optimizer step, as HF Trainer does (its default: 1.0)",
    )
    return _eval_inputs(sb)


def _eval_inputs(sb: Any) -> dict[str, Any]:
    """The evaluation pass between training steps (HF Trainer's), off until an eval batch is
    given; its accumulation means nothing without one."""
    batch = sb.number_input(
        "Eval batch size (optional)",
        min_value=1,
        value=None,
        key=key("eval_batch"),
        placeholder="no evaluation pass",
        help=field_help("eval_batch"),
    )
    sb.number_input(
        "Eval accumulation steps (optional)",
        min_value=1,
        max_value=limits.MAX_EVAL_ACCUMULATION,
        value=None,
        key=key("eval_accumulation"),
        # The value measured when none is given: "unset" read as Trainer's unset (every batch
        # kept on the GPU), which is not what runs; the sidebar's width cut a longer text.
        placeholder="1 (one batch)",
        disabled=batch is None,
        help=field_help("eval_accumulation"),
    )
    return {"eval_accumulation": None} if batch is None else {}


def _batch_inputs(sb: Any, use: dict[str, bool]) -> None:
    if use.get("seq_len", True):
        sb.radio(
            "Search for",
            choices.FINDS,
            key=key("find"),
            horizontal=True,
            help="batch: the largest batch at this sequence length (Analyze). seq-len: the "
            "longest sequence that trains at the current batch (the Longest sequence page).",
        )
    sb.number_input(
        "Current batch size (what you train with today)",
        min_value=1,
        key=key("current_batch"),
        help=field_help("current_batch"),
    )
    sb.number_input(
        "Target global batch (optional)",
        min_value=1,
        value=None,
        key=key("target_batch"),
        placeholder="none",
        help=field_help("target_batch"),
    )
    sb.radio(
        "Search strategy",
        choices.STRATEGIES,
        key=key("strategy"),
        horizontal=True,
        help=field_help("strategy"),
    )


CHECKPOINTING_SHOWN = ("none", "full", "selective-op", "layers:2", "layers:4")
"""The checkpointing modes the select box lists; another layers:K can be typed in."""


def _checkpointing_input(sb: Any) -> None:
    """The checkpointing mode: a select box of the common ones, taking any other typed in
    (the settings check it); one set by a link stays listed."""
    current = st.session_state.get(key("checkpointing"), "none")
    shown = [*CHECKPOINTING_SHOWN, *([current] if current not in CHECKPOINTING_SHOWN else [])]
    sb.selectbox(
        "Activation checkpointing",
        shown,
        key=key("checkpointing"),
        help=field_help("checkpointing"),
        accept_new_options=True,
    )


def training_inputs(sb: Any, entry: models.ModelEntry | None) -> dict[str, Any]:
    """Draw the training and search widgets; return values that override their state."""
    use = applicable(entry) if entry is not None else {}
    sb.selectbox(
        "Precision",
        choices.PRECISIONS,
        key=key("precision"),
        help=field_help("precision"),
    )
    sb.checkbox("TF32 matmuls (allow_tf32)", key=key("tf32"), help=field_help("tf32"))
    sb.selectbox("Optimizer", choices.OPTIMIZERS, key=key("optimizer"), help=OPTIMIZER_HELP)
    if use.get("checkpointing", True):
        _checkpointing_input(sb)
    overrides = _lora_inputs(sb)
    overrides |= _quantization_inputs(sb, use)
    overrides |= _loop_inputs(sb)
    sb.radio("Mode", choices.MODES, key=key("mode"), horizontal=True, help=field_help("mode"))
    _batch_inputs(sb, use)
    with sb.expander("Advanced"):
        _advanced_inputs(use)
    return overrides


def _compile_inputs() -> None:
    """torch.compile, its partitioner's memory budget, and torchao's Float8 recipes."""
    st.checkbox("torch.compile (each block)", key=key("compile"), help=field_help("compile"))
    st.number_input(
        "Activation memory budget (with torch.compile)",
        min_value=0.0,
        max_value=1.0,
        step=0.1,
        key=key("activation_memory_budget"),
        help=field_help("activation_memory_budget"),
    )
    st.selectbox(
        "Float8 (torchao)", choices.FLOAT8_RECIPES, key=key("float8"), help=field_help("float8")
    )


def _advanced_inputs(use: dict[str, bool]) -> None:
    if use.get("attention", True):
        st.selectbox(
            "Attention",
            choices.ATTENTIONS,
            key=key("attention"),
            help=field_help("attention"),
        )
    if use.get("kernels", True):
        st.selectbox(
            "Kernels",
            choices.KERNELS,
            key=key("kernels"),
            help=field_help("kernels"),
        )
        st.number_input(
            "Loss chunks (0: one loss over all logits)",
            min_value=0,
            max_value=choices.MAX_LOSS_CHUNKS,
            key=key("loss_chunks"),
            help=field_help("loss_chunks"),
        )
    if use.get("seq_len", True):
        st.number_input(
            "Sequence step (Longest sequence page)",
            min_value=1,
            key=key("seq_step"),
            help=field_help("seq_step"),
        )
    _compile_inputs()
    st.selectbox("Loss", choices.LOSSES, key=key("loss"), help=field_help("loss"))
    st.session_state[PROTOCOL_KEY] = _protocol_of_state()
    st.radio(
        "Protocol", choices.PROTOCOLS, key=PROTOCOL_KEY, on_change=_apply_protocol,
        horizontal=True, help="A shortcut for mode, loss and optimizer, as the CLI's --protocol: "
        "inference-style = eval + logits.mean() + no optimizer; full = train + task loss + adamw",
    )  # fmt: skip
    st.selectbox(
        "Backend", choices.BACKENDS, key=key("backend"),
        help="auto: this machine's GPU when it is the one chosen, else simulated",
    )  # fmt: skip
    st.radio(
        "Deep models (simulated)",
        choices.DEPTH_MODES,
        key=key("depth"),
        horizontal=True,
        help=field_help("depth"),
    )
    st.number_input("Batch step", min_value=1, key=key("step"), help=field_help("step"))
    st.number_input(
        "Largest batch to try", min_value=1, key=key("max_batch"), help=field_help("max_batch")
    )
    _limit_inputs()
    st.text_input(
        "Safety margin below usable memory",
        key=key("margin"),
        help=field_help("margin"),
    )
    st.checkbox(
        "Forward pass only (no_grad)", key=key("forward_only"), help=field_help("forward_only")
    )


def _limit_inputs() -> None:
    """How long and how many probes a sweep may take, and how long the ways out may take when
    nothing fits (empty: the server's ceiling)."""
    from memorymark.ui.sweep_runner import server_config  # the ceilings, for the help text

    server = server_config()
    st.number_input(
        "Time limit (s)", min_value=1.0, key=key("time_limit_seconds"), placeholder="no limit",
        help="The sweep stops before a probe that would pass it and shows what it found so far "
        f"(CLI --time-limit). This server allows at most {server.max_time_limit:g} s.",
    )  # fmt: skip
    st.number_input(
        "Most probes", min_value=1, step=1, key=key("max_probes"), placeholder="no limit",
        help="The sweep stops after this many training steps and shows what it found so far "
        f"(CLI --max-probes). This server allows at most {server.max_probes}.",
    )  # fmt: skip
    st.number_input(
        "Ways-out time limit (s)", min_value=1.0, key=key("ways_out_time_limit_seconds"),
        placeholder="no limit",
        help="When nothing fits, the search for ways out gets this long after the sweep, apart "
        "from the sweep's time limit; each way out shows as it is found, and those not "
        f"finished are named (CLI --ways-out-time-limit). This server allows at most "
        f"{server.max_ways_out_time_limit:g} s.",
    )  # fmt: skip
