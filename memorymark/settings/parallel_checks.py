"""What tensor and context parallelism need of a model and a step, refused in one line before
anything is built.

Reads the model's config (heads, key/value heads, layers) and hands them with the sequence
length to `layout.check_model`; refuses the settings the simulation does not combine with
`--tp` or `--cp` (each says why and what to use instead). Pure: no torch, no I/O beyond the
catalog's config lookup.
"""

from __future__ import annotations

from memorymark import models
from memorymark.distributed import layout
from memorymark.settings.sections import Settings


def check_parallel(settings: Settings, entry: models.ModelEntry) -> None:
    """Refuse a `--tp`/`--cp`/`--pp` layout the model or the step cannot take (ValueError)."""
    hw, w = settings.hardware, settings.workload
    if hw.model_parallel == 1:
        return
    if entry.input_kind != "text":
        raise ValueError(
            "--tp, --cp and --pp split transformer blocks and token sequences: "
            f"{entry.key} is an image model"
        )
    if w.compile:
        # Each is simulated alone, compiled or split; together they were never checked.
        raise ValueError(
            "--compile beside --tp, --cp or --pp is not simulated yet: size the compiled step "
            "with FSDP alone (--dist fsdp), or the layout eager"
        )
    config = models.config_of(entry) or {}
    heads = _int(config, "num_attention_heads")
    gpus = hw.gpu_count or hw.model_parallel
    layout.check_model(
        hw.layout(gpus),
        heads=heads,
        kv_heads=_int(config, "num_key_value_heads") or heads,
        layers=_int(config, "num_hidden_layers"),
        seq_len=w.seq_len,
        pp_stages_per_rank=hw.virtual_stages,
    )
    if hw.tp > 1:
        # Sequence parallelism splits the sequence between the blocks' projections, and the
        # ring splits it again: torchtitan's seq_len_divisor (tp x 2 cp).
        divisor = hw.tp * (2 * hw.cp if hw.cp > 1 else 1)
        if w.seq_len % divisor:
            raise ValueError(
                f"--tp {hw.tp} splits the sequence between the blocks (sequence parallelism): "
                f"give a --seq-len divisible by {divisor}"
            )
        for on, what in (
            (w.lora_rank > 0, "LoRA adapters"),
            (w.quantization != "none", "quantized weights"),
            (w.kernels == "liger", "Liger's kernels"),
            (w.loss_chunks > 0, "a chunked loss"),
        ):
            if on:
                raise ValueError(
                    f"--tp beside {what} is not simulated: split a full-weight model, or use --tp 1"
                )
    if hw.cp > 1 and w.resolved_task != models.CAUSAL_LM:
        # torch's load-balanced ring needs causal attention ("Load balancing requires
        # `is_causal=True`", _context_parallel/_attention.py).
        raise ValueError(
            f"--cp runs causal attention as a ring: train {entry.key} as a causal LM "
            "(--task causal-lm), or use --cp 1"
        )
    if hw.cp > 1 and w.attention != "sdpa":
        raise ValueError(
            f"--cp runs attention as a ring over scaled_dot_product_attention: use --attention "
            f"sdpa (not {w.attention})"
        )


def _int(config: dict, key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) else None
