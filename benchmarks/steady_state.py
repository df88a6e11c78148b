"""Prints a real GPU's memory step by step over a training loop's first steps (CUDA only).

A sweep judges a batch by its first step, as a fresh process runs it. A training loop runs
thousands: from the second step on, the caching allocator starts with the segments the first
left cached, carved for the first step's order of requests. This script runs `--steps`
consecutive steps per batch size on the GPU (optionally capped at a smaller catalog GPU's
capacity, as `calibrate --emulate-gpu` does) and prints, for each step, the peak allocated and
reserved bytes, allocation retries and whether it ran out of memory; with the simulation's
prediction for the same steps beside it. One JSON object per line.

    python benchmarks/steady_state.py --model gpt2 --precision bf16-mixed \
        --batch-sizes 64 112 [--emulate-gpu A10] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

from memorymark import Session, Settings, gpus
from memorymark.backends.oom import is_oom
from memorymark.backends.resolve import detect_cuda_gpu
from memorymark.calibration.run import capped


def real_steps(settings: Settings, gpu: gpus.GPU, batch: int, steps: int) -> list[dict]:
    """Per-step peaks of `steps` consecutive steps at `batch` on this GPU (stops at an OOM)."""
    backend = Session(replace(settings, backend="cuda"), gpu=gpu).open_backend()
    backend._prepare()  # model and primed optimizer state, as a sweep's probe starts from
    torch.cuda.empty_cache()
    out = []
    for step in range(1, steps + 1):
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_stats()
        row = {"step": step}
        try:
            backend.workload.run_step(backend._model, backend._optimizer, batch, "cuda")
            torch.cuda.synchronize()
            row["oom"] = False
        except Exception as exc:  # an OOM is a result; anything else is re-raised
            if not is_oom(exc):
                raise
            row["oom"] = True
        stats = torch.cuda.memory_stats()
        row.update(
            allocated_gib=round(stats["allocated_bytes.all.peak"] / 2**30, 4),
            reserved_gib=round(stats["reserved_bytes.all.peak"] / 2**30, 4),
            retries=stats["num_alloc_retries"] - before["num_alloc_retries"],
        )
        out.append(row)
        if row["oom"]:
            break
    backend.release()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--batch-sizes", type=int, nargs="+", required=True)
    parser.add_argument("--emulate-gpu", default=None)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    settings = Settings(model=args.model, precision=args.precision, margin="0%")
    device_gpu = detect_cuda_gpu()
    emulated = gpus.find_gpu(args.emulate_gpu) if args.emulate_gpu else None
    target = emulated or device_gpu
    with capped(torch.cuda, emulated, device_gpu):
        for batch in args.batch_sizes:
            real = real_steps(settings, target, batch, args.steps)
            print(
                json.dumps(
                    {
                        "model": args.model,
                        "precision": args.precision,
                        "gpu": target.name,
                        "capacity_gib": round(target.usable_bytes / 2**30, 4),
                        "batch": batch,
                        "real": real,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
