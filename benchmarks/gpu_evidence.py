"""The real-GPU evidence in one command, for the next session that is lent a GPU.

    make gpu-evidence OUT=DIR [BUNDLE=FILE.tar.gz] [CHUNKS="capped loops"] [DRY=1]
    PYTHONPATH=. python3 benchmarks/gpu_evidence.py --out DIR [--bundle FILE] [--chunks ...] [--dry]

A smoke test first (versions, one row, a ballast taken and given back), then the chunks in
priority order, each in a process of its own with its own time limit, none started once the
budget (540 s: a rerun still fits a 15-minute lease) is spent. Each chunk writes its files as
it finishes; the manifest `evidence-<gpu>-<date>.json` says what ran, how long, what was
skipped and why, and the bundle (one file, as the device tool returns at most 8) is rewritten
after every chunk. DIR/calibration/ is what gets committed: one copy into docs/calibration/,
then `python benchmarks/calibration_table.py --write` regenerates the README's accuracy tables.
DIR/logs/ holds each chunk's output.

`--dry` runs every chunk's code on CPU: a fake CUDA device named "DRY RUN ...", tiny models,
small custom capacities, real CPU kernels where they can run a step and the simulation where only
CUDA could; every file it writes is named `...dry-run-...` and says `dry_run`.

The device tool's call (docs/development.md, "The evidence run"). Here, once:

    make evidence-wheels   # bitsandbytes 0.50.2, liger-kernel 0.8.5, torchao 0.18.0 into .whl/

CARRY = [".whl"]   (lightning and accelerate are in the device image; flash-attn has no wheel)

    run(carry=[".whl"], timeout_s=600, command=
      "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;
       make gpu-evidence OUT=/tmp/evidence BUNDLE=$OUT/evidence.tar.gz")

then `tar -xzf <files_at>/evidence.tar.gz -C /tmp/evidence-back` and copy its calibration/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUDGET_SECONDS = 540
"""Nine minutes: the device tool's command limit is ten, and a lease's fifteen must hold a
machine's start, this run and, if it fails early, a rerun of what is left."""
START_MARGIN_SECONDS = 20
"""No chunk starts with less than this left of the budget."""


@dataclass(frozen=True)
class Chunk:
    """One part of the run: its name, its time limit, the function that runs it."""

    name: str
    limit_seconds: int
    function: str
    """`module:function` under benchmarks/evidence/, or empty for a chunk that cannot run yet."""
    why_not: str = ""
    """Why a chunk with no function is skipped."""


