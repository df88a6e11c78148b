"""`python -m memorymark`: the command line, a thin layer over the engine.

Each command parses flags into `Settings`/`Costs`, calls the engine, and prints either a readable
table (with a line per probe as it lands) or, with --json, one JSON object and nothing else.
Library errors become one line on stderr and a non-zero exit; never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from memorymark import models
from memorymark.cli import catalogs, history, setting_flags
from memorymark.cli.arg_types import batch_size, number, positive_whole_number, whole_number
from memorymark.history.db_file import HistoryError
from memorymark.settings import FIELD_NAMES, Costs, Settings, choices
from memorymark.settings.codecs import flag_of

EXIT_BAD_INPUT = 2
EXIT_STEP_FAILED = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse prints the whole usage block; one line and a pointer to --help is kinder.
        self.exit(EXIT_BAD_INPUT, f"memorymark: error: {message} (see `{self.prog} --help`)\n")


def _add_workload_flags(p: argparse.ArgumentParser) -> None:
    """The flags of every command that trains a model: the settings' own, from their fields."""
    p.add_argument(
        "model",
        nargs="?",
        help=f"{setting_flags.help_text('model')} Built in: {', '.join(models.model_keys())}",
    )
    p.add_argument(
        "--config-file", metavar="PATH", help="any transformers config.json (instead of MODEL)"
    )
    p.add_argument(
        "--training",
        metavar="FILE.py:FUNCTION",
        help="your own training code instead of MODEL: FUNCTION() returns a "
        "memorymark.Training (model, batch, step, optimizer); see the README's 'Your own code'",
    )
    setting_flags.add_setting_flags(p, setting_flags.TRAINING_FLAGS)
    p.add_argument(
        "--protocol",
        choices=choices.PROTOCOLS,
        help="inference-style = eval + logits.mean() + no optimizer (what simpler "
        "tools measure); full = train + task loss + adamw",
    )
    setting_flags.add_setting_flags(p, setting_flags.RUNNING_FLAGS)
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command (docs/cli.md lists each of its options)."""
    parser = _Parser(prog="memorymark", description="Find the largest batch size that trains.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands = (
        _add_analyze,
        _add_measure,
        _add_validate_backward,
        _add_compare,
        _add_layouts,
        _add_calibrate,
        history.add_parser,
        _add_listings,
    )
    for add_parser in commands:  # in the order `memorymark --help` lists them
        add_parser(sub)
    return parser


def _add_analyze(sub: Any) -> None:
    """The `analyze` command, under the CLI's subparsers `sub`."""
    analyze = sub.add_parser(
        "analyze",
        help="sweep batch sizes and report the optimal one",
        epilog="example: memorymark analyze bert --gpu a10 --current-batch 16; "
        "memorymark analyze llama-3.1-8b --find seq-len --batch-size 1 --precision bf16-true "
        "--lora-rank 16 --grad-checkpointing --kernels liger --gpu a100-80gb; on 8 GPUs: "
        "memorymark analyze llama-3.1-8b --gpu h100 --dist fsdp --gpus 8",
    )
    _add_workload_flags(analyze)
    setting_flags.add_setting_flags(analyze, setting_flags.SEARCH_FLAGS)
    analyze.add_argument(
        "--format",
        choices=("json", "text", "markdown", "hf", "lightning", "torch"),
        help="markdown prints a one-page report to paste into an issue; hf, lightning or torch "
        "print ready-to-paste training settings for the result",
    )
    analyze.add_argument(
        "--no-save",
        action="store_true",
        help="do not save this run to the history (MEMORYMARK_DB, see `memorymark history`)",
    )
    costs = Costs()
    analyze.add_argument(
        "--price", type=number, metavar="USD_PER_HOUR", help=setting_flags.help_text("usd_per_hour")
    )
    for name in ("hours_per_run", "runs_per_year"):
        analyze.add_argument(
            flag_of(name),
            type=number,
            default=getattr(costs, name),
            help=setting_flags.help_text(name),
        )


