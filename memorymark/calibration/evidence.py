"""What a committed calibration row says ran: read back from docs/calibration's files.

Owns `Evidence` (settings, batch, the GPU that ran and its torch, the capacity it was capped at,
and what the GPU said, step by step where the file has it) and the two readers: a `calibrate`
CSV row (`from_csv_row`, as csv.DictReader gives it) and a line of benchmarks/steady_state.py
(`from_steady_state`), old files (GiB figures, first-step bytes) included. Must not know the
simulation, where the files are, or how anything is shown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from memorymark import gpus, models
from memorymark.accounting.allocator import PROBE
from memorymark.calibration.loop import LOOP_STEPS, StepPeaks
from memorymark.calibration.record import split_cell
from memorymark.calibration.run import RECOMMENDED_MARGIN
from memorymark.settings import Settings
from memorymark.units import GIB

STEADY_STATE_STEPS = 4
"""Steps a steady-state line asked for when it does not say: benchmarks/steady_state.py's
default, which docs/calibration/steady-state-*-2026-11-23.jsonl ran (its README says so)."""


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
    loop_start: str = PROBE.name
    """How the measured loop reached step 1 (`allocator.LoopStart.name`); files written
    before they said ran probes (state primed, the cache emptied before step 1)."""


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
        **_step_extras(row),
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
        loop_start=row.get("loop_start") or PROBE.name,
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
        loop_start=line.get("loop_start") or PROBE.name,
    )


def _step_extras(row: Mapping[str, str]) -> dict[str, Any]:
    """The `quantization`, `kernels`, `compile` and `float8` columns (files from 2026-11-28
    on) as settings: "nf4 double-quant" is quantization nf4 with double_quant; an absent
    column, the default."""
    quantization, _, double = (row.get("quantization") or "none").partition(" ")
    extras: dict[str, Any] = {}
    if quantization != "none":
        extras.update(quantization=quantization, double_quant=double == "double-quant")
    if row.get("kernels"):
        extras["kernels"] = row["kernels"]
    if str(row.get("compile", "")).lower() == "true":
        extras["compile"] = True
    if row.get("float8") not in (None, "", "none"):
        extras["float8"] = row["float8"]
    return extras


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
    parts = [
        f"{s.workload.model}, {s.workload.protocol} {s.workload.precision} {s.workload.optimizer}"
    ]
    if s.workload.grad_checkpointing:
        parts.append("checkpointing")
    if s.workload.lora_rank:
        parts.append(f"LoRA r{s.workload.lora_rank}")
    if s.workload.grad_accum != 1:
        parts.append(f"accumulation {s.workload.grad_accum}")
    if s.workload.quantization != "none":
        parts.append(s.workload.quantization + (" double-quant" if s.workload.double_quant else ""))
    if s.workload.kernels != "none":
        parts.append(s.workload.kernels)
    if s.workload.compile:
        parts.append("compiled")
    if s.workload.float8 != "none":
        parts.append(f"float8 {s.workload.float8}")
    text = models.find_model(s.workload.model).input_kind == "text"
    parts.append(f"seq {s.workload.seq_len}" if text else f"{s.workload.image_size}px")
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
