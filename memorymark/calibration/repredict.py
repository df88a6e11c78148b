"""The committed real-GPU evidence re-simulated with today's engine, like for like.

Owns reading a calibration row (a `calibrate` CSV row, or a line of
benchmarks/steady_state.py) back into what ran (`Evidence`: settings, batch, the GPU that ran,
the capacity it was capped at, what the GPU said), re-simulating it as it ran (`repredict`: the
GPU's own kernels at that capacity, the same steps, the measured bytes compared over the steps
they are the peak of), and sorting the results (`near_capacity`, `recommended_with_retries`).
Must not know where the files are or how anything is shown: benchmarks/calibration_table.py
reads the files and prints.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from memorymark import gpus, models
from memorymark.backends.base import Backend
from memorymark.backends.oom import StepError
from memorymark.calibration.loop import LOOP_STEPS, Loop, StepPeaks, simulated_loop
from memorymark.calibration.record import split_cell
from memorymark.calibration.run import RECOMMENDED_MARGIN, as_run
from memorymark.cuda_rules import versions
from memorymark.engine import Session
from memorymark.settings import Settings
from memorymark.units import GIB

NEAR_CAPACITY = 0.85
"""A row is near the capacity (a boundary row) from this fraction of it up."""
STEADY_STATE_STEPS = 4
"""Steps a steady-state line asked for when it does not say: benchmarks/steady_state.py's
default, which docs/calibration/steady-state-*-2026-11-23.jsonl ran (its README says so)."""
BOUNDARY_DEFINITION = (
    "boundary rows: marked by calibrate (recommended, max fits, max+step OOM), out of memory "
    "on the GPU or in the re-prediction, or reserving at least "
    f"{NEAR_CAPACITY:.0%} of the capacity (measured, or re-predicted); every other row is far "
    "below capacity"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """One real run: what ran, on which GPU, capped at which capacity, and what the GPU said."""

    source: str
    """The file it comes from."""
    label: str
    """GPU, model, settings and batch, for a person."""
    settings: Settings
    """As it ran, with the default margin (so `fits` says what MemoryMark recommends)."""
    batch_size: int
    device_gpu: gpus.GPU
    """The GPU that ran the steps (its kernels)."""
    capacity_bytes: int
    """What the allocator could reserve: the emulated GPU's capacity when capped."""
    capped_as: str = ""
    """The catalog GPU the run was capped to emulate; empty when it was not capped."""
    torch_version: str = ""
    """The torch the run used (its cuBLAS workspaces are replayed); empty when not recorded."""
    boundary_check: str = ""
    verdict_steps: int
    """Steps the GPU's verdict covers."""
    byte_steps: int
    """Steps the measured bytes are the peak of (1: the first step's)."""
    measured_runs: bool
    measured_allocated_bytes: int | None
    measured_reserved_bytes: int | None
    measured_retries: int | None
    measured_steps: tuple[StepPeaks, ...] = ()
    """Each step's peaks, where the file has them."""


@dataclass(frozen=True, slots=True)
class Reprediction:
    """One row of evidence and what the current engine says of it."""

    evidence: Evidence
    loop: Loop | None
    """The replay of the same steps (None when the engine could not simulate it: `error`)."""
    allocated_bytes: int | None = None
    """Predicted peak allocated bytes over the evidence's `byte_steps` (what the loop would
    need when the replay runs out of memory in them)."""
    reserved_bytes: int | None = None
    seconds: float = 0.0
    error: str | None = None
    """Why the engine could not simulate the row any more (its settings refused, the step
    failing); None when it did."""

    @property
    def runs(self) -> bool:
        return self.loop is not None and self.loop.runs

    @property
    def recommended(self) -> bool:
        """The re-prediction recommends this batch: it runs with no retry inside the margin."""
        return self.loop is not None and self.loop.fits

    @property
    def agrees(self) -> bool:
        return self.loop is not None and self.runs == self.evidence.measured_runs

    @property
    def allocated_error(self) -> float | None:
        return _relative(self.allocated_bytes, self.evidence.measured_allocated_bytes)

    @property
    def reserved_error(self) -> float | None:
        return _relative(self.reserved_bytes, self.evidence.measured_reserved_bytes)

    @property
    def near_capacity(self) -> bool:
        """A boundary row (`BOUNDARY_DEFINITION`)."""
        ev = self.evidence
        if ev.boundary_check or not ev.measured_runs or (self.loop and not self.loop.runs):
            return True
        need = max(ev.measured_reserved_bytes or 0, self.reserved_bytes or 0)
        return need >= NEAR_CAPACITY * ev.capacity_bytes


def _relative(predicted: int | None, measured: int | None) -> float | None:
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