def _add_measure(sub: Any) -> None:
    """The `measure` command, under the CLI's subparsers `sub`."""
    measure = sub.add_parser(
        "measure",
        help="measure one training step at one batch size",
        epilog="example: memorymark measure gpt2 --batch-size 8 --json",
    )
    _add_workload_flags(measure)
    measure.add_argument("--batch-size", type=batch_size, required=True)


def _add_validate_backward(sub: Any) -> None:
    """The `validate-backward` command, under the CLI's subparsers `sub`."""
    proof = sub.add_parser(
        "validate-backward",
        help="forward-only vs forward+backward vs the full training step",
        epilog="example: memorymark validate-backward bert --batch-size 16",
    )
    _add_workload_flags(proof)
    proof.add_argument("--batch-size", type=batch_size, default=16)
    proof.add_argument(
        "--sweeps",
        action="store_true",
        help="also find the max batch each protocol would recommend",
    )


def _add_compare(sub: Any) -> None:
    """The `compare` command, under the CLI's subparsers `sub`."""
    compare = sub.add_parser(
        "compare",
        help="the largest batch on every catalog GPU (simulated), with time and cost per run",
        epilog="example: memorymark compare bert --current-batch 16 --hours-per-run 10 --tf32",
    )
    _add_workload_flags(compare)
    setting_flags.add_setting_flags(compare, ("current_batch", "max_batch", "margin"))
    compare.add_argument(
        "--hours-per-run",
        type=number,
        default=Costs().hours_per_run,
        help=setting_flags.help_text("hours_per_run"),
    )


def _add_layouts(sub: Any) -> None:
    """The `layouts` command, under the CLI's subparsers `sub`: FSDP beside tensor, pipeline
    and context parallelism on a GPU count (or the fewest GPUs, by default)."""
    layouts = sub.add_parser(
        "layouts",
        help="the data x tensor x pipeline layouts of N GPUs that train, best first (or the "
        "fewest GPUs and their layout)",
        epilog="example: memorymark layouts llama-3.1-70b --gpu h100 --gpus 256 --seq-len 8192 "
        "--target-batch 1024",
    )
    _add_workload_flags(layouts)
    setting_flags.add_setting_flags(
        layouts, ("strategy", "step", "max_batch", "time_limit_seconds", "margin", "target_batch")
    )
    layouts.add_argument(
        "--price", type=number, metavar="USD_PER_HOUR", help=setting_flags.help_text("usd_per_hour")
    )
    layouts.add_argument(
        "--samples-per-run",
        type=number,
        default=1e6,
        help="samples a run trains on, for each layout's estimated cost per run (default 1e6)",
    )
    # Many GPUs by default: FSDP over what the degrees leave, the fewest GPUs unless --gpus N.
    layouts.set_defaults(dist="fsdp", gpus="auto")


