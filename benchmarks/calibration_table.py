"""Prints the calibration accuracy tables from docs/calibration/*.csv, as markdown.

`--summary` (what the README shows): per GPU (and the GPU it was capped to emulate), how many
rows, the median and worst relative error of the predicted allocated and reserved peaks, and how
often the simulation and the GPU agreed on the step running, with every disagreement listed.
Without it, every row contributed from a real GPU (`memorymark calibrate --out
docs/calibration`): GPU, model, settings, batch (and which boundary it checks), measured against
predicted reserved memory in GiB, the relative error, and the verdicts. With no CSV there it
says "no calibration data yet". Reads the files only: no torch, nothing is measured.

`--repredict` re-simulates every committed row (the CSVs and the steady-state lines of
benchmarks/steady_state.py) with the current engine, each as it ran: its GPU's kernels at the
capacity it was capped at, the same steps (memorymark/calibration/evidence.py reads the rows
back, memorymark/calibration/repredict.py re-simulates them). It prints the allocated and
reserved error, verdict agreement for boundary rows apart from rows far below capacity, every
disagreement, the recommended batches that needed an allocation retry on the GPU, and each loop
step by step; progress goes to stderr. `--only` keeps the rows judged against
a GPU's capacity (`--only a10`) or from files whose name holds a word (`--only steady-state`),
`--limit N` the first N. Each row is replayed started as it ran (the rows of 2026-11-23 as
probes: state primed, the cache emptied before step 1); `--loop-start "training loop"` replays
every row as the loop people write starts instead, to see how far that model is from what a
probe measured. It takes minutes (a few seconds a row on two cores).

`--write` puts the `--summary` table into the README, docs/accuracy.md and docs/calibration's
README, and rewrites the latter's evidence section from the evidence run's files
(benchmarks/evidence/summary.py): the one command after committing `make gpu-evidence`'s files.
Only calibration CSVs are read as rows (a peers table is not), and a folder holding a dry run's
files (`make gpu-evidence DRY=1`: no measurements) is refused in one line.

    python benchmarks/calibration_table.py [--dir docs/calibration] [--summary | --write]
    python benchmarks/calibration_table.py --repredict --only a10 steady-state [--limit 10]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from memorymark import gpus
from memorymark.accounting.allocator import LOOP_STARTS, loop_start_named
from memorymark.environment import package_version, torch_version
from memorymark.units import gib

if TYPE_CHECKING:  # torch loads only for --repredict
    from memorymark.calibration.evidence import Evidence
    from memorymark.calibration.loop import StepPeaks
    from memorymark.calibration.repredict import Reprediction

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "docs" / "calibration"
HEADER = (
    "| GPU | model | settings | batch | measured reserved GiB | predicted reserved GiB "
    "| error | verdict |",
    "| --- | --- | --- | --- | ---: | ---: | ---: | --- |",
)


DRY_PREFIX = "DRY RUN"
"""How a dry evidence run (benchmarks/gpu_evidence.py --dry) names its device: never data."""


class DryRunError(ValueError):
    """A dry run's files are in the folder: they are no measurements."""


def calibration_files(folder: Path) -> list[Path]:
    """The CSVs in `folder` that hold calibration rows (not the peers' or other tables), in
    name order (GPU, then date)."""
    files = []
    for path in sorted(folder.glob("*.csv")):
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        if "measured_allocated_bytes" in header:
            files.append(path)
    return files


def load(folder: Path) -> list[dict[str, str]]:
    """Every row of every calibration CSV in `folder`, files in name order (GPU, then date).
    Raises DryRunError when a dry run's rows are among them."""
    rows: list[dict[str, str]] = []
    for path in calibration_files(folder):
        with path.open(newline="") as f:
            rows.extend(csv.DictReader(f))
    dry = sorted({r["gpu_name"] for r in rows if r["gpu_name"].startswith(DRY_PREFIX)})
    dry += sorted(p.name for p in folder.glob("*dry-run*"))
    if dry:
        raise DryRunError(
            f"{folder} holds a dry run's files ({dry[0]}): they are no measurements; remove "
            "the *dry-run* files"
        )
    return rows


