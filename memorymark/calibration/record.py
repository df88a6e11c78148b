"""One calibration row and the files rows are kept in: the contract of docs/calibration/.

A row puts a measured training loop's first steps (on a real CUDA GPU) beside the simulation's
prediction for the same steps, settings and capacity, stamped with the environment it ran in:
the peaks over the steps, and each step's (`LOOP_COLUMNS`). `write` saves rows as
`<gpu>-<yyyy-mm-dd>.csv` with a JSON twin; docs/calibration/README.md describes every column,
and `COLUMNS` is their order. This module is plain data and files: no torch, no devices.
"""

from __future__ import annotations

import csv
import datetime
import json
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from memorymark.environment import GpuEnvironment

BOUNDARY_RECOMMENDED = "recommended"
"""`boundary_check` of the row at the batch MemoryMark recommends (default margin, no
allocation retry), which must fit."""
BOUNDARY_MAX = "max fits"
"""`boundary_check` of the row at the largest batch the simulation says runs."""
BOUNDARY_PAST_MAX = "max+step OOM"
"""`boundary_check` of the row one search step past it, which must not run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationRow:
    """One settings combination at one batch size: measured against predicted bytes."""

    environment: GpuEnvironment
    model: str
    task: str
    precision: str
    optimizer: str
    grad_checkpointing: bool
    lora_rank: int
    protocol: str
    """full (train, task loss, optimizer) or inference-style (eval, logits.mean(), none)."""
    seq_len: int | None
    """Tokens per sample for a text model; None for an image model."""
    image_size: int | None
    """Pixels per side for an image model; None for a text model."""
    batch_size: int
    grad_accum: int
    boundary_check: str = ""
    """BOUNDARY_RECOMMENDED, BOUNDARY_MAX or BOUNDARY_PAST_MAX for the --emulate-gpu boundary
    rows, else empty."""
    capacity_bytes: int
    """What the verdicts were judged against: the caching allocator's capacity (total less the
    CUDA context) of the emulated GPU, else of this one."""
    measured_allocated_bytes: int | None
    """'allocated_bytes.all.peak' of `torch.cuda.memory_stats()`: the highest of the loop's
    steps that finished (step 1's when step 2 ran out of memory); None when the first step ran
    out of memory."""
    measured_reserved_bytes: int | None
    """'reserved_bytes.all.peak' over the same steps; None when the first step ran out of
    memory."""
    measured_fits: bool
    """The fit policy's *runs* verdict on the measurement: every step ran, reserved within
    capacity (allocation retries allowed)."""
    alloc_retries: int | None
    """'num_alloc_retries' during the loop's steps (cache flushed and cudaMalloc retried)."""
    num_ooms: int | None
    """'num_ooms' during the loop."""
    predicted_allocated_bytes: int
    """The simulation's allocated peak as CUDA counts it (512-byte blocks), over the same
    steps."""
    predicted_reserved_bytes: int | None
    """The simulation's reserved peak (the caching-allocator replay) over the same steps; for a
    predicted OOM, what the loop would need."""
    predicted_fits: bool
    """The fit policy on the prediction, against the same capacity."""
    # The loop, step by step (LOOP_COLUMNS: after the derived columns, so that files written
    # before them keep every column where it was).
    loop_steps: int | None = None
    """Consecutive steps the probe ran at most (the measured bytes are their peak); None in
    files from before probes ran a loop (the measured bytes are the first step's)."""
    measured_oom_step: int | None = None
    """The step that ran out of memory on the GPU; None when none did."""
    measured_allocated_per_step: tuple[int, ...] = ()
    """Each finished step's allocated peak (peak statistics reset before each), in order."""
    measured_reserved_per_step: tuple[int, ...] = ()
    """Each finished step's reserved peak, in order."""
    measured_retries_per_step: tuple[int, ...] = ()
    """Allocation retries of each step run, the one that ran out of memory included."""
    predicted_retries: int | None = None
    """The replay's allocation retries over the same steps (`alloc_retries`' counterpart)."""
    predicted_oom_step: int | None = None
    """The step at which the replay against the capacity ran out of memory; None when none
    did (it may be past `loop_steps`: the verdict reads the whole replay)."""
    predicted_allocated_per_step: tuple[int, ...] = ()
    """The replay's allocated peak of each finished step, over the same steps."""
    predicted_reserved_per_step: tuple[int, ...] = ()
    """The replay's reserved peak of each finished step."""
    predicted_retries_per_step: tuple[int, ...] = ()
    """The replay's allocation retries of each step, the one that ran out of memory included."""
    loop_start: str = ""
    """How both loops reached step 1 (`allocator.LoopStart.name`): "training loop" (no flush,
    the optimizer state made in step 1) or "probe" (state primed, the cache emptied first);
    empty in files written before the column, whose rows ran as probes."""
    # What else shaped the step and the cap (EXTRA_COLUMNS: after the loop's, for the same
    # reason; from 2026-11-28).
    quantization: str = "none"
    """The base weights' quantization: "none", "nf4", "fp4" or "int8", with " double-quant"
    when the 4-bit absmax is quantized too (QLoRA's `bnb_4bit_use_double_quant`)."""
    kernels: str = ""
    """Kernels replacing the model's own: "liger" (Liger-Kernel), else empty."""
    cap_method: str = ""
    """How an emulated GPU's capacity was imposed: "fraction"
    (`set_per_process_memory_fraction`, PyTorch's allocator alone) or "ballast" (the rest of
    the card held by raw `cudaMalloc`, so `cudaMemGetInfo` sees the smaller card too); empty
    for an uncapped run, and in files written before the column (they were capped by fraction)."""
    compile: bool = False
    """Whether each transformer block ran under `torch.compile` (Inductor on the GPU, the
    compiled simulation beside it: memorymark/step/compiled.py); false in files written before
    the column."""
    float8: str = "none"
    """torchao's Float8 training recipe the linear layers ran (`tensorwise`, `rowwise`), else
    "none"."""

    @property
    def allocated_error(self) -> float | None:
        """(predicted - measured) / measured allocated bytes; None where the step ran out of
        memory."""
        return _relative(self.predicted_allocated_bytes, self.measured_allocated_bytes)

    @property
    def reserved_error(self) -> float | None:
        """(predicted - measured) / measured reserved bytes, where both exist."""
        return _relative(self.predicted_reserved_bytes, self.measured_reserved_bytes)

    @property
    def verdict_agrees(self) -> bool:
        """True when the simulation and the GPU agree on whether the step runs."""
        return self.measured_fits == self.predicted_fits

    def to_dict(self) -> dict[str, Any]:
        """A flat record, keys in `COLUMNS` order (JSON values: bytes as ints, None as null,
        per-step figures as lists)."""
        record: dict[str, Any] = self.environment.to_dict()
        for f in fields(self):
            if f.name != "environment" and f.name not in (*LOOP_COLUMNS, *EXTRA_COLUMNS):
                record[f.name] = getattr(self, f.name)
        record["allocated_error"] = self.allocated_error
        record["reserved_error"] = self.reserved_error
        record["verdict_agrees"] = self.verdict_agrees
        for name in LOOP_COLUMNS:
            value = getattr(self, name)
            record[name] = list(value) if isinstance(value, tuple) else value
        for name in EXTRA_COLUMNS:
            record[name] = getattr(self, name)
        return record


def _relative(predicted: int | None, measured: int | None) -> float | None:
    if predicted is None or not measured:
        return None
    return round((predicted - measured) / measured, 5)


LOOP_COLUMNS: tuple[str, ...] = (
    "loop_steps",
    "measured_oom_step",
    "measured_allocated_per_step",
    "measured_reserved_per_step",
    "measured_retries_per_step",
    "predicted_retries",
    "predicted_oom_step",
    "predicted_allocated_per_step",
    "predicted_reserved_per_step",
    "predicted_retries_per_step",
    "loop_start",
)
"""The columns a loop's steps fill, after the derived columns."""
EXTRA_COLUMNS: tuple[str, ...] = ("quantization", "kernels", "cap_method", "compile", "float8")
"""The columns added on 2026-11-28, last in a file."""

COLUMNS: tuple[str, ...] = (
    *(f.name for f in fields(GpuEnvironment)),
    *(
        f.name
        for f in fields(CalibrationRow)
        if f.name not in ("environment", *LOOP_COLUMNS, *EXTRA_COLUMNS)
    ),
    "allocated_error",
    "reserved_error",
    "verdict_agrees",
    *LOOP_COLUMNS,
    *EXTRA_COLUMNS,
)


def file_stem(gpu_name: str, emulated_gpu: str = "", day: datetime.date | None = None) -> str:
    """`<gpu>-<yyyy-mm-dd>`, or `<gpu>-as-<emulated>-<yyyy-mm-dd>` for a capped run: the name
    of a calibration file without its extension (UTC date unless `day` is given)."""
    day = day or datetime.datetime.now(datetime.timezone.utc).date()
    gpu = _slug(gpu_name) + (f"-as-{_slug(emulated_gpu)}" if emulated_gpu else "")
    return f"{gpu}-{day.isoformat()}"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def write(
    rows: list[CalibrationRow], out_dir: Path, day: datetime.date | None = None, suffix: str = ""
) -> tuple[Path, Path]:
    """Write the rows as `<stem>.csv` and `<stem>.json` into `out_dir` (a file of the same GPU
    and day is replaced); returns both paths. `suffix` ("llm") names a file apart from others
    of the same GPU and day: `<stem>-llm.csv`, as the committed files were renamed."""
    env = rows[0].environment if rows else None
    stem = file_stem(env.gpu_name if env else "gpu", env.emulated_gpu if env else "", day)
    stem += f"-{_slug(suffix)}" if suffix else ""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.json"
    records = [r.to_dict() for r in rows]
    json_path.write_text(json.dumps(records, indent=2) + "\n")
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: _csv_value(v) for k, v in r.items()} for r in records)
    return csv_path, json_path


def _csv_value(value: Any) -> Any:
    """true/false for booleans, an empty cell for None, as the README promises, and a list
    of figures as one cell, space-separated (`split_cell` reads it back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return "" if value is None else value


def split_cell(cell: str | None) -> tuple[int, ...]:
    """A per-step CSV cell as its integers (an empty or missing cell: none)."""
    return tuple(int(v) for v in (cell or "").split())