def repredict(
    evidence: Iterable[Evidence], on_done: Callable[[Reprediction], None] | None = None
) -> Iterator[Reprediction]:
    """Re-simulate each row as it ran: a simulated backend of its GPU's kernels at its capacity
    (one per run of consecutive rows sharing settings and GPU, as calibrate keeps one per
    combination), its loop replayed over the steps its verdict covers. A row the engine cannot
    simulate any more (its settings refused, the step failing) is yielded with the error."""
    backend: Backend | None = None
    key: tuple[Any, ...] | None = None
    try:
        for ev in evidence:
            start = time.perf_counter()
            try:
                if _runs_as(ev) != key:
                    if backend is not None:
                        backend.release()
                    backend, key = None, _runs_as(ev)
                    backend = _backend(ev)
                loop = simulated_loop(backend, ev.batch_size, max(ev.verdict_steps, 1))
                result = _compared(ev, loop, time.perf_counter() - start)
            except (ValueError, StepError) as exc:
                result = Reprediction(ev, None, error=str(exc), seconds=time.perf_counter() - start)
            if on_done is not None:
                on_done(result)
            yield result
    finally:
        if backend is not None:
            backend.release()


def _runs_as(ev: Evidence) -> tuple[Any, ...]:
    """What decides a row's backend: rows alike share one, as calibrate's batches did."""
    return ev.settings, ev.device_gpu, ev.capacity_bytes, ev.torch_version


def _backend(ev: Evidence) -> Backend:
    """A simulated backend of the GPU that ran, at the capacity it was capped at, replaying the
    cuBLAS workspaces of the torch it ran (the rest of the step is this machine's torch and
    transformers: `memorymark/cuda_rules/versions.py`)."""
    gpu = as_run(ev.device_gpu, ev.capacity_bytes, ev.capped_as)
    backend = Session(ev.settings, gpu=gpu).open_backend()
    if ev.torch_version:
        release = versions.release(ev.torch_version)
        backend.thread_workspace = gpus.thread_workspace(gpu.compute_capability, release)
    return backend


def _compared(ev: Evidence, loop: Loop, seconds: float) -> Reprediction:
    """The replay's peaks over the steps the measured bytes cover."""
    first = loop.steps[: ev.byte_steps]
    if first and not any(s.oom for s in first):
        allocated = max(s.allocated_bytes or 0 for s in first)
        reserved = max(s.reserved_bytes or 0 for s in first)
    else:  # out of memory within them: what the loop would need
        allocated, reserved = loop.allocated_bytes, loop.reserved_bytes
    return Reprediction(ev, loop, allocated, reserved, seconds)


def near_capacity(results: Iterable[Reprediction]) -> tuple[list[Reprediction], list[Reprediction]]:
    """(boundary rows, rows far below capacity), each in the order given."""
    boundary, far = [], []
    for r in results:
        (boundary if r.near_capacity else far).append(r)
    return boundary, far


def recommended_with_retries(results: Iterable[Reprediction]) -> list[Reprediction]:
    """Rows whose steps needed an allocation retry on the GPU, at a batch the re-prediction
    recommends (a recommendation must not need one)."""
    return [r for r in results if (r.evidence.measured_retries or 0) > 0 and r.recommended]


def error_stats(errors: Iterable[float | None]) -> tuple[float, float] | None:
    """(median |error|, worst error) of the errors known, or None."""
    known = [e for e in errors if e is not None]
    if not known:
        return None
    return statistics.median(map(abs, known)), max(known, key=abs)


# -- reading rows back ---------------------------------------------------------------------------
def from_csv_row(row: Mapping[str, str], source: str) -> Evidence:
    """A `calibrate` row (docs/calibration/*.csv, read as strings). Rows written before loops
    were measured hold the first step's bytes and a verdict over the probe's steps."""
    settings = _settings(
        row["model"],
        row["precision"],
        task=row["task"] or None,
        optimizer=row["optimizer"],
        protocol=row["protocol"],
        grad_checkpointing=row["grad_checkpointing"] == "true",
        lora_rank=int(row["lora_rank"] or 0),
        grad_accum=int(row["grad_accum"] or 1),
        seq_len=row["seq_len"],
        image_size=row["image_size"],
    )
    device = replace(gpus.find_gpu(row["gpu_name"]), total_bytes=int(row["gpu_total_bytes"]))
    loop_steps = int(row.get("loop_steps") or 0)
    gpu = device.name + (f" as {row['emulated_gpu']}" if row["emulated_gpu"] else "")
    check = f" ({row['boundary_check']})" if row["boundary_check"] else ""
    return Evidence(
        source=source,
        label=f"{gpu}, {_describe(settings)}, batch {row['batch_size']}{check}",
        settings=settings,
        batch_size=int(row["batch_size"]),
        device_gpu=device,
        capacity_bytes=int(row["capacity_bytes"]),
        capped_as=row["emulated_gpu"],
        torch_version=row["torch_version"],
        boundary_check=row["boundary_check"],
        verdict_steps=loop_steps or LOOP_STEPS,
        byte_steps=loop_steps or 1,
        measured_runs=row["measured_fits"] == "true",
        measured_allocated_bytes=_int(row["measured_allocated_bytes"]),
        measured_reserved_bytes=_int(row["measured_reserved_bytes"]),
        measured_retries=_int(row["alloc_retries"]),
        measured_steps=_csv_steps(row),
    )