def settings_label(row: dict[str, str]) -> str:
    """The settings that shape the step, short: "full bf16-mixed adamw, checkpointing, seq 128"."""
    parts = [f"{row['protocol']} {row['precision']} {row['optimizer']}"]
    if row.get("quantization") not in (None, "", "none"):
        parts.append(row["quantization"])
    if row.get("kernels"):
        parts.append(row["kernels"])
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
    """The summary's group: the GPU (as the one it emulated), what else shaped the step
    (quantization, kernels, a bitsandbytes optimizer) and a cap other than the memory fraction;
    columns a file written before them lacks read as their defaults."""
    name = row["gpu_name"] + (f" as {row['emulated_gpu']}" if row["emulated_gpu"] else "")
    if row.get("cap_method") == "ballast":
        name += " (cudaMalloc ballast)"
    optimizer = row["optimizer"]
    bitsandbytes = "8bit" in optimizer or optimizer.startswith("paged")
    extras = [row.get("quantization") or "none", row.get("kernels") or ""]
    extras += [optimizer] if bitsandbytes else []
    extras = [e for e in extras if e not in ("", "none")]
    return name + (f", {', '.join(extras)}" if extras else "")


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


# -- --repredict --------------------------------------------------------------------------------
def evidence(folder: Path = DEFAULT_DIR) -> list[Evidence]:
    """Every committed real run in `folder`: the CSV rows, then the steady-state lines."""
    from memorymark.calibration.evidence import from_csv_row, from_steady_state

    rows: list[Evidence] = []
    for path in calibration_files(folder):
        with path.open(newline="") as f:
            rows += [from_csv_row(r, path.name) for r in csv.DictReader(f)]
    for path in sorted(folder.glob("steady-state-*.jsonl")):
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        rows += [from_steady_state(json.loads(line), path.name) for line in lines]
    return rows


def select(
    rows: Iterable[Evidence], only: Sequence[str] = (), limit: int | None = None
) -> list[Evidence]:
    """The rows `--only` keeps (each word a GPU whose capacity judged the row, else a part of
    the file name; any word matches), the first `limit` of them."""
    kept = [r for r in rows if not only or any(_matches(r, word) for word in only)]
    return kept[:limit] if limit is not None else kept


def _matches(row: Evidence, word: str) -> bool:
    try:
        gpu = gpus.find_gpu(word)
    except gpus.UnknownGPUError:
        return word.lower() in row.source.lower()
    return gpus.find_gpu(row.capped_as or row.device_gpu.name).name == gpu.name


def _progress(total: int) -> Callable[[Reprediction], None]:
    """A line on stderr as each row is re-predicted."""
    done = iter(range(1, total + 1))

    def report(r: Reprediction) -> None:
        line = f"[{next(done)}/{total}] {r.evidence.label}: {_verdicts(r)} ({r.seconds:.1f} s)"
        print(line, file=sys.stderr, flush=True)

    return report


