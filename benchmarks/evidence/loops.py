"""The loops chunk: long training loops with evaluation, step by step, beside the replay.

For each model and capacity of the plan: the batch MemoryMark recommends on that catalog GPU
(a simulated sweep with the evaluation pass, default margin), then that many steps run on the
device capped at the capacity (a training loop as people write it: the model built, no flush,
the optimizer's state made in step 1), HF Trainer's evaluation pass every `eval_every` steps.
Every step and every evaluation is one line of `loops-<gpu>-<date>.jsonl`, its measured peaks
(reset before it) beside the replay's for the same step, after a `loop` line with the answer.

Predicted figures are the caching-allocator replay of the device's kernels at the capacity
(`as_run`): a training line's are the replay of training steps (a steady replay's last step
repeated past the steps it ran); an evaluation line's are the engine's probe with the evaluation
pass: `eval_peak_bytes` (allocated, training state included) and the loop's reserved bytes.
"""

from __future__ import annotations

import datetime
import gc
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.evidence.device import Device
from benchmarks.evidence.plan import Plan
from memorymark import gpus, models
from memorymark.backends.base import Backend
from memorymark.backends.oom import is_oom
from memorymark.calibration.loop import simulated_loop
from memorymark.calibration.record import file_stem
from memorymark.calibration.run import RECOMMENDED_MARGIN, as_run, capped
from memorymark.engine import Session
from memorymark.settings import Settings


def loops(device: Device, plan: Plan, out: Path, day: datetime.date) -> dict[str, Any]:
    """Every model at its recommended batch on every capacity; one line written per step as
    it finishes (a loop cut off by the chunk's time limit keeps the steps it ran)."""
    path = out / f"loops-{file_stem(device.environment().gpu_name, day=day)}.jsonl"
    env = device.environment().to_dict()
    done = 0
    with path.open("w") as f:
        for capacity in plan.loop_capacities:
            gpu = plan.gpu(capacity)
            for chosen in plan.loop_models:
                settings = Settings(**chosen, eval_batch=plan.eval_batch, margin=RECOMMENDED_MARGIN)
                try:
                    done += _loop(f, device, plan, settings, gpu, env)
                except Exception as exc:  # noqa: BLE001 - one line says how; the next loop runs
                    error = {"kind": "error", "model": settings.workload.model, "error": repr(exc)}
                    _line(f, {**error, "emulated_gpu": gpu.name, "dry_run": device.dry})
    return {"files": [path.name], "loops": done}


def _loop(
    f: Any, device: Device, plan: Plan, settings: Settings, gpu: gpus.GPU, env: dict[str, Any]
) -> int:
    """One model's loop at its recommended batch on `gpu`'s capacity, its lines written to `f`
    as they come; 1 when it ran."""
    head, predicted = answer(device, settings, gpu, plan.loop_steps)
    head.update(env, dry_run=device.dry, emulated_gpu=gpu.name)
    _line(f, head)
    if not head["batch_size"]:
        return 0
    with capped(device.cuda, gpu, device.gpu), device.real(settings, gpu).session() as backend:
        for line in measured(backend, head["batch_size"], plan, device.cuda):
            _line(f, {**line, **_beside(line, predicted), **_key(head)})
    return 1


