"""Prints what a simulated sweep costs, each figure a ratio of two timings taken in one run.

This machine is shared and its load changes by the minute, so no figure is an absolute time, and
no ratio divides by a step timed minutes earlier: every timing is bracketed by two untracked
("raw") fake training steps at batch 16 taken right before and right after it, and divided by
their mean. Each figure is the median of `--repeats` such ratios.

- tracking: one tracked simulated probe at batch 16, with the optimizer phase run (the
  tracker's own overhead) and spliced from its record (what a probe costs in a sweep);
- whole sweeps in this process, per strategy (`--strategies`; symbolic and fast by default),
  after one untimed sweep has paid the one-off imports: the steps traced, the optimal and max
  batch, and why the symbolic strategy traced where it would have replayed, if it did;
- whole processes, `python -m memorymark analyze MODEL --gpu GPU --json`;
- with `--analyses`, per strategy: Compare GPUs, Scale out (FSDP on 1-32 GPUs) and
  `--gpus auto` (the fewest GPUs, then the sweep on them), one bracketed ratio each;
- `--step 1` sweeps: how many probes each takes (the search, then the current batch's);
- process RSS after steps at growing batch sizes (fake tensors allocate nothing: it stays flat).

Run it with the code to measure first on the path; it times `python -m memorymark` from the same
checkout as the `memorymark` it imports:

    PYTHONPATH=. python benchmarks/sweep_cost.py [--models bert gpt2 resnet] [--gpus A10]
        [--repeats 3] [--strategies symbolic fast linear] [--no-process] [--analyses]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import memorymark
from memorymark import Session, Settings

ROOT = Path(memorymark.__file__).resolve().parents[1]
RAW_BATCH = 16


def rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class RawStep:
    """An untracked fake training step at batch 16: the unit every figure is given in."""

    def __init__(self, model: str) -> None:
        big = Settings(model=model, backend="sim", gpu_memory_gib=2048.0)
        self.backend = Session(big).open_backend()
        self.backend.measure(RAW_BATCH)  # builds the model and optimizer state, warms caches

    def seconds(self) -> float:
        """Wall seconds of one raw step."""
        backend = self.backend
        start = time.perf_counter()
        with backend._step_context():
            backend.training_step.run_step(backend._model, backend._optimizer, RAW_BATCH, "cpu")
        return time.perf_counter() - start

    def ratio(self, run: Callable[[], object]) -> float:
        """`run`'s wall seconds over the mean of raw steps timed right before and after it."""
        before = self.seconds()
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        return elapsed / ((before + self.seconds()) / 2)

    def median_ratio(self, run: Callable[[], object], repeats: int) -> float:
        """The median of `repeats` bracketed ratios of `run`."""
        return statistics.median(self.ratio(run) for _ in range(repeats))


def probe_costs(raw: RawStep, model: str, repeats: int) -> tuple[float, float]:
    """(tracked probe with the optimizer phase run, tracked probe splicing it) at batch 16, in
    raw steps."""
    big = Settings(model=model, backend="sim", gpu_memory_gib=2048.0)
    every, once = Session(big).open_backend(), Session(big).open_backend()
    every.reuse_optimizer_step = False
    every.measure(RAW_BATCH)
    once.measure(RAW_BATCH)  # records the optimizer phase
    tracked = raw.median_ratio(lambda: every.measure(RAW_BATCH), repeats)
    spliced = raw.median_ratio(lambda: once.measure(RAW_BATCH), repeats)
    every.release()
    once.release()
    return tracked, spliced


def sweep(settings: Settings) -> tuple[list[int], int | None, int | None, str | None]:
    """(batch sizes traced, optimal batch, max batch, why the symbolic strategy traced where it
    would have replayed) of one whole sweep, as `analyze` runs it."""
    session = Session(settings)
    report = session.analyze()
    best, largest = report.optimal, report.max_fit
    traced = [m.batch_size for m in session.measurements if not m.replayed]
    return (
        traced,
        best and best.batch_size,
        largest and largest.batch_size,
        session.search_fallback,
    )


