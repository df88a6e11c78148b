"""The peers chunk: Lightning's and Accelerate's batch finders beside MemoryMark, on one
user-written model, and whether each answer survives the long loop.

The model is a user's own (a small CNN in plain PyTorch, fp32, AdamW), sized by MemoryMark
through the `Training` API (a simulated sweep on the capped capacity), by Lightning's
`BatchSizeFinder` (`Tuner.scale_batch_size(mode="binsearch")`) and by Accelerate's
`find_executable_batch_size`, each on the device capped at the capacity. Then each answer runs
the loop of the loops chunk (`plan.loop_steps` steps, a forward under `no_grad` every
`plan.eval_every`). One row per answer in `peers-<gpu>-<date>.csv`.

Dry, nothing runs out of memory on CPU: a step past the largest batch MemoryMark's simulation
says runs raises the CUDA out-of-memory error the finders catch, so their searches run for real
against that stand-in. A finder whose library is missing gets a row saying so.
"""

from __future__ import annotations

import csv
import datetime
import gc
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import memorymark as mm
from benchmarks.evidence.device import Device, missing
from benchmarks.evidence.loops import _measure
from benchmarks.evidence.plan import Plan
from memorymark.calibration.record import file_stem
from memorymark.calibration.run import RECOMMENDED_MARGIN, as_run, capped
from memorymark.engine import Session
from memorymark.settings import Settings

COLUMNS = (
    "gpu_name",
    "emulated_gpu",
    "cap_method",
    "capacity_bytes",
    "torch_version",
    "memorymark_version",
    "git_commit",
    "dry_run",
    "model",
    "tool",
    "tool_version",
    "answer_batch",
    "trials",
    "seconds",
    "loop_steps",
    "eval_every",
    "survived",
    "oom_step",
    "loop_reserved_peak_bytes",
    "loop_retries",
    "note",
)


class UserNet(nn.Module):
    """A user's own CNN: two conv blocks and a classifier over 10 classes."""

    def __init__(self, widths: tuple[int, int] = (64, 128)) -> None:
        super().__init__()
        a, b = widths
        self.features = nn.Sequential(
            nn.Conv2d(3, a, 3, padding=1),
            nn.BatchNorm2d(a),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(a, b, 3, padding=1),
            nn.BatchNorm2d(b),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(b, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Job:
    """The user's code, written once, that every finder runs: model, batch, step, optimizer."""

    def __init__(self, plan: Plan, limit: int | None) -> None:
        self.plan = plan
        self.limit = limit
        """Dry only: the largest batch that runs; past it a step raises CUDA's OOM error."""
        self.tried: list[int] = []

    def model(self) -> nn.Module:
        return UserNet(self.plan.peers_widths)

    def batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        size = self.plan.peers_image_size
        return torch.randn(n, 3, size, size), torch.randint(0, 10, (n,))

    def step(self, model: nn.Module, batch: Any, optimizer: torch.optim.Optimizer) -> None:
        images, labels = batch
        self.check(len(labels))
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def check(self, n: int) -> None:
        """Dry: the out-of-memory error a GPU would raise past the limit."""
        if self.limit is not None and n > self.limit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. (dry run: batch {n} is past the simulated limit {self.limit})"
            )

    def optimizer(self, params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=1e-3)

    def training(self) -> mm.Training:
        return mm.Training(
            model=self.model, batch=self.batch, step=self.step, optimizer=self.optimizer
        )


def peers(device: Device, plan: Plan, out: Path, day: datetime.date) -> dict[str, Any]:
    """MemoryMark's answer, then each finder's, each followed by its loop and written as a row
    as soon as both are in (a chunk cut off keeps the rows before)."""
    gpu = plan.gpu(plan.peers_capacity)
    env = device.environment(gpu.name).to_dict()
    common = {k: env[k] for k in COLUMNS if k in env}
    common.update(cap_method="fraction", capacity_bytes=gpu.usable_bytes, dry_run=device.dry)
    common.update(model="UserNet", loop_steps=plan.loop_steps, eval_every=plan.eval_every)
    path = out / f"peers-{file_stem(env['gpu_name'], day=day)}.csv"
    settings = Settings(backend="sim", margin=RECOMMENDED_MARGIN, max_batch=plan.peers_max_batch)
    run_as = as_run(device.gpu, gpu.usable_bytes, gpu.name)  # the device's kernels, capped
    start = time.perf_counter()
    report = Session(settings, gpu=run_as, training=Job(plan, None).training()).analyze(
        fixes=False, plan=False
    )
    seconds = time.perf_counter() - start
    limit = report.max_fit.batch_size if report.max_fit is not None else 0
    job = Job(plan, limit if device.dry else None)
    answers = [
        (
            "memorymark (simulated, recommended)",
            mm.__version__,
            report.optimal.batch_size if report.optimal else 0,
            len(report.measurements),
            seconds,
            "",
        ),
        (
            "memorymark (simulated, max)",
            mm.__version__,
            limit,
            len(report.measurements),
            seconds,
            "the largest batch the simulation says runs, no margin: not a recommendation",
        ),
    ]
    finders: list[Any] = [*answers, lightning_finder, accelerate_finder]
    answers = []
    with capped(device.cuda, gpu, device.gpu), path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for finder in finders:  # each row written as its answer and loop land
            answer = finder if isinstance(finder, tuple) else _found(finder, job, plan, device)
            tool, version, batch, trials, took, note = answer
            answers.append(answer)
            loop = survives(job, batch, plan, device) if batch else {"note": "no answer to loop"}
            note = "; ".join(filter(None, (note, loop.pop("note", ""))))
            row = {**common, "tool": tool, "tool_version": version, "answer_batch": batch}
            row.update(trials=trials, seconds=round(took, 2), **loop, note=note)
            writer.writerow({k: _cell(v) for k, v in row.items()})
            f.flush()
    return {"files": [path.name], "answers": {a[0]: a[2] for a in answers}}


def _found(finder: Callable[..., tuple[Any, ...]], job: Job, plan: Plan, device: Device) -> Any:
    """A finder's answer; one that fails (a library's API moved) is a row saying how, not the
    end of the chunk. What its trainer or trials held is freed before the next."""
    try:
        return finder(job, plan, device)
    except Exception as exc:  # noqa: BLE001 - written in the row's note
        name = finder.__name__.removesuffix("_finder")
        return name, "", 0, len(dict.fromkeys(job.tried)), 0.0, f"failed: {exc!r}"[:300]
    finally:
        gc.collect()
        device.cuda.empty_cache()


def _cell(value: Any) -> Any:
    """As the calibration CSVs write them: true/false, and an empty cell for None."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else value


def lightning_finder(job: Job, plan: Plan, device: Device) -> tuple[Any, ...]:
    """Lightning's BatchSizeFinder, binsearch from 2 (its defaults: 3 steps a trial, 25 trials)."""
    tool = "lightning BatchSizeFinder (binsearch)"
    why = missing("lightning")
    if why:
        return tool, "", 0, 0, 0.0, why
    import lightning as L
    from lightning.pytorch.tuner import Tuner

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = 2
            self.net = job.model()

        def train_dataloader(self) -> Any:
            # Indices only: the batch itself is made on the device, as make_batch does.
            return torch.utils.data.DataLoader(range(10**8), batch_size=self.batch_size)

        def training_step(self, indices: torch.Tensor, _: int) -> torch.Tensor:
            n = len(indices)
            job.tried.append(n)
            job.check(n)
            with torch.device(self.device):
                images, labels = job.batch(n)
            return nn.functional.cross_entropy(self.net(images), labels)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return job.optimizer(self.parameters())

    job.tried.clear()
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            accelerator="cpu" if device.dry else "gpu",
            devices=1,
            max_steps=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )
        start = time.perf_counter()
        found = Tuner(trainer).scale_batch_size(Module(), mode="binsearch")
        seconds = time.perf_counter() - start
    return tool, L.__version__, int(found or 0), len(dict.fromkeys(job.tried)), seconds, ""


