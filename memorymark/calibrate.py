"""Calibration: the simulation and a real CUDA measurement side by side, with relative errors.

On a machine with a CUDA GPU, `memorymark calibrate` runs each built-in model at several batch
sizes under the full training step and the inference-style protocol, once simulated for this very
GPU and once for real, and tabulates predicted vs measured allocated and reserved memory. Anyone
with a GPU can check the simulation and contribute the CSV. This module composes the engine; it
never measures anything itself.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from memorymark.backend import Backend
from memorymark.devices import open_backend
from memorymark.settings import Settings

DEFAULT_MODELS = ("bert", "gpt2", "resnet")
DEFAULT_BATCH_SIZES = (4, 8, 16)
PROTOCOLS = ("full", "inference-style")

BackendFactory = Callable[[Settings], Backend]


class NoGpuError(RuntimeError):
    """Calibration compares against a real GPU, and there is none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationRow:
    """One model, protocol and batch size: simulated against measured bytes."""

    model: str
    protocol: str
    batch_size: int
    simulated_allocated_bytes: int
    measured_allocated_bytes: int | None
    simulated_reserved_bytes: int | None
    measured_reserved_bytes: int | None
    measured_fits: bool

    @property
    def allocated_error(self) -> float | None:
        """(simulated - measured) / measured for allocated memory; None if the real step OOMed."""
        return _relative(self.simulated_allocated_bytes, self.measured_allocated_bytes)

    @property
    def reserved_error(self) -> float | None:
        """(simulated - measured) / measured for reserved memory, where both exist."""
        return _relative(self.simulated_reserved_bytes, self.measured_reserved_bytes)

    def to_dict(self) -> dict[str, object]:
        """A flat record for JSON and CSV."""
        return {
            **asdict(self),
            "allocated_error": self.allocated_error,
            "reserved_error": self.reserved_error,
        }


def _relative(simulated: int | None, measured: int | None) -> float | None:
    if simulated is None or not measured:
        return None
    return round((simulated - measured) / measured, 5)


def _real_backend(settings: Settings) -> Backend:
    return open_backend(replace(settings, backend="cuda"))[0]


def _sim_backend(settings: Settings, gpu_name: str) -> Backend:
    return open_backend(replace(settings, backend="sim", gpu=gpu_name))[0]


def calibrate(
    models: tuple[str, ...] = DEFAULT_MODELS,
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
    *,
    real: BackendFactory | None = None,
    simulated: BackendFactory | None = None,
) -> Iterator[CalibrationRow]:
    """Yield one row per model, protocol and batch size, as each pair of measurements lands."""
    if real is None:
        from memorymark.devices import cuda_available, detect_cuda_gpu

        if not cuda_available():
            raise NoGpuError("calibrate needs a CUDA GPU and PyTorch sees none")
        gpu_name = detect_cuda_gpu().name
        real = _real_backend
        simulated = simulated or (lambda s: _sim_backend(s, gpu_name))
    assert simulated is not None
    for model in models:
        for protocol in PROTOCOLS:
            settings = Settings(model=model).with_protocol(protocol)
            # One backend per protocol: model and optimizer state stay resident across batches.
            with real(settings).session() as real_backend, simulated(settings).session() as sim:
                for batch in batch_sizes:
                    yield _row(
                        model, protocol, batch, sim.measure(batch), real_backend.measure(batch)
                    )


def _row(model: str, protocol: str, batch: int, sim, measured) -> CalibrationRow:  # noqa: ANN001
    return CalibrationRow(
        model=model,
        protocol=protocol,
        batch_size=batch,
        # Like for like: what CUDA's allocator would count (512-byte blocks), not raw tensor bytes.
        simulated_allocated_bytes=sim.cuda_allocated_bytes,
        measured_allocated_bytes=measured.cuda_allocated_bytes if measured.fits else None,
        simulated_reserved_bytes=sim.predicted_reserved_bytes,
        measured_reserved_bytes=measured.cuda_reserved_bytes if measured.fits else None,
        measured_fits=measured.fits,
    )


def write(rows: list[CalibrationRow], out_dir: Path) -> tuple[Path, Path]:
    """Write calibration.json and calibration.csv into `out_dir`; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    records = [r.to_dict() for r in rows]
    json_path, csv_path = out_dir / "calibration.json", out_dir / "calibration.csv"
    json_path.write_text(json.dumps(records, indent=2))
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]) if records else ["model"])
        writer.writeheader()
        writer.writerows(records)
    return json_path, csv_path