CHUNKS = (
    Chunk("smoke", 60, "calibrated:smoke"),
    # Second: the compiled step (issue 33) has never met Inductor on a GPU.
    Chunk("compiled", 150, "calibrated:compiled"),
    Chunk("capped", 100, "calibrated:capped"),
    Chunk("quantized", 150, "calibrated:quantized"),
    Chunk("loops", 200, "loops:loops"),
    Chunk("peers", 120, "peers:peers"),
)
"""In priority order. A chunk runs for its limit or what is left of the budget, whichever is less,
so the last ones take what the first left; docs/development.md has each one's estimate."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for calibration/ and logs/")
    parser.add_argument("--dry", action="store_true", help="on CPU: fake device, tiny models")
    parser.add_argument("--budget", type=int, default=BUDGET_SECONDS, help="seconds in all")
    parser.add_argument("--chunks", nargs="+", metavar="NAME", help="run these only (smoke runs)")
    parser.add_argument("--bundle", type=Path, help="a .tar.gz of --out, rewritten per chunk")
    parser.add_argument("--day", help=argparse.SUPPRESS)
    parser.add_argument("--run-chunk", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    day = datetime.date.fromisoformat(args.day) if args.day else _today()
    if args.run_chunk:
        return run_chunk(args.run_chunk, args.out, args.dry, day)
    unknown = set(args.chunks or ()) - {c.name for c in CHUNKS}
    if unknown:
        names = ", ".join(c.name for c in CHUNKS)
        print(f"unknown chunk {', '.join(sorted(unknown))}: choose from {names}", file=sys.stderr)
        return 2
    return run_all(args.out, args.dry, args.budget, args.chunks, args.bundle, day)


def run_all(
    out: Path,
    dry: bool,
    budget: int,
    chosen: list[str] | None,
    bundle: Path | None,
    day: datetime.date,
) -> int:
    """Every chunk in order, each under its own limit and what is left of `budget`."""
    (out / "calibration").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    manifest: dict[str, Any] = {"dry_run": dry, "day": day.isoformat(), "budget_seconds": budget}
    manifest["chunks"] = chunks = {}
    start = time.monotonic()
    failed = False
    for chunk in CHUNKS:
        left = budget - (time.monotonic() - start)
        if chosen and chunk.name not in (*chosen, "smoke"):
            continue
        if not chunk.function:
            chunks[chunk.name] = {"status": "skipped", "why": chunk.why_not}
        elif failed and chunks.get("smoke", {}).get("status") != "ok":
            chunks[chunk.name] = {"status": "skipped", "why": "the smoke test did not pass"}
        elif left < START_MARGIN_SECONDS:
            chunks[chunk.name] = {"status": "skipped", "why": f"budget spent ({left:.0f} s left)"}
        else:
            limit = int(min(chunk.limit_seconds, left))
            chunks[chunk.name] = result = _run(chunk, out, dry, day, limit)
            failed = failed or result["status"] != "ok"
        print(f"== {chunk.name}: {json.dumps(chunks[chunk.name])[:300]}", flush=True)
        _save(manifest, out, bundle, time.monotonic() - start)
    return 1 if failed else 0


def _run(chunk: Chunk, out: Path, dry: bool, day: datetime.date, limit: int) -> dict[str, Any]:
    """The chunk in a process of its own (a hung or crashed chunk leaves the others' files),
    killed with its children at `limit` seconds."""
    command = [sys.executable, __file__, "--run-chunk", chunk.name, "--out", str(out)]
    command += ["--day", day.isoformat(), *(["--dry"] if dry else [])]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRANSFORMERS_VERBOSITY": "error"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    log = out / "logs" / f"{chunk.name}.log"
    started = time.monotonic()
    with log.open("w") as f:
        process = subprocess.Popen(
            command, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            code = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    seconds = round(time.monotonic() - started, 1)
    result_file = out / "logs" / f"{chunk.name}.result.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    status = "ok" if code == 0 else ("timed out" if code is None else f"failed (exit {code})")
    if code != 0:
        result["log_tail"] = log.read_text()[-2000:]
    return {"status": status, "seconds": seconds, "limit_seconds": limit, **result}


def run_chunk(name: str, out: Path, dry: bool, day: datetime.date) -> int:
    """Inside the chunk's own process: run it, write its result for the manifest."""
    import importlib

    from benchmarks.evidence import plan as plans
    from benchmarks.evidence.device import dry_device, gpu_device

    chunk = next(c for c in CHUNKS if c.name == name)
    module, function = chunk.function.split(":")
    run = getattr(importlib.import_module(f"benchmarks.evidence.{module}"), function)
    device = dry_device() if dry else gpu_device()
    plan = plans.DRY if dry else plans.GPU
    result = run(device, plan, out / "calibration", day)
    result["notes"] = sorted(set(device.notes))
    if name == "smoke":
        result["gpu_name"] = device.environment().gpu_name
        stem = _stem(result["gpu_name"], day)
        path = out / "calibration" / f"smoke-{stem}.json"
        path.write_text(json.dumps({"dry_run": dry, **result}, indent=2) + "\n")
        result = {"files": [path.name], "gpu_name": result["gpu_name"], "notes": result["notes"]}
    (out / "logs" / f"{name}.result.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _save(manifest: dict[str, Any], out: Path, bundle: Path | None, seconds: float) -> None:
    manifest["seconds"] = round(seconds, 1)
    gpu = manifest["chunks"].get("smoke", {}).get("gpu_name", "")
    name = f"evidence-{_stem(gpu, datetime.date.fromisoformat(manifest['day']))}.json"
    (out / "calibration" / name).write_text(json.dumps(manifest, indent=2) + "\n")
    if bundle is not None:
        bundle.parent.mkdir(parents=True, exist_ok=True)
        partial = bundle.with_name(bundle.name + ".partial")
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(out / "calibration", arcname="calibration")
            tar.add(out / "logs", arcname="logs")
        partial.replace(bundle)


def _stem(gpu_name: str, day: datetime.date) -> str:
    from memorymark.calibration.record import file_stem

    return file_stem(gpu_name, day=day) if gpu_name else day.isoformat()


def _today() -> datetime.date:
    return datetime.datetime.now(datetime.timezone.utc).date()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
