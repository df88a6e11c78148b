"""Prints a real GPU's memory step by step over a training loop's first steps, with the
simulation's prediction for the same steps beside it (CUDA only).

A sweep judges a batch by its first step, as a fresh process runs it. A training loop runs
thousands: from the second step on, the caching allocator starts with the segments the first
left cached, carved for the first step's order of requests. This script runs `--steps`
consecutive steps per batch size on the GPU (optionally capped at a smaller catalog GPU's
capacity, as `calibrate --emulate-gpu` does) and prints one JSON object per batch: each step's
peak allocated and reserved bytes, allocation retries and whether it ran out of memory (`real`;
a step that ran out keeps the peaks it reached, and the steps before it keep theirs), and the
simulation's replay of the same steps, of this GPU's kernels at the same capacity
(`predicted`), with each loop's verdict. The loops are memorymark/calibration/loop.py's, the
ones calibrate runs, started as the loop people write starts (`loop_start`: no cache flush, the
optimizer state made in step 1); `main` only parses, caps and prints.

    python benchmarks/steady_state.py --model gpt2 --precision bf16-mixed \
        --batch-sizes 64 112 [--emulate-gpu A10] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from memorymark import Session, Settings, gpus
from memorymark.backends.resolve import detect_cuda_gpu
from memorymark.calibration.loop import Loop, measured_loop, simulated_loop
from memorymark.calibration.run import BackendFactory, as_run, capped
from memorymark.environment import torch_version


def steady_state(
    settings: Settings,
    batch_sizes: Iterable[int],
    steps: int,
    *,
    emulate: gpus.GPU | None = None,
    cuda: Any = torch.cuda,
    real: BackendFactory | None = None,
) -> Iterator[dict[str, Any]]:
    """One record per batch size: `steps` steps measured on the GPU behind `cuda` (a fake in
    tests), each batch from a freshly built model (`real` builds its backend for the settings
    and the GPU whose capacity judges it), and the simulation's replay of the same steps."""
    device_gpu = detect_cuda_gpu(cuda)
    target = emulate or device_gpu
    real = real or (
        lambda s, gpu: Session(s.replace(backend="cuda"), gpu=gpu, cuda=cuda).open_backend()
    )
    sim_gpu = as_run(device_gpu, target.usable_bytes, target.name)
    simulated = Session(settings.replace(backend="sim"), gpu=sim_gpu)
    with capped(cuda, emulate, device_gpu), simulated.open_backend().session() as sim:
        for batch in batch_sizes:
            with real(settings, target).session() as device:
                measured = measured_loop(device, batch, steps, cuda)
            predicted = simulated_loop(sim, batch, steps)
            yield record(settings, device_gpu, target, batch, measured, predicted)


def record(
    settings: Settings,
    device_gpu: gpus.GPU,
    target: gpus.GPU,
    batch: int,
    measured: Loop,
    predicted: Loop,
) -> dict[str, Any]:
    """One line of a steady-state file: the settings, the GPU that ran (and its torch) and the
    one whose capacity judged it, each measured step beside each predicted one (`real`,
    `predicted`), and each loop's verdict and peaks over the steps that finished."""
    return {
        "model": settings.workload.model,
        "precision": settings.workload.precision,
        "device_gpu": device_gpu.name,
        "torch_version": torch_version(),
        "gpu": target.name,
        "capacity_bytes": target.usable_bytes,
        "batch": batch,
        "steps": measured.asked,
        "loop_start": measured.start,
        "real": [s.to_dict() for s in measured.steps],
        "predicted": [s.to_dict() for s in predicted.steps],
        "real_loop": summary(measured),
        "predicted_loop": summary(predicted),
    }


def summary(loop: Loop) -> dict[str, Any]:
    """A loop's verdict, the step that ran out of memory, its retries and peaks."""
    return {
        "runs": loop.runs,
        "oom_step": loop.oom_step,
        "retries": loop.retries,
        "allocated_bytes": loop.allocated_bytes,
        "reserved_bytes": loop.reserved_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--batch-sizes", type=int, nargs="+", required=True)
    parser.add_argument("--emulate-gpu", default=None)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    settings = Settings(model=args.model, precision=args.precision, margin="0%")
    emulated = gpus.find_gpu(args.emulate_gpu) if args.emulate_gpu else None
    for line in steady_state(settings, args.batch_sizes, args.steps, emulate=emulated):
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