def repredicted(
    results: Sequence[Reprediction], seconds: float, loop_start: str | None = None
) -> str:
    """The markdown report of `--repredict` (`loop_start`: how every row was replayed, when
    not as it ran)."""
    from memorymark.calibration import repredict as rp

    done = [r for r in results if r.error is None]
    boundary, far = rp.near_capacity(done)
    ran_under = sorted({r.evidence.torch_version or "not recorded" for r in results})
    started = sorted({r.evidence.loop_start for r in results})
    began = (
        f"every row replayed as a {loop_start} starts (the GPU ran {', '.join(started)})"
        if loop_start
        else f"each started as it ran ({', '.join(started)})"
    )
    lines = [
        f"Re-predicted {len(done)} of {len(results)} rows with the current engine in "
        f"{seconds:.0f} s: each as it ran (its GPU's kernels at its capacity, its torch's cuBLAS "
        f"workspaces), {began}; bytes over the steps the GPU's figures are the peak of (the "
        "first step in files from before loops were measured), verdicts over the steps it "
        f"ran. Simulated under torch {torch_version()}, transformers "
        f"{package_version('transformers')}; the rows ran under torch {', '.join(ran_under)}.",
        "",
        "| rows | count | allocated error, median / worst | reserved error, median / worst "
        "| verdicts agree |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, group in (("boundary", boundary), ("far below capacity", far), ("all", done)):
        agree = sum(r.agrees for r in group)
        lines.append(
            f"| {name} | {len(group)} | {_stats(r.allocated_error for r in group)} "
            f"| {_stats(r.reserved_error for r in group)} | {agree} of {len(group)} |"
        )
    lines += ["", f"Definition: {rp.BOUNDARY_DEFINITION}."]
    for name in ("allocated", "reserved"):
        worst = max(done, key=lambda r: abs(getattr(r, f"{name}_error") or 0), default=None)
        error = getattr(worst, f"{name}_error", None)
        if worst is not None and error is not None:
            lines.append(f"Worst {name} error: {100 * error:+.1f}%, {worst.evidence.label}.")
    disagree = [r for r in done if not r.agrees]
    lines += ["", f"Verdicts that disagree: {len(disagree) or 'none'}"]
    lines += [f"- {r.evidence.label}: {_verdicts(r)}" for r in disagree]
    retried = rp.recommended_with_retries(done)
    lines += ["", f"Recommended batches that needed a retry on the GPU: {len(retried) or 'none'}"]
    lines += [
        f"- {r.evidence.label}: {r.evidence.measured_retries} retries on the GPU; re-predicted "
        f"recommended, retries per step {_retries(r.loop.steps)}"
        for r in retried
        if r.loop is not None
    ]
    failed = [r for r in results if r.error is not None]
    if failed:
        lines += ["", f"Not re-predicted: {len(failed)}"]
        lines += [f"- {r.evidence.label}: {r.error}" for r in failed]
    return "\n".join([*lines, *_loops(done)])


def _loops(results: Sequence[Reprediction]) -> list[str]:
    """Each loop measured step by step, beside its replay: reserved GiB [retries] per step."""
    stepped = [r for r in results if r.evidence.measured_steps and r.loop is not None]
    if not stepped:
        return []
    lines = [
        "",
        "Loops step by step: reserved GiB [allocation retries] of each step, OOM where one ran "
        "out of memory.",
        "",
        "| row | on the GPU | re-predicted | verdicts |",
        "| --- | --- | --- | --- |",
    ]
    for r in stepped:
        steps = r.loop.steps if r.loop is not None else ()
        lines.append(
            f"| {r.evidence.label} | {_steps(r.evidence.measured_steps)} | {_steps(steps)} "
            f"| {_verdicts(r)} |"
        )
    return lines


def _steps(steps: Iterable[StepPeaks]) -> str:
    return ", ".join(
        f"{'OOM' if s.oom else f'{gib(s.reserved_bytes or 0):.3f}'} [{s.retries}]" for s in steps
    )


def _retries(steps: Iterable[StepPeaks]) -> str:
    return " ".join(str(s.retries) for s in steps)


def _verdicts(r: Reprediction) -> str:
    if r.loop is None:
        return f"not re-predicted: {r.error}"
    measured = _outcome(r.evidence.measured_runs, r.evidence.measured_steps)
    predicted = _outcome(r.loop.runs, r.loop.steps)
    if r.agrees and measured != predicted:  # both OOM, at different steps
        return f"agree: OOM (on the GPU {measured}, re-predicted {predicted})"
    if r.agrees:
        return f"agree: {measured}"
    return f"DISAGREE: measured {measured}, re-predicted {predicted}"


def _outcome(runs: bool, steps: Sequence[StepPeaks]) -> str:
    if runs:
        return "runs"
    oom = next((s.step for s in steps if s.oom), None)
    return f"OOM at step {oom}" if oom else "OOM"


def _stats(errors: Iterable[float | None]) -> str:
    from memorymark.calibration.repredict import error_stats

    stats = error_stats(errors)
    if stats is None:
        return "n/a"
    median, worst = stats
    return f"{100 * median:.1f}% / {100 * worst:+.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="folder of calibration CSVs")
    parser.add_argument("--summary", action="store_true", help="per-GPU accuracy, not every row")
    parser.add_argument(
        "--repredict", action="store_true", help="re-simulate every row with today's engine"
    )
    parser.add_argument(
        "--only", nargs="+", default=(), metavar="WORD", help="a GPU (a10) or a file-name part"
    )
    parser.add_argument("--limit", type=int, default=None, help="re-simulate the first N rows")
    parser.add_argument(
        "--write",
        action="store_true",
        help="rewrite the READMEs' accuracy tables and docs/calibration's evidence section",
    )
    parser.add_argument(
        "--loop-start",
        default=None,
        choices=list(LOOP_STARTS),
        help="replay every row started this way, not as it ran",
    )
    args = parser.parse_args()
    try:
        load(args.dir)
    except DryRunError as exc:
        parser.exit(2, f"error: {exc}\n")
    if args.write:
        from benchmarks.evidence.summary import write_readmes

        for path in write_readmes(args.dir, summary(args.dir)):
            print(f"rewrote {path}")
        return
    if not args.repredict:
        print(summary(args.dir) if args.summary else table(args.dir))
        return
    from memorymark.calibration.repredict import repredict

    began = loop_start_named(args.loop_start) if args.loop_start else None
    rows = select(evidence(args.dir), args.only, args.limit)
    start = time.perf_counter()
    results = list(repredict(rows, _progress(len(rows)), began))
    print(repredicted(results, time.perf_counter() - start, args.loop_start))


if __name__ == "__main__":
    main()
