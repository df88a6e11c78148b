"""Prints what a simulated sweep costs on this machine: probes, wall seconds, tracking overhead.

For bert, gpt2 and resnet on a simulated A10 and H100: probes and seconds of the fast and linear
strategies, the cost of one tracked simulated step relative to a raw (untracked) fake step, and
process RSS after steps at growing batch sizes (fake tensors allocate nothing, so it stays flat).

    python benchmarks/sweep_cost.py [--models bert gpt2 resnet] [--gpus A10 H100] [--no-linear]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from dataclasses import replace

from memorymark.engine import Session
from memorymark.settings import Settings


def rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sweep_cost(settings: Settings) -> tuple[int, float, int | None]:
    """(probes, wall seconds, optimal batch) of one whole sweep."""
    start = time.perf_counter()
    session = Session(settings)
    best = session.analyze().optimal
    return len(session.measurements), time.perf_counter() - start, best and best.batch_size


def step_overhead(settings: Settings, batch: int, repeats: int = 3) -> tuple[float, float]:
    """Median seconds of a raw fake step and of a tracked one, at `batch`."""
    # The backend a Session opens: the tracked step also counts FLOPs and bytes for throughput.
    backend = Session(replace(settings, backend="sim", gpu_memory_gib=2048.0)).open_backend()
    backend.measure(batch)  # builds the model and optimizer state, warms caches
    raw, tracked = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        with backend._step_context():
            backend.workload.run_step(backend._model, backend._optimizer, batch, "cpu")
        raw.append(time.perf_counter() - start)
        start = time.perf_counter()
        backend.measure(batch)
        tracked.append(time.perf_counter() - start)
    backend.release()
    return statistics.median(raw), statistics.median(tracked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert", "gpt2", "resnet"])
    parser.add_argument("--gpus", nargs="+", default=["A10", "H100"])
    parser.add_argument("--no-linear", action="store_true", help="skip the (slow) linear sweeps")
    args = parser.parse_args()

    print("tracked simulated step vs raw fake step (batch 16, median of 3)")
    for model in args.models:
        raw, tracked = step_overhead(Settings(model=model), 16)
        print(
            f"  {model:<7} raw {raw:6.3f} s  tracked {tracked:6.3f} s  ratio {tracked / raw:4.2f}x"
        )

    print("\nwhole sweeps (sim); fast cost also in raw fake steps at batch 16")
    for model in args.models:
        raw, _ = step_overhead(Settings(model=model), 16, repeats=1)
        for gpu in args.gpus:
            s = Settings(model=model, gpu=gpu, backend="sim")
            probes, seconds, best = sweep_cost(s)
            line = (
                f"  {model:<7} {gpu:<5} fast: {probes} probes {seconds:6.1f} s "
                f"(= {seconds / raw:4.1f} raw steps) -> {best}"
            )
            if not args.no_linear:
                l_probes, l_seconds, l_best = sweep_cost(
                    Settings(model=model, gpu=gpu, backend="sim", strategy="linear")
                )
                line += f" | linear: {l_probes} probes {l_seconds:6.1f} s -> {l_best}"
            print(line, flush=True)

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
