"""Prints what sizing a big model costs here, with the depth replay and without: whole CLI runs
as ratios to a raw fake step timed in the same run, and one step's process RSS.

This machine is shared and noisy, so no figure is an absolute time alone: each whole process is
bracketed by two untracked ("raw") fake training steps of Llama-3.2-1B at batch 16 taken right
before and right after it, and divided by their mean (the seconds are printed too). Each case
runs as `python -m memorymark analyze ... --json` twice: `--depth trace` (every block traced,
what MemoryMark did before the depth replay) and `--depth replay` (the default), and their
answers (recommended and maximum batch, GPU count, the ways out) must agree.

Cases (issue 31's targets on a 2-core machine: the first two under 30 s, the 405B one under
60 s, each as a whole process):
- 70b-a10: `analyze llama-3.1-70b --gpu a10`, ways out included;
- 70b-fsdp: `analyze llama-3.1-70b --gpu h100 --precision bf16-mixed --seq-len 2048
  --grad-checkpointing --dist fsdp --gpus auto`;
- 405b-fsdp: the same on a config with Llama-3.1-405B's dimensions
  (benchmarks/configs/llama-3.1-405b.json), bf16-true.

`--one-process` also runs each replay with the depth worker off (every shallower build traced
in the one process, as before 2026-11-28): the worker uses this machine's second core, so its
ratio to a one-core raw step counts two cores' work in one wall time. `--steps` also prints one
simulated step of each model in a fresh process: seconds, RSS and the simulated peak (fake
tensors allocate nothing: a 70B step must stay within a few GB).

    PYTHONPATH=. python benchmarks/big_models.py [--cases 70b-a10 70b-fsdp 405b-fsdp]
        [--after-only] [--one-process] [--steps]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from memorymark import Session, Settings

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIG_405B = HERE / "configs" / "llama-3.1-405b.json"
CASES: dict[str, list[str]] = {
    "70b-a10": ["llama-3.1-70b", "--gpu", "a10"],
    "70b-fsdp": ["llama-3.1-70b", "--gpu", "h100", "--precision", "bf16-mixed", "--seq-len",
                 "2048", "--grad-checkpointing", "--dist", "fsdp", "--gpus", "auto"],
    "405b-fsdp": [f"file:{CONFIG_405B}", "--gpu", "h100", "--precision", "bf16-true",
                  "--seq-len", "2048", "--grad-checkpointing", "--dist", "fsdp", "--gpus", "auto"],
}  # fmt: skip
RAW_BATCH = 16
ONE_PROCESS = {"MEMORYMARK_DEPTH_WORKER": "0"}
"""Every depth traced in the analyzing process (memorymark/backends/depth_worker.py off)."""

_STEP_CHILD = """
import json, resource, sys, time
from memorymark import Session, Settings
start = time.perf_counter()
settings = Settings(model=sys.argv[1], seq_len=2048, precision="bf16-true", backend="sim",
                    gpu_memory_gib=2048.0, depth=sys.argv[2])