def from_steady_state(line: Mapping[str, Any], source: str) -> Evidence:
    """A line of benchmarks/steady_state.py: each real step's figures (bytes, or GiB in files
    written before it wrote bytes); the GPU that ran is the line's, else the file name's
    (`steady-state-<gpu>-<yyyy-mm-dd>.jsonl`)."""
    settings = _settings(line["model"], line["precision"])
    device = gpus.find_gpu(line.get("device_gpu") or _device_in_name(source))
    emulated = gpus.find_gpu(line["gpu"])
    capacity = int(line.get("capacity_bytes") or emulated.usable_bytes)
    steps = tuple(_step(s) for s in line["real"])
    finished = [s for s in steps if not s.oom]
    capped = f" as {emulated.name}" if emulated.name != device.name else ""
    return Evidence(
        source=source,
        label=f"{device.name}{capped}, {_describe(settings)}, batch {line['batch']} (steady state)",
        settings=settings,
        batch_size=int(line["batch"]),
        device_gpu=device,
        capacity_bytes=capacity,
        capped_as=emulated.name if capped else "",
        torch_version=line.get("torch_version", ""),
        verdict_steps=int(line.get("steps") or STEADY_STATE_STEPS),
        byte_steps=max(len(finished), 1),
        measured_runs=not any(s.oom for s in steps),
        measured_allocated_bytes=max((s.allocated_bytes or 0 for s in finished), default=None),
        measured_reserved_bytes=max((s.reserved_bytes or 0 for s in finished), default=None),
        measured_retries=sum(s.retries for s in steps),
        measured_steps=steps,
    )


def _settings(
    model: str,
    precision: str,
    *,
    protocol: str = "full",
    optimizer: str = "adamw",
    seq_len: str = "",
    image_size: str = "",
    **workload: Any,
) -> Settings:
    """The settings a row ran, with the default margin, simulated."""
    sizes = {"seq_len": int(seq_len)} if seq_len else {}
    sizes |= {"image_size": int(image_size)} if image_size else {}
    common = {"margin": RECOMMENDED_MARGIN, "backend": "sim", **sizes, **workload}
    if protocol == "inference-style":
        return Settings(model=model, precision=precision, **common).with_protocol(protocol)
    return Settings(model=model, precision=precision, optimizer=optimizer, **common)


def _describe(s: Settings) -> str:
    """ "gpt2, full bf16-mixed adamw, checkpointing, seq 128" (the table's words)."""
    parts = [f"{s.model}, {s.protocol} {s.precision} {s.optimizer}"]
    if s.grad_checkpointing:
        parts.append("checkpointing")
    if s.lora_rank:
        parts.append(f"LoRA r{s.lora_rank}")
    if s.grad_accum != 1:
        parts.append(f"accumulation {s.grad_accum}")
    text = models.find_model(s.model).input_kind == "text"
    parts.append(f"seq {s.seq_len}" if text else f"{s.image_size}px")
    return ", ".join(parts)


def _int(cell: str | None) -> int | None:
    return int(cell) if cell else None


def _csv_steps(row: Mapping[str, str]) -> tuple[StepPeaks, ...]:
    """The measured steps of a row written with loop columns (none before)."""
    allocated = split_cell(row.get("measured_allocated_per_step"))
    reserved = split_cell(row.get("measured_reserved_per_step"))
    retries = split_cell(row.get("measured_retries_per_step"))
    oom_step = _int(row.get("measured_oom_step"))
    return tuple(
        StepPeaks(
            i + 1,
            allocated[i] if i < len(allocated) else None,
            reserved[i] if i < len(reserved) else None,
            n,
            i + 1 == oom_step,
        )
        for i, n in enumerate(retries)
    )


def _step(step: Mapping[str, Any]) -> StepPeaks:
    def size(name: str) -> int | None:
        if step.get(f"{name}_bytes") is not None:
            return int(step[f"{name}_bytes"])
        gib = step.get(f"{name}_gib")
        return None if gib is None else round(gib * GIB)

    return StepPeaks(
        int(step["step"]),
        size("allocated"),
        size("reserved"),
        int(step["retries"]),
        bool(step["oom"]),
    )


def _device_in_name(source: str) -> str:
    """ "nvidia-h100-80gb-hbm3" from "steady-state-nvidia-h100-80gb-hbm3-2026-11-23.jsonl"."""
    match = re.fullmatch(r"steady-state-(.+)-\d{4}-\d{2}-\d{2}\.jsonl", source.rsplit("/")[-1])
    if match is None:
        raise ValueError(f"{source}: no device_gpu in the line and none in the file name")
    return match.group(1)