def accelerate_finder(job: Job, plan: Plan, device: Device) -> tuple[Any, ...]:
    """Accelerate's find_executable_batch_size from `plan.peers_accelerate_start`, three steps
    a trial on a model built inside it (its docs' pattern); it cuts the batch by 10% per OOM."""
    tool = f"accelerate find_executable_batch_size (from {plan.peers_accelerate_start})"
    why = missing("accelerate")
    if why:
        return tool, "", 0, 0, 0.0, why
    import accelerate
    from accelerate.utils import find_executable_batch_size

    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=plan.peers_accelerate_start)
    def trial(batch_size: int) -> int:
        tried.append(batch_size)
        with torch.device(device.torch_device):
            model = job.model()
            optimizer = job.optimizer(model.parameters())
            for _ in range(3):
                job.step(model, job.batch(batch_size), optimizer)
        return batch_size

    start = time.perf_counter()
    found = trial()
    return tool, accelerate.__version__, found, len(tried), time.perf_counter() - start, ""


def survives(job: Job, batch: int, plan: Plan, device: Device) -> dict[str, Any]:
    """The answer's loop on the device: `plan.loop_steps` steps, an evaluation forward every
    `plan.eval_every`; whether it got through, and its peaks."""
    lines: list[dict[str, Any]] = []
    with torch.device(device.torch_device):
        model = job.model()
        optimizer = job.optimizer(model.parameters())
        for n in range(1, plan.loop_steps + 1):
            lines.append(_measure(device.cuda, n, "train", _train(job, model, optimizer), batch))
            if not lines[-1]["oom"] and plan.eval_every and n % plan.eval_every == 0:
                lines.append(_measure(device.cuda, n, "eval", _eval(job, model), batch))
            if lines[-1]["oom"]:
                break
    del model, optimizer
    device.cuda.empty_cache()
    oom = next((line["step"] for line in lines if line["oom"]), None)
    return {
        "survived": oom is None,
        "oom_step": oom,
        "loop_reserved_peak_bytes": max(line["measured_reserved_bytes"] for line in lines),
        "loop_retries": sum(line["measured_retries"] for line in lines),
    }


def _train(job: Job, model: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[int], None]:
    return lambda n: job.step(model.train(), job.batch(n), optimizer)


def _eval(job: Job, model: nn.Module) -> Callable[[int], None]:
    def run(n: int) -> None:
        job.check(n)
        with torch.no_grad():
            model.eval()(job.batch(n)[0])
        model.train()

    return run
