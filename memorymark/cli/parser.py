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
from typing import NoReturn

from memorymark import models
from memorymark.cli import history
from memorymark.cli.arg_types import batch_size, number, positive_whole_number, whole_number
from memorymark.history.db_file import HistoryError
from memorymark.settings import Costs, Settings, choices

EXIT_BAD_INPUT = 2
EXIT_STEP_FAILED = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse prints the whole usage block; one line and a pointer to --help is kinder.
        self.exit(EXIT_BAD_INPUT, f"memorymark: error: {message} (see `{self.prog} --help`)\n")


def _add_workload_flags(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument(
        "model",
        nargs="?",
        help=f"a catalog model ({', '.join(models.model_keys())}), or file:PATH, hf:ORG/NAME, "
        "timm:NAME, torchvision:NAME",
    )
    p.add_argument(
        "--config-file", metavar="PATH", help="any transformers config.json (instead of MODEL)"
    )
    p.add_argument("--task", help="sequence-classification, causal-lm or image-classification")
    p.add_argument(
        "--seq-len", type=whole_number, default=d.seq_len, help="tokens per sample (text)"
    )
    p.add_argument(
        "--image-size", type=whole_number, default=d.image_size, help="pixels per side (images)"
    )
    p.add_argument(
        "--optimizer",
        default=d.optimizer,
        help="adamw (foreach, as on CUDA), adamw-fused, adamw-forloop, sgd (momentum), "
        "sgd-forloop, adafactor, bitsandbytes' adamw-8bit, paged-adamw-8bit, "
        "paged-adamw-32bit, lion-8bit, or none; HF Trainer's names (adamw_torch, "
        "adamw_torch_fused, adamw_bnb_8bit, paged_adamw_8bit, paged_adamw_32bit, lion_8bit) too",
    )
    p.add_argument(
        "--grad-accum",
        type=positive_whole_number,
        default=d.grad_accum,
        metavar="N",
        help="micro-batches whose gradients accumulate before each optimizer step",
    )
    p.add_argument(
        "--max-grad-norm",
        type=number,
        metavar="NORM",
        help="clip the gradients' total norm before the optimizer step (HF Trainer: 1.0)",
    )
    p.add_argument("--mode", default=d.mode, help="train (dropout on) or eval")
    p.add_argument("--loss", default=d.loss, help="task (from labels) or logits-mean")
    p.add_argument(
        "--protocol",
        choices=choices.PROTOCOLS,
        help="inference-style = eval + logits.mean() + no optimizer (what simpler "
        "tools measure); full = train + task loss + adamw",
    )
    p.add_argument("--gpu", help="a catalog GPU to simulate or check (see `memorymark gpus`)")
    p.add_argument(
        "--gpu-memory",
        type=number,
        metavar="GIB",
        help="total memory of a GPU not in the catalog, in GiB as PyTorch reports it",
    )
    p.add_argument("--backend", default=d.backend, help="auto, cuda, mps, sim or cpu")
    p.add_argument(
        "--precision",
        default=d.precision,
        help="32-true, bf16-mixed, 16-mixed (autocast) or bf16-true",
    )
    p.add_argument(
        "--attention",
        default=d.attention,
        help="sdpa (as CUDA dispatches it), eager, or flash_attention_2 (flash-attn, Ampere+)",
    )
    p.add_argument(
        "--kernels",
        default=d.kernels,
        help="none, or liger: Liger's RMSNorm, SwiGLU, RoPE and fused linear cross-entropy "
        "(causal LMs; use_liger_kernel=True)",
    )
    p.add_argument(
        "--loss-chunks",
        type=whole_number,
        default=d.loss_chunks,
        metavar="N",
        help="output layer and cross-entropy in N sequence chunks, each upcast to fp32 alone "
        "(torchtune's CEWithChunkedOutputLoss); 0: one loss over all logits",
    )
    p.add_argument(
        "--grad-checkpointing",
        action="store_true",
        help="recompute activations in backward (the model's own switch)",
    )
    p.add_argument(
        "--lora-rank", type=whole_number, default=0, help="LoRA adapters of this rank (peft)"
    )
    p.add_argument(
        "--lora-targets",
        default="",
        help="comma-separated modules LoRA adapts (default: per model)",
    )
    p.add_argument(
        "--quantization",
        default=d.quantization,
        help="base weights as bitsandbytes stores them: none, nf4 or fp4 (4-bit, QLoRA; "
        "needs --lora-rank) or int8 (LLM.int8())",
    )
    p.add_argument(
        "--double-quant",
        action="store_true",
        help="4-bit only: quantize the quantization statistics too (bnb_4bit_use_double_quant)",
    )
    p.add_argument(
        "--forward-only", action="store_true", help="only the forward pass, under no_grad"
    )
    _add_distribution_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")


def _add_distribution_flags(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument(
        "--dist",
        default=d.dist,
        help="none (one GPU), ddp, zero1 (DDP + ZeroRedundancyOptimizer), fsdp (FSDP2, "
        "ZeRO-3), fsdp-no-reshard (ZeRO-2) or hsdp (shard in a node, replicate across)",
    )
    p.add_argument(
        "--gpus",
        default=d.gpus,
        metavar="N|auto",
        help="GPUs of the kind named (up to 1024); auto: the fewest that train batch 1",
    )
    p.add_argument(
        "--nodes",
        type=positive_whole_number,
        metavar="M",
        help="nodes the GPUs span (default: 8 a node)",
    )
    p.add_argument("--offload", default=d.offload, help="none, or cpu: FSDP2's CPUOffloadPolicy")
    p.add_argument(
        "--mp-policy",
        default=d.mp_policy,
        help="auto: FSDP2 computes in the --precision's dtype and reduces in fp32; none",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command (the README lists each of its options)."""
    parser = _Parser(prog="memorymark", description="Find the largest batch size that trains.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    d = Settings()

    analyze = sub.add_parser(
        "analyze",
        help="sweep batch sizes and report the optimal one",
        epilog="example: memorymark analyze bert --gpu a10 --current-batch 16; "
        "memorymark analyze llama-3.1-8b --find seq-len --batch-size 1 --precision bf16-true "
        "--lora-rank 16 --grad-checkpointing --kernels liger --gpu a100-80gb; on 8 GPUs: "
        "memorymark analyze llama-3.1-8b --gpu h100 --dist fsdp --gpus 8",
    )
    _add_workload_flags(analyze)
    analyze.add_argument(
        "--find",
        default=d.find,
        help="batch (the largest batch at --seq-len) or seq-len (the longest sequence that "
        "trains at --batch-size)",
    )
    analyze.add_argument(
        "--seq-step",
        type=positive_whole_number,
        default=d.seq_step,
        metavar="TOKENS",
        help="granularity of a seq-len search, in tokens",
    )
    analyze.add_argument("--strategy", default=d.strategy, help="fast (default) or linear")
    analyze.add_argument(
        "--step", type=positive_whole_number, default=d.step, help="batch granularity"
    )
    analyze.add_argument(
        "--current-batch",
        "--batch-size",
        dest="current_batch",
        type=positive_whole_number,
        default=d.current_batch,
        help="the batch size you train with today (--find seq-len: the batch it searches at)",
    )
    analyze.add_argument(
        "--max-batch",
        type=positive_whole_number,
        default=d.max_batch,
        help="never try a larger batch",
    )
    analyze.add_argument(
        "--time-limit",
        type=number,
        metavar="SECONDS",
        help="stop the sweep before a probe that would pass this wall time (a partial answer)",
    )
    analyze.add_argument(
        "--max-probes",
        type=positive_whole_number,
        metavar="N",
        help="stop the sweep after this many probes (a partial answer)",
    )
    analyze.add_argument(
        "--margin",
        default=d.margin,
        help='headroom kept free below usable memory: "2%%" or "512MiB"',
    )
    analyze.add_argument(
        "--target-batch",
        type=positive_whole_number,
        help="the global batch you want: plan micro-batch x gradient accumulation for it",
    )
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
    analyze.add_argument(
        "--price",
        type=number,
        metavar="USD_PER_HOUR",
        help="price of one GPU-hour (default: the GPU catalog's)",
    )
    analyze.add_argument("--hours-per-run", type=number, default=Costs().hours_per_run)
    analyze.add_argument("--runs-per-year", type=number, default=Costs().runs_per_year)

    measure = sub.add_parser(
        "measure",
        help="measure one training step at one batch size",
        epilog="example: memorymark measure gpt2 --batch-size 8 --json",
    )
    _add_workload_flags(measure)
    measure.add_argument("--batch-size", type=batch_size, required=True)

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
        "--precisions", nargs="+", choices=choices.PRECISIONS, default=[d.precision]
    )
    calibrate.add_argument(
        "--optimizers", nargs="+", default=[d.optimizer], help="adamw, adamw-fused, sgd, ..."
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
    calibrate.add_argument("--seq-len", type=positive_whole_number, default=d.seq_len)
    calibrate.add_argument("--image-size", type=positive_whole_number, default=d.image_size)
    calibrate.add_argument("--lora-rank", type=whole_number, default=d.lora_rank)
    calibrate.add_argument(
        "--emulate-gpu",
        metavar="NAME",
        help="cap this GPU at a smaller catalog GPU's capacity and check the predicted boundary",
    )
    calibrate.add_argument(
        "--step",
        type=positive_whole_number,
        default=d.step,
        help="search step of the boundary check",
    )
    calibrate.add_argument(
        "--out", default="calibration", help="folder for <gpu>-<date>.csv and .json"
    )
    calibrate.add_argument("--json", action="store_true", help="print the rows as JSON")

    history.add_parser(sub)

    for name, what in (("models", "the built-in models"), ("gpus", "the GPU catalog")):
        listing = sub.add_parser(name, help=f"list {what}", epilog=f"example: memorymark {name}")
        listing.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _model_spec(args: argparse.Namespace) -> str:
    if args.config_file and args.model:
        raise ValueError("give either MODEL or --config-file, not both")
    if args.config_file:
        return f"file:{args.config_file}"
    if not args.model:
        raise ValueError("which model? give MODEL (see `memorymark models`) or --config-file PATH")
    return args.model


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The Settings that parsed flags describe (validation errors raise ValueError)."""
    fields = {
        "model": _model_spec(args),
        "task": args.task,
        "seq_len": args.seq_len,
        "image_size": args.image_size,
        "optimizer": args.optimizer,
        "mode": args.mode,
        "loss": args.loss,
        "gpu": args.gpu,
        "gpu_memory_gib": args.gpu_memory,
        "backend": args.backend,
        "precision": args.precision,
        "attention": args.attention,
        "kernels": args.kernels,
        "loss_chunks": args.loss_chunks,
        "grad_checkpointing": args.grad_checkpointing,
        "lora_rank": args.lora_rank,
        "lora_targets": args.lora_targets,
        "quantization": args.quantization,
        "double_quant": args.double_quant,
        "grad_accum": args.grad_accum,
        "max_grad_norm": args.max_grad_norm,
        "dist": args.dist,
        "gpus": args.gpus,
        "nodes": args.nodes,
        "offload": args.offload,
        "mp_policy": args.mp_policy,
    }
    for name in (
        "strategy",
        "step",
        "current_batch",
        "max_batch",
        "margin",
        "target_batch",
        "forward_only",
        "max_probes",
        "find",
        "seq_step",
    ):
        if hasattr(args, name):
            fields[name] = getattr(args, name)
    if hasattr(args, "time_limit"):
        fields["time_limit_seconds"] = args.time_limit
    settings = Settings(**fields)
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
    from memorymark.cli import commands  # the engine (and torch) load only for a real command

    try:
        # Catalog and calibration commands take no model; every other one trains one.
        takes_settings = args.command not in ("models", "gpus", "calibrate")
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
