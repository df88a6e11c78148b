"""The command line's flags for settings, generated from the Settings sections' fields.

Each flag's name (`codecs.flag_of`), destination (the field's flat name), default, type and help
(the field's docstring) come from its field, so a setting is documented once, in
memorymark/settings/sections.py, and `parser.settings_from_args` maps flags back by name. This
module adds only what a field does not say: a metavar, a count argparse refuses below 1 itself,
an alias. Must not know what a setting means, the engine, or torch.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable, Iterable
from functools import cache
from typing import Any

from memorymark.cli.arg_types import number, positive_whole_number, whole_number
from memorymark.settings import Settings, field_help
from memorymark.settings.codecs import flag_of
from memorymark.settings.sections import flat_types

# Every field but `model` (a positional), in the order `--help` lists them: what is trained and
# the loop (before `--protocol`, the shortcut for mode, loss and optimizer), where and how the
# step runs, then analyze's search.
TRAINING_FLAGS = ("task", "seq_len", "image_size", "optimizer", "grad_accum", "max_grad_norm",
                  "eval_batch", "eval_accumulation", "mode", "loss")  # fmt: skip
RUNNING_FLAGS = ("gpu", "gpu_memory_gib", "backend", "depth", "precision", "tf32", "attention",
                 "kernels", "loss_chunks", "checkpointing", "compile",
                 "activation_memory_budget", "float8", "lora_rank", "lora_targets",
                 "quantization", "double_quant", "forward_only", "dist", "gpus", "nodes",
                 "offload", "mp_policy", "tp", "cp", "pp", "pp_schedule", "microbatches",
                 "virtual_stages")  # fmt: skip
SEARCH_FLAGS = ("find", "seq_step", "strategy", "step", "current_batch", "max_batch",
                "time_limit_seconds", "max_probes", "ways_out_time_limit_seconds", "margin",
                "target_batch")  # fmt: skip

# Counts argparse refuses below 1 itself, so the message names the flag; the other whole
# numbers reach Settings, whose range check names the setting.
_AT_LEAST_1 = frozenset(
    {"grad_accum", "nodes", "seq_step", "step", "current_batch", "max_batch", "max_probes",
     "target_batch", "eval_batch", "eval_accumulation", "tp", "cp", "pp", "microbatches",
     "virtual_stages"}
)  # fmt: skip
_METAVARS = {
    "grad_accum": "N",
    "max_grad_norm": "NORM",
    "eval_batch": "N",
    "eval_accumulation": "K",
    "gpu_memory_gib": "GIB",
    "loss_chunks": "N",
    "gpus": "N|auto",
    "nodes": "M",
    "seq_step": "TOKENS",
    "time_limit_seconds": "SECONDS",
    "ways_out_time_limit_seconds": "SECONDS",
    "max_probes": "N",
    "depth": "replay|trace",
    "checkpointing": "none|full|selective-op|layers:K",
    "activation_memory_budget": "F",
    "float8": "none|tensorwise|rowwise",
}
# The name `measure` and `validate-backward` give their own batch size, kept for analyze's.
_ALIASES = {"current_batch": ("--batch-size",)}
# Flags that set a setting to one value, after its own flag: --grad-checkpointing, the on/off
# switch from before `checkpointing` named a mode, stays for the scripts and docs that use it.
_SWITCHES = {
    "checkpointing": (("--grad-checkpointing", "full", "the same as --checkpointing full"),),
}


def add_setting_flags(parser: argparse.ArgumentParser, names: Iterable[str]) -> None:
    """Add the flag of each setting in `names` (flat field names), in that order."""
    defaults = _defaults()
    for name in names:
        options: dict[str, Any] = {
            "dest": name,
            "default": defaults[name],
            "help": help_text(name),
        }
        kind = _value_type(name)
        if kind is bool:
            options["action"] = "store_true"
        elif (parse := _parse(name, kind)) is not None:
            options["type"] = parse
        if name in _METAVARS:
            options["metavar"] = _METAVARS[name]
        parser.add_argument(flag_of(name), *_ALIASES.get(name, ()), **options)
        for flag, value, text in _SWITCHES.get(name, ()):
            parser.add_argument(flag, dest=name, action="store_const", const=value, help=text)


def help_text(name: str) -> str:
    """A setting's or cost's docstring as argparse help (which %-formats it)."""
    return field_help(name).replace("%", "%%")


def _parse(name: str, kind: Any) -> Callable[[str], Any] | None:
    """What turns the flag's text into the field's type (None: the text itself)."""
    if kind is int:
        return positive_whole_number if name in _AT_LEAST_1 else whole_number
    if kind is float:
        return number
    return None  # str, or a Literal's choices, which Settings checks in one line


def _value_type(name: str) -> Any:
    """The field's type, without its `| None`."""
    kind = flat_types()[name]
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if type(None) in typing.get_args(kind) and len(args) == 1:
        return args[0]
    return kind


@cache
def _defaults() -> dict[str, Any]:
    return Settings().to_dict()