def analyze_process(model: str, gpu: str, strategy: str) -> None:
    """One whole `python -m memorymark analyze MODEL --gpu GPU --strategy S --json` process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error"}
    command = ["analyze", model, "--gpu", gpu, "--strategy", strategy, "--json"]
    subprocess.run(
        [sys.executable, "-m", "memorymark", *command],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert", "gpt2", "resnet"])
    parser.add_argument("--gpus", nargs="+", default=["A10"])
    parser.add_argument("--repeats", type=int, default=3, help="ratios per figure (median)")
    parser.add_argument(
        "--strategies",
        nargs="+",
        default=["symbolic", "fast"],
        help="the strategies whose whole sweeps are costed (linear is slow)",
    )
    parser.add_argument("--no-process", action="store_true", help="skip whole-process timings")
    parser.add_argument(
        "--analyses",
        action="store_true",
        help="also Compare GPUs, Scale out (FSDP, 1-32 GPUs) and --gpus auto, per strategy",
    )
    args = parser.parse_args()
    print(f"memorymark from {ROOT}; every figure in raw fake steps at batch {RAW_BATCH}")

    raws = {model: RawStep(model) for model in args.models}
    print("\none tracked probe at batch 16 (median of bracketed ratios)")
    for model, raw in raws.items():
        tracked, spliced = probe_costs(raw, model, args.repeats)
        print(
            f"  {model:<7} optimizer run {tracked:4.2f} | optimizer spliced {spliced:4.2f}",
            flush=True,
        )

    if "bert" in raws:
        # The unit of issue 22's figures: a BERT-base raw step, whatever the model swept.
        print("\none raw step of each model, in BERT-base raw steps (median of 5, interleaved)")
        for model, raw in raws.items():
            unit = statistics.median(raw.seconds() / raws["bert"].seconds() for _ in range(5))
            print(f"  {model:<7} {unit:4.2f}")

    print("\nwhole sweeps in this process: traced steps -> optimal, max: cost")
    for model, raw in raws.items():
        for gpu in args.gpus:
            s = Settings(model=model, gpu=gpu, backend="sim")
            for strategy in args.strategies:
                settings = s.replace(strategy=strategy)
                sweep(settings)  # untimed: the first sweep pays one-off costs
                traced, best, largest, fallback = sweep(settings)
                cost = raw.median_ratio(lambda settings=settings: sweep(settings), args.repeats)
                print(
                    f"  {model:<7} {gpu:<5} {strategy:<8} {len(traced)} traced "
                    f"-> {best}, {largest}: {cost:5.2f}"
                    + (f" (fell back: {fallback})" if fallback else ""),
                    flush=True,
                )

    if not args.no_process:
        print("\nwhole `python -m memorymark analyze MODEL --gpu GPU --strategy S` processes")
        for model, raw in raws.items():
            for gpu in args.gpus:
                for strategy in args.strategies:
                    cost = raw.median_ratio(
                        lambda m=model, g=gpu, s=strategy: analyze_process(m, g, s), args.repeats
                    )
                    print(f"  {model:<7} {gpu:<5} {strategy:<8} {cost:5.1f}", flush=True)

    if args.analyses:
        print("\nanalyses that run many sweeps, per strategy (one bracketed ratio each)")
        for model in args.models:
            raw = raws[model]
            for strategy in ["warm-up", *(s for s in args.strategies if s != "linear")]:
                # A linear sweep per GPU or count would take an hour. The untimed warm-up pays
                # what the first analysis in a process pays once (FSDP at each GPU count).
                s = Settings(model=model, gpu=args.gpus[0], backend="sim")
                s = s.replace(strategy="fast" if strategy == "warm-up" else strategy)
                fsdp = s.replace(dist="fsdp", gpus="1")
                figures = {
                    "compare": raw.ratio(lambda s=s: Session(s).compare()),
                    "scale out 1-32": raw.ratio(
                        lambda f=fsdp: list(Session(f).scale_out((1, 2, 4, 8, 16, 32)))
                    ),
                    "--gpus auto": raw.ratio(
                        lambda f=fsdp: Session(replace(f, gpus="auto")).analyze(fixes=False)
                    ),
                }
                if strategy == "warm-up":
                    continue
                print(
                    f"  {model:<7} {strategy:<8} "
                    + "  ".join(f"{name} {cost:6.1f}" for name, cost in figures.items()),
                    flush=True,
                )

    print("\ntraced probes of a fast sweep at --step 1 (search + the current batch)")
    for model in args.models:
        for gpu in args.gpus:
            settings = Settings(model=model, gpu=gpu, backend="sim", step=1, strategy="fast")
            probes, best, _, _ = sweep(settings)
            searched = len(probes) - (settings.search.current_batch not in probes[:-1])
            print(f"  {model:<7} {gpu:<5} {searched} + {len(probes) - searched} -> {best}: "
                  f"{probes}", flush=True)  # fmt: skip

    print("\nprocess peak RSS after simulated steps at growing batch sizes (bert)")
    backend = Session(Settings(model="bert", backend="sim", gpu_memory_gib=2048.0)).open_backend()
    for batch in (8, 64, 512, 4096):
        m = backend.measure(batch)
        print(
            f"  batch {batch:>5}: simulated peak {m.peak_bytes / 2**30:7.2f} GiB, "
            f"process peak RSS {rss_mib():7.0f} MiB"
        )


if __name__ == "__main__":
    main()
