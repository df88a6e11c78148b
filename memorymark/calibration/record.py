"""One calibration row and the files rows are kept in: the contract of docs/calibration/.

A row puts one measured step (on a real CUDA GPU) beside the simulation's prediction for the same
settings and GPU, stamped with the environment it ran in. `write` saves rows as
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
    """'allocated_bytes.all.peak' of `torch.cuda.memory_stats()` after the first step of the
    probe; None when the step ran out of memory."""
    measured_reserved_bytes: int | None
    """'reserved_bytes.all.peak', read at the same moment; None for an out-of-memory step."""
    measured_fits: bool
    """The fit policy on the measurement: no OOM, no allocation retry, reserved within capacity."""
    alloc_retries: int | None
    """'num_alloc_retries' during the probe (cache flushed and cudaMalloc retried)."""
    num_ooms: int | None
    """'num_ooms' during the probe."""
    predicted_allocated_bytes: int
    """The simulation's allocated peak as CUDA counts it (512-byte blocks)."""
    predicted_reserved_bytes: int | None
    """The simulation's reserved peak (the caching-allocator replay); for a predicted OOM, what
    the step would need."""
    predicted_fits: bool
    """The fit policy on the prediction, against the same capacity."""

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
        """A flat record, keys in `COLUMNS` order (JSON values: bytes as ints, None as null)."""
        record: dict[str, Any] = self.environment.to_dict()
        for f in fields(self):
            if f.name != "environment":
                record[f.name] = getattr(self, f.name)
        record["allocated_error"] = self.allocated_error
        record["reserved_error"] = self.reserved_error
        record["verdict_agrees"] = self.verdict_agrees
        return record


def _relative(predicted: int | None, measured: int | None) -> float | None:
    if predicted is None or not measured:
        return None
    return round((predicted - measured) / measured, 5)


COLUMNS: tuple[str, ...] = (
    *(f.name for f in fields(GpuEnvironment)),
    *(f.name for f in fields(CalibrationRow) if f.name != "environment"),
    "allocated_error",
    "reserved_error",
    "verdict_agrees",
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
    rows: list[CalibrationRow], out_dir: Path, day: datetime.date | None = None
) -> tuple[Path, Path]:
    """Write the rows as `<stem>.csv` and `<stem>.json` into `out_dir` (a file of the same GPU
    and day is replaced); returns both paths."""
    env = rows[0].environment if rows else None
    stem = file_stem(env.gpu_name if env else "gpu", env.emulated_gpu if env else "", day)
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
    """true/false for booleans and an empty cell for None, as the README promises."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else value
