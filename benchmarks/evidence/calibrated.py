"""The evidence chunks made of calibration rows: the smoke test, the capped-capacity question,
QLoRA with the bitsandbytes optimizers and Liger, and the compiled step beside eager.

Each runs `memorymark calibrate`'s engine (memorymark/calibration/run.py) on the `Device` it is
handed and writes rows in the docs/calibration contract, one file pair per capacity and cap,
named apart with a suffix. Each returns what it did for the run's manifest: files written,
rows, what it skipped and why.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.metadata
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.evidence.device import Device, missing
from benchmarks.evidence.plan import Plan, Row
from memorymark import gpus
from memorymark.accounting.allocator import PROBE
from memorymark.calibration import ballast
from memorymark.calibration.record import CalibrationRow, write
from memorymark.calibration.run import (
    CAP_BALLAST,
    CAP_FRACTION,
    RECOMMENDED_MARGIN,
    calibrate,
    settings_grid,
)
from memorymark.engine import Session
from memorymark.settings import Settings

LIBRARIES = (
    "bitsandbytes", "liger_kernel", "lightning", "accelerate", "flash_attn", "peft", "torchao",
    "triton",
)  # fmt: skip
"""The optional libraries the chunks use, whose versions the smoke test records."""


def grid(settings: dict[str, Any]) -> tuple[Settings, ...]:
    """One row's settings as calibrate's grid (full protocol: the step people train)."""
    rest = dict(settings)
    return settings_grid(
        [rest.pop("model")],
        precisions=[rest.pop("precision", "32-true")],
        optimizers=[rest.pop("optimizer", "adamw")],
        protocols=["full"],
        **rest,
    )


def rows(
    device: Device,
    row: Row,
    emulate: gpus.GPU | None = None,
    skipped: list[str] | None = None,
    **options: Any,
) -> list[CalibrationRow]:
    """Calibrate one `Row` on `device` (capped to `emulate` if given). A combination the model
    cannot build, or one that fails (a library that imports but cannot run here), is appended
    to `skipped` with its reason, keeping the rows measured before it: one broken row must not
    cost a lease the others."""
    skipped = skipped if skipped is not None else []
    found: list[CalibrationRow] = []
    try:
        for found_row in calibrate(
            grid(row.settings),
            row.batch_sizes,
            emulate=emulate,
            cuda=device.cuda,
            real=device.real,
            simulated=device.simulated,
            runtime=device.runtime,
            on_skip=lambda s, why: skipped.append(f"{s.workload.model}: {why}"),
            **options,
        ):
            found.append(found_row)
    except Exception as exc:  # noqa: BLE001 - recorded in the manifest, the chunk goes on
        skipped.append(f"{row.settings} failed: {type(exc).__name__}: {exc}"[:500])
    return found


def smoke(device: Device, plan: Plan, out: Path, day: datetime.date) -> dict[str, Any]:
    """A minute or less: the versions, one uncapped row, and a ballast taken and given back."""
    versions = {name: _version(name) for name in LIBRARIES}
    skipped: list[str] = []
    found = rows(device, plan.smoke, None, skipped, steps=2)
    if not found:  # the rest would fail the same way: stop the run here
        raise RuntimeError(f"the smoke test's row did not run: {skipped}")
    capacity = plan.gpu(plan.loop_capacities[0])
    with ballast.held(device.runtime or ballast.CudaRuntime(), capacity.usable_bytes) as held:
        free_under_ballast, _ = device.cuda.mem_get_info()
    return {
        "versions": versions,
        "rows": [r.to_dict() for r in found],
        "ballast": {
            "capacity": capacity.name,
            "capacity_bytes": capacity.usable_bytes,
            "held_bytes": held,
            "free_bytes_reported": free_under_ballast,
            "slack_bytes": free_under_ballast - capacity.usable_bytes,
        },
    }


def capped(device: Device, plan: Plan, out: Path, day: datetime.date) -> dict[str, Any]:
    """The committed rows that needed an allocation retry, re-run as they ran (probes) under
    a ballast, then under the memory fraction: one file pair per capacity and cap."""
    files: list[str] = []
    skipped: list[str] = []
    for cap in (CAP_BALLAST, CAP_FRACTION):
        for capacity in dict.fromkeys(r.capacity for r in plan.capped):
            found: list[CalibrationRow] = []
            written: list[str] = []
            for r in plan.capped:
                if r.capacity != capacity:
                    continue
                options = {"cap": cap, "boundary_rows": False, "steps": plan.capped_steps}
                found += rows(device, r, plan.gpu(capacity), skipped, start=PROBE, **options)
                written = _write(found, out, day, f"capped-{cap}")  # each row kept as it lands
            files += written
    return {"files": files, "skipped": skipped}


def quantized(device: Device, plan: Plan, out: Path, day: datetime.date) -> dict[str, Any]:
    """QLoRA, 8-bit and paged AdamW, Liger, each measured beside its simulation on the whole
    device, then QLoRA's boundary at a smaller capacity. A row whose library is missing is
    skipped with the reason (the manifest carries it)."""
    skipped: list[str] = []
    files = _uncapped(device, plan.quantized, out, day, "quantized", skipped)
    edge = plan.quantized_boundary
    why = needs(device, edge.settings)
    if why:
        skipped.append(f"boundary {edge.settings}: {why}")
    else:
        found = rows(device, edge, plan.gpu(edge.capacity), skipped, boundary=boundary)
        files += _write(found, out, day, "quantized")
    return {"files": files, "skipped": skipped}


def compiled(device: Device, plan: Plan, out: Path, day: datetime.date) -> dict[str, Any]:
    """The same step eager, compiled and compiled with Float8, each beside its simulation on
    the whole device (dry: the compiled rows simulated on both sides, the manifest says why).
    A row whose library is missing (torchao for Float8) is skipped with the reason."""
    skipped: list[str] = []
    files = _uncapped(device, plan.compiled, out, day, "compiled", skipped)
    return {"files": files, "skipped": skipped}


def _uncapped(
    device: Device,
    planned: Iterable[Row],
    out: Path,
    day: datetime.date,
    suffix: str,
    skipped: list[str],
) -> list[str]:
    """Each of `planned` on the whole device, its file pair rewritten as each row lands; a row
    whose library is missing is skipped with the reason."""
    found: list[CalibrationRow] = []
    files: list[str] = []
    for row in planned:
        why = needs(device, row.settings)
        if why:
            skipped.append(f"{row.settings}: {why}")
            continue
        found += rows(device, row, None, skipped)
        files = _write(found, out, day, suffix)
    return files


def needs(device: Device, settings: dict[str, Any]) -> str:
    """What keeps `settings` from running here: a library its measured side needs (on a
    GPU) or its simulation needs (bitsandbytes' modules, dry or not); empty when nothing."""
    s = grid(settings)[0]
    libraries = []
    if s.workload.quantization != "none" or "8bit" in s.workload.optimizer:
        libraries.append("bitsandbytes")
    if s.workload.kernels == "liger" and not device.dry:
        libraries.append("liger_kernel")
    if s.workload.float8 != "none":
        libraries.append("torchao")  # the simulation converts the model with it too
    if device.dry and s.workload.kernels == "liger" and missing("liger_kernel"):
        device.notes.append("liger_kernel is not installed here: the dry run simulated Liger only")
    return "; ".join(filter(None, (missing(name) for name in libraries)))


def boundary(settings: Settings, gpu: gpus.GPU) -> tuple[int, int, int]:
    """calibrate's boundary on any capacity (a dry one is no catalog GPU): the largest batch a
    simulated sweep says runs, its step, and the batch it recommends at the default margin."""
    report = Session(settings.replace(backend="sim", margin=RECOMMENDED_MARGIN), gpu=gpu).analyze(
        fixes=False, plan=False
    )
    best, optimal = report.max_fit, report.optimal
    return (
        best.batch_size if best else 0,
        settings.search.step,
        optimal.batch_size if optimal else 0,
    )


def _write(
    found: Iterable[CalibrationRow], out: Path, day: datetime.date, suffix: str
) -> list[str]:
    found = list(found)
    if not found:
        return []
    return [p.name for p in write(found, out, day, suffix)]


def _version(name: str) -> str:
    """The library's version once imported, else why it cannot be (a wheel built for another
    CUDA imports with an error, not as missing)."""
    why = missing(name)
    if why:
        return why
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - what the chunks that need it will meet
        return f"installed, fails to import: {type(exc).__name__}: {exc}"[:300]
    try:
        return importlib.metadata.version(name.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        return "imports, version unknown"
