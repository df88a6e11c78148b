"""`memorymark models` and `memorymark gpus`: the two catalogs, printed from shipped data.

Both lists are static, so they answer without the engine or torch (loading torch alone takes
seconds): the GPU table is memorymark/gpus' records, the model table the catalog with its shipped
parameter counts (memorymark/models/parameter_counts.py).
Must not know how anything is measured, and must not import torch (tests/test_cli_catalogs.py
checks).
"""

from __future__ import annotations

import argparse
from typing import Any

from memorymark import gpus, models
from memorymark.cli import render


def run(args: argparse.Namespace) -> int:
    """Print the catalog `args.command` names ("models" or "gpus"); returns the exit status."""
    return _models(args) if args.command == "models" else _gpus(args)


def model_table() -> list[dict[str, Any]]:
    """The model catalog as rows (for `models`), parameters of each model's default task."""
    return [
        {
            "key": e.key,
            "name": e.display_name,
            "default_task": e.default_task,
            "tasks": list(e.tasks),
            "parameters": models.parameter_count(e),
            "max_positions": e.max_positions,
        }
        for e in models.CATALOG
    ]


def gpu_table() -> list[dict[str, Any]]:
    """The GPU catalog as rows (for `gpus`)."""
    return [
        {
            "name": g.name,
            "total_gb": round(g.total_gib, 2),
            "usable_gb": round(g.usable_gib, 2),
            "usd_per_hour": g.usd_per_hour,
            "bf16_tflops": g.bf16_tflops,  # null: no bf16 (compute capability below 8.0)
            "fp16_tflops": g.half_tflops,
            "tf32_tflops": None if g.tf32_tflops is None else round(g.tf32_tflops, 2),
            "fp32_tflops": g.fp32_tflops,
            "bandwidth_gb_per_s": round(g.memory_bandwidth_bytes_per_s / 1e9),
            # One direction, per GPU: NVLink or PCIe inside a node, the network between nodes.
            "intra_node_gb_per_s": round(g.intra_node_bytes_per_s / 1e9, 2),
            "inter_node_gb_per_s": round(g.inter_node_bytes_per_s / 1e9, 2),
            "aliases": g.aliases,
        }
        for g in gpus.CATALOG
    ]


def _models(args: argparse.Namespace) -> int:
    rows = model_table()
    if args.json:
        render.print_json(rows)
        return 0
    for row in rows:
        print(
            f"{row['key']:<14} {row['name']:<34} {row['parameters'] / 1e6:9.1f}M  "
            f"{row['default_task']}"
        )
    return 0


def _gpus(args: argparse.Namespace) -> int:
    rows = gpu_table()
    if args.json:
        render.print_json(rows)
        return 0
    print("Peak dense TFLOP/s from datasheets; TF32 estimated as half of fp16 (Ampere and newer).")
    print(
        f"{'GPU':<12} {'total GiB':>9} {'usable GiB':>10} {'$/hour':>7} {'bf16':>7} {'fp16':>7} "
        f"{'tf32':>7} {'fp32':>7} {'GB/s':>6}"
    )
    for row in rows:
        rates = (row[k] for k in ("bf16_tflops", "fp16_tflops", "tf32_tflops", "fp32_tflops"))
        print(
            f"{row['name']:<12} {row['total_gb']:>9} {row['usable_gb']:>10} "
            f"{row['usd_per_hour']:>7} {' '.join(f'{_rate(r):>7}' for r in rates)} "
            f"{row['bandwidth_gb_per_s']:>6}"
        )
    print("—: the GPU has no such tensor cores (bf16 and TF32 need compute capability 8.0).")
    return 0


def _rate(tflops: float | None) -> str:
    """A peak rate for the `gpus` table: `—` where the GPU has none (no bf16 before Ampere)."""
    return "—" if tflops is None else f"{tflops:g}"