def answer(
    device: Device, settings: Settings, gpu: gpus.GPU, steps: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `loop` line (the batch recommended for the device capped at `gpu`'s capacity, the
    sweep's probes and seconds, the replay's verdict at that batch with evaluation) and the
    predicted figures per step (training, from the replay without evaluation; evaluation, from
    the probe). Recommended for the device's own kernels at that capacity (`as_run`), as the
    steps run, not for `gpu`'s kernels: the loop checks the fit rule like for like."""
    run_as = as_run(device.gpu, gpu.usable_bytes, gpu.name)
    start = time.perf_counter()
    report = Session(settings.replace(backend="sim"), gpu=run_as).analyze(fixes=False, plan=False)
    seconds = time.perf_counter() - start
    batch = report.optimal.batch_size if report.optimal is not None else 0
    head: dict[str, Any] = {
        "kind": "loop",
        "model": settings.workload.model,
        "precision": settings.workload.precision,
        "input": f"seq {settings.workload.seq_len}"
        if models.find_model(settings.workload.model).input_kind == "text"
        else f"{settings.workload.image_size}px",
        "capacity_bytes": gpu.usable_bytes,
        "cap_method": "fraction",
        "batch_size": batch,
        "max_batch_size": report.max_fit.batch_size if report.max_fit is not None else 0,
        "eval_batch": settings.workload.eval_batch,
        "loop_steps": steps,
        "sweep_probes": len(report.measurements),
        "sweep_seconds": round(seconds, 2),
    }
    if not batch:
        return head, {}
    with device.simulated(settings.replace(eval_batch=None), run_as).session() as sim:
        train = simulated_loop(sim, batch, steps)
    with device.simulated(settings, run_as).session() as sim:
        probe = sim.measure(batch)
    head.update(predicted_runs=probe.runs, predicted_fits=probe.fits)
    return head, {"train": train.steps, "eval": probe}


def measured(backend: Backend, batch: int, plan: Plan, cuda: Any) -> Iterator[dict[str, Any]]:
    """`plan.loop_steps` training steps at `batch` on the device, the evaluation pass every
    `plan.eval_every`, each measured apart and yielded as it ends; stops at the first
    out-of-memory error."""
    # As a fresh process has none (and as memorymark/calibration/loop.py's training loop does):
    # each thread's cuBLAS workspace, kept by torch for the process's life, handed back first.
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if cuda is torch.cuda and clear is not None:
        clear()
    model, optimizer = backend.fresh_loop()
    step = backend.training_step
    try:
        for n in range(1, plan.loop_steps + 1):
            line = _measure(
                cuda, n, "train", step.run_step, model, optimizer, batch, backend.device
            )
            yield line
            if not line["oom"] and plan.eval_every and n % plan.eval_every == 0:
                run_eval = step.run_eval
                line = _measure(cuda, n, "eval", run_eval, model, plan.eval_batch, backend.device)
                yield line
            if line["oom"]:
                break
    finally:
        del model, optimizer
        gc.collect()
        cuda.empty_cache()


def _measure(cuda: Any, n: int, phase: str, run: Callable[..., None], *args: Any) -> dict[str, Any]:
    """Run one step or evaluation pass; its peaks (reset before it), retries and outcome."""
    cuda.reset_peak_memory_stats()
    before = cuda.memory_stats()
    start = time.perf_counter()
    oom = False
    try:
        run(*args)
        cuda.synchronize()
    except Exception as exc:
        if not is_oom(exc):
            raise
        oom = True
    stats = cuda.memory_stats()
    return {
        "kind": phase,
        "step": n,
        "oom": oom,
        "measured_allocated_bytes": int(stats.get("allocated_bytes.all.peak", 0)),
        "measured_reserved_bytes": int(stats.get("reserved_bytes.all.peak", 0)),
        "measured_retries": int(stats.get("num_alloc_retries", 0))
        - int(before.get("num_alloc_retries", 0)),
        "seconds": round(time.perf_counter() - start, 4),
    }


def _beside(line: dict[str, Any], predicted: dict[str, Any]) -> dict[str, Any]:
    """The replay's figures for the same step or evaluation pass."""
    if line["kind"] == "eval":
        probe = predicted["eval"]
        return {
            "predicted_allocated_bytes": probe.eval_peak_bytes,
            "predicted_reserved_bytes": probe.loop_reserved_bytes or probe.reserved_bytes,
            "predicted_oom": not probe.runs,
        }
    steps = predicted["train"]
    index = min(line["step"], len(steps)) - 1
    peaks = steps[index]
    return {
        "predicted_allocated_bytes": peaks.allocated_bytes,
        "predicted_reserved_bytes": peaks.reserved_bytes,
        "predicted_retries": peaks.retries,
        "predicted_oom": peaks.oom,
    }


def _key(head: dict[str, Any]) -> dict[str, Any]:
    """What names a step's loop, on each of its lines."""
    return {k: head[k] for k in ("model", "precision", "emulated_gpu", "batch_size", "dry_run")}


def _line(f: Any, record: dict[str, Any]) -> None:
    f.write(json.dumps(record) + "\n")
    f.flush()
