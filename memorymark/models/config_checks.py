"""Reading a user's config.json safely, and checking what it holds before transformers sees it.

Owns the rules a config file must pass, each refused in one line: a regular file (a FIFO, a
device such as /dev/zero, a directory are refused without being read) of at most
`limits.MAX_CONFIG_BYTES`, read no further than that; UTF-8 JSON nested at most
`limits.MAX_CONFIG_DEPTH` deep; the keys MemoryMark itself reads (model_type, architectures,
num_labels, id2label) of the right types; and every size transformers would build from
(layers, widths, heads, vocabulary, positions, labels, and a rough parameter count) within
`limits`. Knows nothing of tasks or the model catalog; never imports torch or transformers.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from memorymark import limits
from memorymark.units import MIB


class ConfigError(ValueError):
    """A config file that is refused: unreadable, not JSON, wrong types or absurd sizes."""


# Config keys (across transformers families) -> the ceiling of each int they hold. A key may
# hold an int, a list of ints (per-stage sizes: ResNet's hidden_sizes, Swin's num_heads) or null.
_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "embedding_size", "d_kv")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers",
           "encoder_layers", "decoder_layers", "depths")  # fmt: skip
_INTERMEDIATE = ("intermediate_size", "n_inner", "d_ff", "hidden_dim", "ffn_dim",
                 "encoder_ffn_dim", "decoder_ffn_dim")  # fmt: skip
_HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "num_key_value_heads",
          "encoder_attention_heads", "decoder_attention_heads")  # fmt: skip
_POSITIONS = ("max_position_embeddings", "n_positions", "n_ctx")
_CEILINGS: dict[str, tuple[int, str]] = {
    **{k: (limits.MAX_HIDDEN_SIZE, "4x the widest open model's") for k in _HIDDEN},
    "hidden_sizes": (limits.MAX_HIDDEN_SIZE, "4x the widest open model's"),
    "num_channels": (limits.MAX_HIDDEN_SIZE, "4x the widest open model's"),
    **{k: (limits.MAX_LAYERS, "8x Llama-3.1-405B's 126") for k in _LAYERS},
    **{k: (limits.MAX_INTERMEDIATE_SIZE, "4x the widest hidden size") for k in _INTERMEDIATE},
    **{k: (limits.MAX_HEADS, "8x Llama-3.1-405B's 128") for k in _HEADS},
    **{k: (limits.MAX_POSITIONS, "1.6x the longest published context") for k in _POSITIONS},
    "vocab_size": (limits.MAX_VOCAB, "4x Gemma's 262,144"),
    "num_labels": (limits.MAX_LABELS, "4.6x ImageNet-21k's classes"),
    "image_size": (limits.MAX_IMAGE_SIZE, "36x ImageNet's 224 pixels"),
    "patch_size": (limits.MAX_IMAGE_SIZE, "36x ImageNet's 224 pixels"),
}


def read_config(path: Path, *, shown: str | None = None) -> dict[str, Any]:
    """The checked contents of the config.json at `path` (ConfigError, one line, otherwise);
    messages call the file `shown` when given (an upload's name instead of a server path)."""
    name = shown or limits.shown(str(path))
    raw = _read_capped(path, name)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {name} is not UTF-8 text") from None
    except RecursionError:
        raise ConfigError(f"config file {name} nests deeper than JSON can be read") from None
    except ValueError as exc:  # JSONDecodeError, and ints past Python's 4300-digit limit
        reason = str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
        raise ConfigError(f"config file {name} is not valid JSON: {reason}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(
            f"config file {name} has no model_type: is it a transformers config.json?"
        )
    check_config(data, name)
    return data


def _read_capped(path: Path, name: str) -> bytes:
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, for ever.
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ConfigError(f"config file {name} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {name} cannot be read ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"config file {name} is not a regular file")
        too_big = ConfigError(
            f"config file {name} is larger than {limits.MAX_CONFIG_BYTES // MIB} MiB: "
            "a config.json holds an architecture, a few KiB"
        )
        if info.st_size > limits.MAX_CONFIG_BYTES:
            raise too_big
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limits.MAX_CONFIG_BYTES + 1)  # never more, even if the file grew
        if len(data) > limits.MAX_CONFIG_BYTES:
            raise too_big
        return data
    except OSError as exc:
        raise ConfigError(f"config file {name} cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)


def check_config(data: dict[str, Any], name: str) -> None:
    """Refuse wrong types in the keys MemoryMark reads, too deep nesting, and absurd sizes."""
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not 0 < len(model_type) <= 100:
        raise ConfigError(
            f"config file {name}: model_type must be a name (got {_kind(model_type)})"
        )
    architectures = data.get("architectures")
    if architectures is not None and not (
        isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)
    ):
        raise ConfigError(f"config file {name}: architectures must be a list of class names")
    for labels in ("id2label", "label2id"):
        value = data.get(labels)
        if value is not None and not isinstance(value, dict):
            raise ConfigError(
                f"config file {name}: {labels} must be an object (got {_kind(value)})"
            )
    for d in _dicts(data, name):
        for key, (high, why) in _CEILINGS.items():
            if key in d:
                _check_size(name, key, d[key], high, why)
        estimate = parameter_estimate(d)
        if estimate > limits.MAX_PARAMETERS:
            raise ConfigError(
                f"config file {name} describes about {estimate:.1e} parameters: at most "
                f"{limits.MAX_PARAMETERS:.0e} (5x Llama-3.1-405B) are simulated"
            )


def all_objects(data: Any) -> list[dict[str, Any]]:
    """Every object in a checked config (the config itself and sub-configs such as
    text_config)."""
    return _dicts(data, "config")


def _dicts(data: Any, name: str) -> list[dict[str, Any]]:
    """Every object in `data` (sub-configs such as text_config), refusing deep nesting."""
    found, stack = [], [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > limits.MAX_CONFIG_DEPTH:
            raise ConfigError(
                f"config file {name} nests deeper than {limits.MAX_CONFIG_DEPTH} levels"
            )
        if isinstance(value, dict):
            found.append(value)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return found


def _check_size(name: str, key: str, value: Any, high: int, why: str) -> None:
    items = value if isinstance(value, list) else [value]
    if len(items) > limits.MAX_LAYERS:
        raise ConfigError(f"config file {name}: {key} lists more than {limits.MAX_LAYERS} sizes")
    for item in items:
        if item is None:
            continue
        if isinstance(item, bool) or not isinstance(item, int):
            raise ConfigError(
                f"config file {name}: {key} must be a whole number (got {_kind(item)})"
            )
        try:
            low = 0 if key in _LAYERS else 1  # a width of 0 builds zero-element weights
            limits.check_range(f"config file {name}: {key}", item, low, high, why)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def _first(d: dict[str, Any], keys: tuple[str, ...]) -> int:
    for k in keys:
        value = d.get(k)
        values = value if isinstance(value, list) else [value]
        ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        if ints:
            return sum(ints) if k == "depths" else max(ints)
    return 0


def parameter_estimate(d: dict[str, Any]) -> int:
    """A rough parameter count of one (sub-)config: embeddings plus attention and MLP weights
    per layer. Only to refuse absurd sizes before anything is built; never reported."""
    hidden, layers = _first(d, _HIDDEN + ("hidden_sizes",)), _first(d, _LAYERS)
    intermediate = _first(d, _INTERMEDIATE) or 4 * hidden
    embeddings = hidden * (_first(d, ("vocab_size",)) + _first(d, _POSITIONS))
    return embeddings + layers * (4 * hidden * hidden + 3 * hidden * intermediate)


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {limits.shown(value)}"