def _add_calibrate(sub: Any) -> None:
    """The `calibrate` command, under the CLI's subparsers `sub`: it takes no model, so none of
    the workload flags, and lists of each setting it crosses."""
    d = Settings()
    calibrate = sub.add_parser(
        "calibrate",
        help="measured vs simulated memory on this machine's CUDA GPU, stamped for docs/",
        epilog="example: memorymark calibrate --models bert gpt2 --batch-sizes 8 16 "
        "--precisions 32-true bf16-mixed --emulate-gpu T4",
    )
    calibrate.add_argument(
        "--models", nargs="+", default=["bert", "gpt2", "resnet"], help="catalog models"
    )
    calibrate.add_argument("--batch-sizes", nargs="+", type=batch_size, default=[4, 8, 16])
    calibrate.add_argument(
        "--precisions", nargs="+", choices=choices.PRECISIONS, default=[d.workload.precision]
    )
    calibrate.add_argument(
        "--optimizers",
        nargs="+",
        default=[d.workload.optimizer],
        help="adamw, adamw-fused, sgd, ...",
    )
    calibrate.add_argument(
        "--grad-checkpointing",
        nargs="*",
        choices=("off", "on"),
        default=["off"],
        help="alone: on; or a list, e.g. off on (default off)",
    )
    calibrate.add_argument(
        "--protocols",
        nargs="+",
        choices=choices.PROTOCOLS,
        default=list(choices.PROTOCOLS),
    )
    for name, kind in (
        ("seq_len", positive_whole_number),
        ("image_size", positive_whole_number),
        ("lora_rank", whole_number),
    ):
        calibrate.add_argument(
            flag_of(name),
            type=kind,
            default=getattr(d.workload, name),
            help=setting_flags.help_text(name),
        )
    calibrate.add_argument(
        "--emulate-gpu",
        metavar="NAME",
        help="cap this GPU at a smaller catalog GPU's capacity and check the predicted boundary",
    )
    calibrate.add_argument(
        "--step",
        type=positive_whole_number,
        default=d.search.step,
        help="search step of the boundary check",
    )
    calibrate.add_argument(
        "--steps",
        type=positive_whole_number,
        default=5,
        help="consecutive steps each probe runs on the GPU, the simulation replaying the same "
        "(the row's measured figure is their peak)",
    )
    calibrate.add_argument(
        "--out", default="calibration", help="folder for <gpu>-<date>.csv and .json"
    )
    calibrate.add_argument("--json", action="store_true", help="print the rows as JSON")


def _add_listings(sub: Any) -> None:
    """The `models` and `gpus` commands, under the CLI's subparsers `sub`."""
    for name, what in (("models", "the built-in models"), ("gpus", "the GPU catalog")):
        listing = sub.add_parser(name, help=f"list {what}", epilog=f"example: memorymark {name}")
        listing.add_argument("--json", action="store_true", help="print JSON")


def _model_spec(args: argparse.Namespace) -> str | None:
    if getattr(args, "training", None):
        if args.model or args.config_file:
            raise ValueError("give either MODEL, --config-file or --training, not two")
        return None  # the training job's own code says the model
    if args.config_file and args.model:
        raise ValueError("give either MODEL or --config-file, not both")
    if args.config_file:
        # Absolute: the run is saved with its model name, and read back from elsewhere (the
        # app's History page, `history show` in another folder).
        return f"file:{Path(args.config_file).expanduser().absolute()}"
    if not args.model:
        raise ValueError("which model? give MODEL (see `memorymark models`) or --config-file PATH")
    return args.model


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The Settings that parsed flags describe (validation errors raise ValueError): each
    setting's flag stores under the field's own name (memorymark/cli/setting_flags.py)."""
    given = {n: getattr(args, n) for n in FIELD_NAMES if n != "model" and hasattr(args, n)}
    model = _model_spec(args)
    settings = Settings(**given) if model is None else Settings(model=model, **given)
    return settings.with_protocol(args.protocol) if args.protocol else settings


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the process exit status."""
    # transformers logs advice meant for model authors (unset loss_type, ...) on stderr; on a
    # command line it reads like an error. Users can still raise it with TRANSFORMERS_VERBOSITY.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    args = build_parser().parse_args(argv)
    if args.command == "history":  # reads the database: no engine, no torch
        try:
            return history.run(args)
        except (ValueError, HistoryError) as exc:
            return _fail(str(exc), EXIT_BAD_INPUT)
    if args.command in ("models", "gpus"):  # static lists: no engine, no torch
        return catalogs.run(args)
    from memorymark.cli import commands  # the engine (and torch) load only for a real command

    try:
        # Calibration takes no model; every other command trains one.
        takes_settings = args.command != "calibrate"
        return commands.run(args, settings_from_args(args) if takes_settings else None)
    except ValueError as exc:  # bad settings, unknown model or GPU
        return _fail(str(exc), EXIT_BAD_INPUT)
    except (commands.StepError, commands.NoGpuError) as exc:
        return _fail(str(exc), EXIT_STEP_FAILED)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)


def _fail(message: str, status: int) -> int:
    print(f"memorymark: error: {message.splitlines()[0] if message else 'failed'}", file=sys.stderr)
    return status
