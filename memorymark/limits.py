"""The ceilings every number a user types, links or uploads must stay under, and the one check.

A setting past its ceiling is refused in one line that names the ceiling and why it is there,
before anything is built: an absurd sequence length, label count or layer count would otherwise
hang the simulation or allocate gigabytes (transformers builds an `id2label` dict with an entry
per label) before the first probe. Each ceiling sits far above real training runs. This module
holds numbers, the range check, and how a value or an error is shown in one line (`shown`,
`one_line`); it knows nothing of settings, configs or torch.
"""

from __future__ import annotations

import math
from typing import Any

# What a run may ask for (Settings).
MAX_SEQ_LEN = 2**20
"""Tokens per sample: 8x the longest context in the catalog (Llama-3.1's 131,072 positions)."""
MAX_IMAGE_SIZE = 8192
"""Pixels a side: 36x ImageNet training's 224, 16x the largest catalog resolution (ViT's 224)."""
MAX_BATCH = 2**20
"""Samples (step, current, largest, target batch): 256x the default largest batch, 4096."""
MAX_TIME_LIMIT_SECONDS = 86_400.0
"""A sweep's wall time: a day (a 70B model's simulated sweep takes minutes; a real GPU's hours)."""
MAX_PROBES = 100_000
"""Probes of one sweep: a linear sweep to MAX_BATCH in steps of 8 takes 131,072; this much is
already past any useful search (the fast strategy takes about 10)."""
MAX_GRAD_ACCUM = 64
"""Micro-batches per optimizer step: each one is stepped in turn (256 took 20 s on a two-layer
BERT, minutes on a 7B model), and from the second on the peak no longer grows (every gradient
is alive already; see plan.py), so 2 measures what any larger count needs."""
MAX_EVAL_ACCUMULATION = 64
"""Evaluation batches whose predictions stay on the GPU together: each is one more forward pass
in every probe, and their logits are concatenated each batch (the old and the new alive at
once), so the peak grows by about two batches' predictions per batch: 64 is already past what
any GPU holds for a model worth sizing at a large eval batch."""
MAX_HIDDEN_SIZE = 65536
"""A layer's width: 4x the widest open dense model's (Llama-3.1-405B, hidden_size 16384)."""
MAX_LORA_RANK = MAX_HIDDEN_SIZE
"""A LoRA rank as wide as the layer it adapts is no longer low-rank."""

# What a config.json may hold (config_checks).
MAX_CONFIG_BYTES = 2**20
"""A transformers config.json is a few KiB; the largest, with an id2label for ImageNet-22k's
21,841 classes, stays under 1 MiB at about 40 bytes a label. The app's uploads stop at 1 MB
(.streamlit/config.toml, maxUploadSize)."""
MAX_CONFIG_DEPTH = 32
"""Nesting of a config's JSON: real ones nest about 3 deep (text_config -> rope_scaling)."""
MAX_LABELS = 100_000
"""Classes of a classification head: 4.6x ImageNet-21k's 21,843. transformers' num_labels
setter builds an id2label dict with one entry per label (1e9 labels: gigabytes)."""
MAX_VOCAB = 2**20
"""Token vocabulary: 4x the largest in common use (Gemma's 262,144)."""
MAX_LAYERS = 1024
"""Transformer blocks: 8x Llama-3.1-405B's 126; each becomes Python modules, even on meta."""
MAX_INTERMEDIATE_SIZE = 4 * MAX_HIDDEN_SIZE
"""MLP width: 4x the widest hidden size (Llama-3.1-405B's is 53,248)."""
MAX_HEADS = 1024
"""Attention heads: 8x Llama-3.1-405B's 128."""
MAX_POSITIONS = 2**24
"""Position embeddings a config declares: 1.6x the longest published context (10M tokens)."""
MAX_PARAMETERS = 2 * 10**12
"""A rough parameter count from the config's sizes: 5x Llama-3.1-405B."""

# What a run costs (Costs).
MAX_USD_PER_HOUR = 1000.0
"""Price of one GPU-hour: over 100x the dearest catalog GPU's on-demand price."""
MAX_HOURS_PER_RUN = 8784.0
"""Hours of one training run: a leap year."""
MAX_RUNS_PER_YEAR = 100_000.0
"""Training runs a year: one every five minutes, all year."""

# What an error may hold.
MAX_ERROR_CHARS = 200
"""A probe's error message, kept in its measurement, the JSON report and the history: the first
line of whatever the user's step raised, which may be a whole tensor's repr."""

_SHOWN_CHARS = 40


def shown(value: Any) -> str:
    """`value` as a short one-line repr for an error message (long input is cut, not echoed)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**_SHOWN_CHARS:
        return f"a {int(abs(value).bit_length() * math.log10(2)) + 1}-digit number"
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def one_line(exc: BaseException, limit: int | None = None) -> str:
    """An exception as one line a person can read: its message's first line (its type's name when
    the message is empty), cut to `limit` characters when one is given. Our own refusals are
    never cut: they end by naming the choices."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def check_range(
    name: str, value: Any, low: float, high: float | None = None, why: str = ""
) -> None:
    """Raise a one-line ValueError unless `value` is a finite number in [low, high].

    Booleans and strings are not numbers here; huge ints are compared as ints (never converted
    to float, which would overflow)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number (got {shown(value)})")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number (got {value})")
    if value < low:
        raise ValueError(f"{name} must be at least {_number(low)} (got {shown(value)})")
    if high is not None and value > high:
        reason = f" ({why})" if why else ""
        raise ValueError(f"{name} must be at most {_number(high)}{reason} (got {shown(value)})")


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,g}"
