"""Prints what a simulated sweep costs, each figure a ratio of two timings taken in one run.

This machine is shared and noisy, so no figure is an absolute time: each is divided by a raw
(untracked) fake training step at batch 16 timed in the same process, or by its own "before".

- tracking: one tracked simulated probe over a raw fake step, with the optimizer phase run at
  every probe (the tracker's own overhead) and spliced from its record (what a probe costs now);
- whole fast sweeps in-process, in raw steps, with the optimizer phase run at every probe
  (before) and recorded once (after), alternated so both see the same load, after one
  untimed sweep;
- whole processes, `python -m memorymark analyze MODEL --gpu GPU --json`, in raw steps: before
  (every optimizer phase run, and the interpreter's teardown), with the optimizer phase
  spliced, and after (spliced, and no teardown);
- process RSS after steps at growing batch sizes (fake tensors allocate nothing: it stays flat).

    python benchmarks/sweep_cost.py [--models bert gpt2 resnet] [--gpus A10] [--repeats 3]
        [--linear] [--no-process]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from memorymark.engine import Session
from memorymark.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
REUSE = "MEMORYMARK_REUSE_OPTIMIZER_STEP"


def rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextmanager
def reuse(on: bool) -> Iterator[None]:
    """Backends opened inside splice the optimizer phase's record (on) or run it every probe."""
    before = os.environ.get(REUSE)
    os.environ[REUSE] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[REUSE]
        else:
            os.environ[REUSE] = before


def seconds(run: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of `repeats` calls of `run`."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_costs(settings: Settings, batch: int, repeats: int = 3) -> tuple[float, float, float]:
    """Median seconds at `batch` of a raw fake step, a tracked probe running the optimizer
    phase, and a tracked probe splicing it."""
    big = replace(settings, backend="sim", gpu_memory_gib=2048.0)
    with reuse(False):
        every = Session(big).open_backend()
    with reuse(True):
        once = Session(big).open_backend()
    every.measure(batch)  # builds the model and optimizer state, warms caches
    once.measure(batch)  # and records the optimizer phase
    raw, tracked, spliced = [], [], []
    for _ in range(repeats):  # interleaved, so all three see the same load
        raw.append(seconds(lambda: raw_step(every, batch), 1))
        tracked.append(seconds(lambda: every.measure(batch), 1))
        spliced.append(seconds(lambda: once.measure(batch), 1))
    every.release()
    once.release()
    return statistics.median(raw), statistics.median(tracked), statistics.median(spliced)


def raw_step(backend, batch: int) -> None:
    """One fake training step with no tracker: what the simulation cannot do without."""
    with backend._step_context():
        backend.workload.run_step(backend._model, backend._optimizer, batch, "cpu")


def sweep(settings: Settings, reuse_on: bool) -> tuple[int, int | None]:
    """(probes, optimal batch) of one whole sweep."""
    with reuse(reuse_on):
        session = Session(settings)
        best = session.analyze().optimal
    return len(session.measurements), best and best.batch_size


def analyze_process(model: str, gpu: str, *, reuse_on: bool, teardown: bool) -> float:
    """Wall seconds of a whole `analyze --json` process, with the optimizer phase spliced
    (`reuse_on`) or run at every probe, and with the interpreter torn down at exit
    (`teardown`, as before) or left at once (`python -m memorymark` now)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), REUSE: "1" if reuse_on else "0"}
    entry = ["-c", _BEFORE] if teardown else ["-m", "memorymark"]
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *entry, "analyze", model, "--gpu", gpu, "--json"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


# The entry point as it was: return from main() and let the interpreter tear everything down.
_BEFORE = "import sys; from memorymark.cli import main; sys.exit(main())"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert", "gpt2", "resnet"])
    parser.add_argument("--gpus", nargs="+", default=["A10"])
    parser.add_argument("--repeats", type=int, default=3, help="timings per figure (median)")
    parser.add_argument("--linear", action="store_true", help="also the (slow) linear sweeps")
    parser.add_argument("--no-process", action="store_true", help="skip whole-process timings")
    args = parser.parse_args()

    print("one probe at batch 16 over a raw fake step (median of interleaved runs)")
    raws = {}
    for model in args.models:
        raw, tracked, spliced = step_costs(Settings(model=model), 16, args.repeats)
        raws[model] = raw
        print(
            f"  {model:<7} tracked, optimizer run {tracked / raw:4.2f}x | "
            f"tracked, optimizer spliced {spliced / raw:4.2f}x",
            flush=True,
        )

    print("\nwhole fast sweeps in this process, in raw steps at batch 16 (before -> after)")
    for model in args.models:
        for gpu in args.gpus:
            s = Settings(model=model, gpu=gpu, backend="sim")
            strategies = [s, replace(s, strategy="linear")] if args.linear else [s]
            for settings in strategies:
                sweep(settings, reuse_on=True)  # untimed: the first sweep pays one-off costs
                before, after = [], []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    probes, best = sweep(settings, reuse_on=False)
                    t1 = time.perf_counter()
                    probes_after, best_after = sweep(settings, reuse_on=True)
                    before.append(t1 - t0)
                    after.append(time.perf_counter() - t1)
                assert (probes, best) == (probes_after, best_after), "the answer changed"
                b, a = (
                    statistics.median(before) / raws[model],
                    statistics.median(after) / raws[model],
                )
                print(
                    f"  {model:<7} {gpu:<5} {settings.strategy:<6} {probes} probes -> {best}: "
                    f"{b:5.1f} -> {a:5.1f} raw steps ({a / b:4.2f}x)",
                    flush=True,
                )

    if not args.no_process:
        print(
            "\nwhole `python -m memorymark analyze MODEL --gpu GPU --json`, in raw steps:"
            "\n  before -> optimizer spliced -> and no teardown (after)"
        )
        variants = ((False, True), (True, True), (True, False))  # (reuse_on, teardown)
        for model in args.models:
            for gpu in args.gpus:
                runs: list[list[float]] = [[] for _ in variants]
                for _ in range(args.repeats):
                    for times, (reuse_on, teardown) in zip(runs, variants, strict=True):
                        t = analyze_process(model, gpu, reuse_on=reuse_on, teardown=teardown)
                        times.append(t)
                b, r, a = (statistics.median(times) / raws[model] for times in runs)
                print(
                    f"  {model:<7} {gpu:<5} {b:5.1f} -> {r:5.1f} -> {a:5.1f} raw steps "
                    f"({a / b:4.2f}x)",
                    flush=True,
                )

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
