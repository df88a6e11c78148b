"""Prints the calibration accuracy tables from docs/calibration/*.csv, as markdown.

`--summary` (what the README shows): per GPU (and the GPU it was capped to emulate), how many
rows, the median and worst relative error of the predicted allocated and reserved peaks, and how
often the simulation and the GPU agreed on the step running, with every disagreement listed.
Without it, every row contributed from a real GPU (`memorymark calibrate --out
docs/calibration`): GPU, model, settings, batch (and which boundary it checks), measured against
predicted reserved memory in GiB, the relative error, and the verdicts. With no CSV there it
says "no calibration data yet". Reads the files only: no torch, nothing is measured.

    python benchmarks/calibration_table.py [--dir docs/calibration] [--summary]
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from memorymark.units import gib

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "docs" / "calibration"
HEADER = (
    "| GPU | model | settings | batch | measured reserved GiB | predicted reserved GiB "
    "| error | verdict |",
    "| --- | --- | --- | --- | ---: | ---: | ---: | --- |",
)


def load(folder: Path) -> list[dict[str, str]]:
    """Every row of every CSV in `folder`, files in name order (GPU, then date)."""
    rows: list[dict[str, str]] = []
    for path in sorted(folder.glob("*.csv")):
        with path.open(newline="") as f:
            rows.extend(csv.DictReader(f))
    return rows


def settings_label(row: dict[str, str]) -> str:
    """The settings that shape the step, short: "full bf16-mixed adamw, checkpointing, seq 128"."""
    parts = [f"{row['protocol']} {row['precision']} {row['optimizer']}"]
    if row["grad_checkpointing"] == "true":
        parts.append("checkpointing")
    if row["lora_rank"] not in ("", "0"):
        parts.append(f"LoRA r{row['lora_rank']}")
    if row["grad_accum"] not in ("", "1"):
        parts.append(f"accumulation {row['grad_accum']}")
    parts.append(f"seq {row['seq_len']}" if row["seq_len"] else f"{row['image_size']}px")
    return ", ".join(parts)


def _gib(cell: str, missing: str) -> str:
    return f"{gib(int(cell)):.3f}" if cell else missing


def _verdict(row: dict[str, str]) -> str:
    measured = "runs" if row["measured_fits"] == "true" else "OOM"
    predicted = "runs" if row["predicted_fits"] == "true" else "OOM"
    if row["verdict_agrees"] == "true":
        return f"agree: {measured}"
    return f"DISAGREE: measured {measured}, predicted {predicted}"


def table_row(row: dict[str, str]) -> str:
    """One markdown line for one calibration row."""
    gpu = row["gpu_name"] + (f" as {row['emulated_gpu']}" if row["emulated_gpu"] else "")
    batch = row["batch_size"] + (f" ({row['boundary_check']})" if row["boundary_check"] else "")
    error = row["reserved_error"]
    cells = (
        gpu,
        row["model"],
        settings_label(row),
        batch,
        _gib(row["measured_reserved_bytes"], "OOM"),
        _gib(row["predicted_reserved_bytes"], "n/a"),
        f"{100 * float(error):+.1f}%" if error else "n/a",
        _verdict(row),
    )
    return "| " + " | ".join(cells) + " |"


def table(folder: Path = DEFAULT_DIR) -> str:
    """The markdown table of every calibration row in `folder`, or a line saying there is none."""
    rows = load(folder)
    if not rows:
        return "no calibration data yet"
    return "\n".join([*HEADER, *(table_row(r) for r in rows)])


def _gpu(row: dict[str, str]) -> str:
    return row["gpu_name"] + (f" as {row['emulated_gpu']}" if row["emulated_gpu"] else "")


def _errors(rows: list[dict[str, str]], column: str) -> str:
    """'median |error| / worst error' of the rows whose step ran, in percent."""
    errors = [float(r[column]) for r in rows if r[column]]
    if not errors:
        return "n/a"
    worst = max(errors, key=abs)
    return f"{100 * statistics.median(map(abs, errors)):.1f}% / {100 * worst:+.1f}%"


def summary(folder: Path = DEFAULT_DIR) -> str:
    """Per-GPU accuracy (median and worst error, verdict agreement) and every disagreement."""
    rows = load(folder)
    if not rows:
        return "no calibration data yet"
    groups: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        groups.setdefault(_gpu(row), []).append(row)
    lines = [
        "| GPU | rows | allocated error, median / worst | reserved error, median / worst "
        "| verdicts agree |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, group in [*groups.items(), ("all", rows)]:
        agree = sum(r["verdict_agrees"] == "true" for r in group)
        lines.append(
            f"| {name} | {len(group)} | {_errors(group, 'allocated_error')} "
            f"| {_errors(group, 'reserved_error')} | {agree} of {len(group)} |"
        )
    disagreements = [r for r in rows if r["verdict_agrees"] != "true"]
    lines += ["", f"Verdicts that disagree: {len(disagreements) or 'none'}"]
    lines += [
        f"- {_gpu(r)}, {r['model']}, {settings_label(r)}, batch {r['batch_size']}"
        + (f" ({r['boundary_check']})" if r["boundary_check"] else "")
        + f": {_verdict(r).removeprefix('DISAGREE: ')}"
        for r in disagreements
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="folder of calibration CSVs")
    parser.add_argument("--summary", action="store_true", help="per-GPU accuracy, not every row")
    args = parser.parse_args()
    print(summary(args.dir) if args.summary else table(args.dir))


if __name__ == "__main__":
    main()