m = Session(settings).measure(1)
print(json.dumps({"seconds": time.perf_counter() - start, "peak_gib": m.peak_bytes / 2**30,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


class RawStep:
    """An untracked fake training step of Llama-3.2-1B at batch 16: the unit of every ratio."""

    def __init__(self) -> None:
        big = Settings(model="llama-3.2-1b", backend="sim", gpu_memory_gib=2048.0, depth="trace")
        self.backend = Session(big).open_backend()
        self.backend.measure(RAW_BATCH)  # builds the model and optimizer state, warms caches

    def seconds(self) -> float:
        """Wall seconds of one raw step."""
        start = time.perf_counter()
        self.backend.measure(RAW_BATCH)
        return time.perf_counter() - start


def timed_python(
    argv: list[str], what: str, env: dict[str, str] | None = None
) -> tuple[float, str]:
    """Wall seconds of `python ARGV` run from the checkout (a whole process, as a user's),
    and what it printed; exits saying `what` failed, with the end of its errors."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={
            "TRANSFORMERS_VERBOSITY": "error",
            "PYTHONPATH": str(ROOT),
            **os.environ,
            **(env or {}),
        },
    )
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{what} failed: {proc.stderr.strip()[-600:]}")
    return seconds, proc.stdout


def _process(args: list[str], env: dict[str, str] | None = None) -> tuple[float, dict[str, Any]]:
    """Wall seconds of `python -m memorymark analyze ARGS --json`, and its JSON."""
    argv = ["-m", "memorymark", "analyze", *args, "--backend", "sim", "--json"]
    seconds, out = timed_python(argv, f"analyze {' '.join(args)}", env)
    return seconds, json.loads(out)


def _answer(report: dict[str, Any]) -> tuple[Any, ...]:
    """What must agree between tracing every block and replaying the depth."""
    fixes = tuple(
        (f["label"], f["gpus"], f["batch_1_required_gb"], f["fits"]) for f in report["fixes"]
    )
    return (
        report["optimal_batch_size"],
        report["max_batch_size"],
        report["max_reserved_gb"],
        report.get("gpus"),
        report.get("min_gpus"),
        fixes,
    )


def _bracketed(
    raw: RawStep, args: list[str], env: dict[str, str] | None = None
) -> tuple[float, float, dict[str, Any]]:
    """(ratio to the raw step, seconds, JSON) of one whole process."""
    before = raw.seconds()
    seconds, report = _process(args, env)
    unit = (before + raw.seconds()) / 2
    return seconds / unit, seconds, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--after-only", action="store_true", help="skip the --depth trace runs")
    parser.add_argument("--steps", action="store_true", help="also one step per model: RSS")
    parser.add_argument(
        "--one-process", action="store_true", help="also the replay without the depth worker"
    )
    args = parser.parse_args()
    raw = RawStep()
    print("whole `analyze` processes, as multiples of a raw fake step (Llama-3.2-1B, batch 16)")
    for case in args.cases:
        after = _bracketed(raw, [*CASES[case], "--depth", "replay"])
        line = f"  {case:<10} replay {after[0]:7.1f} x raw ({after[1]:6.1f} s)"
        depth = after[2].get("depth_note") or "(no depth note)"
        if args.one_process:
            alone = _bracketed(raw, [*CASES[case], "--depth", "replay"], ONE_PROCESS)
            same = _answer(alone[2]) == _answer(after[2])
            line += (
                f"   one process {alone[0]:7.1f} x raw ({alone[1]:6.1f} s)   worker "
                f"{alone[1] / after[1]:4.2f}x faster, answers {'agree' if same else 'DIFFER'}"
            )
        if not args.after_only:
            before = _bracketed(raw, [*CASES[case], "--depth", "trace"])
            same = _answer(before[2]) == _answer(after[2])
            line += (
                f"   trace {before[0]:7.1f} x raw ({before[1]:6.1f} s)   "
                f"{before[1] / after[1]:5.1f}x faster, answers {'agree' if same else 'DIFFER'}"
            )
        print(line, flush=True)
        print(f"             {depth}", flush=True)
    if args.steps:
        print("one simulated step in a fresh process (batch 1, seq 2048, bf16-true, AdamW)")
        for model in ("llama-3.1-8b", "llama-3.1-70b", f"file:{CONFIG_405B}"):
            for depth in ("replay", "trace"):
                proc = subprocess.run(
                    [sys.executable, "-c", _STEP_CHILD, model, depth],
                    capture_output=True,
                    text=True,
                    check=True,
                    env={"TRANSFORMERS_VERBOSITY": "error", **os.environ},
                )
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                print(
                    f"  {Path(model).stem:<16} {depth:<6} {r['seconds']:6.1f} s   RSS "
                    f"{r['rss_mib']:6.0f} MiB   simulated peak {r['peak_gib']:8.1f} GiB",
                    flush=True,
                )


if __name__ == "__main__":
    main()
