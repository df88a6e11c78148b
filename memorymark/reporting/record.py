"""A finished Report as plain JSON data and back, so a saved analysis reopens without a re-run.

The `analyze --json` object (memorymark/reporting/json_form.py) is an answer for people and
tools: it rounds to GiB and leaves out what it derived its figures from. A record keeps the inputs
instead: settings, costs, the GPU, every measurement in bytes, the plan, the fixes and the
stamp, so `record_to_report(report_to_record(r))` gives a Report whose every figure, chart and
JSON key is the original's. Fields are written by name from the dataclasses, so fields added
later travel by themselves; a record from an older MemoryMark fills missing ones with their
defaults. Per-operator timelines are left out (kB per probe; nothing reopened draws them).
No torch, no I/O. Must not know where records are stored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memorymark.environment import Stamp
from memorymark.gpus import GPU
from memorymark.limits import one_line
from memorymark.measurement import Breakdown, DepthReplay, Measurement, StagePeak
from memorymark.report import Report
from memorymark.search.compile_gap import CompileGap
from memorymark.search.eval_batch import EvalAnswer
from memorymark.search.plan import TrainingPlan
from memorymark.settings import Costs, Settings, check_model
from memorymark.ways_out import Fix

RECORD_VERSION = 1
"""Bumped when a record's layout changes in a way `record_to_report` must know about."""


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of `data` that `cls` has as fields (a newer record's extra keys are dropped)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def gpu_record(gpu: GPU) -> dict[str, Any]:
    """A GPU's fields (a custom or detected GPU is not in the catalog, so all of them)."""
    return {f.name: getattr(gpu, f.name) for f in dataclasses.fields(GPU)}


def gpu_from_record(data: dict[str, Any]) -> GPU:
    """The inverse of `gpu_record`."""
    values = _known(GPU, data)
    values["compute_capability"] = tuple(values["compute_capability"])
    values["aliases"] = tuple(values.get("aliases") or ())
    return GPU(**values)


def measurement_record(m: Measurement) -> dict[str, Any]:
    """Every field of a measurement but its timeline, in bytes."""
    data = {f.name: getattr(m, f.name) for f in dataclasses.fields(Measurement)}
    data.pop("timeline")
    data["breakdown"] = m.breakdown.to_dict() if m.breakdown else None
    data["stages"] = [dataclasses.asdict(stage) for stage in m.stages]
    return data


def measurement_from_record(data: dict[str, Any]) -> Measurement:
    """The inverse of `measurement_record`."""
    values = _known(Measurement, data)
    if values.get("breakdown") is not None:
        values["breakdown"] = Breakdown(**_known(Breakdown, values["breakdown"]))
    values["stages"] = tuple(_stage(stage) for stage in values.get("stages") or ())
    return Measurement(**values)


def _stage(data: dict[str, Any]) -> StagePeak:
    values = _known(StagePeak, data)
    for name in ("stages", "stands_for"):
        values[name] = tuple(values[name])
    return StagePeak(**values)


def _fix_record(fix: Fix) -> dict[str, Any]:
    return {
        "label": fix.label,
        "settings": fix.settings.to_dict(),
        "gpu": gpu_record(fix.gpu),
        "peak_bytes": fix.peak_bytes,
        "required_bytes": fix.required_bytes,
        "limit_bytes": fix.limit_bytes,
        "lower_bound": fix.lower_bound,
        "hardware": fix.hardware,
        "samples_per_second": fix.samples_per_second,
    }


def _fix_from_record(data: dict[str, Any]) -> Fix:
    values = _known(Fix, data)
    if "capacity_bytes" in data:  # records saved before the field took the fit policy's name
        values.setdefault("limit_bytes", data["capacity_bytes"])
    values["settings"] = Settings.from_dict(values["settings"])
    values["gpu"] = gpu_from_record(values["gpu"])
    return Fix(**values)


def _eval_record(answer: EvalAnswer) -> dict[str, Any]:
    return {
        "batch": answer.batch,
        "accumulation": answer.accumulation,
        "at_batch": answer.at_batch,
        "measurement": measurement_record(answer.measurement),
        "probes": [[n, measurement_record(m)] for n, m in answer.probes],
        "stopped_by": answer.stopped_by,
    }


def _eval_from_record(data: dict[str, Any]) -> EvalAnswer:
    return EvalAnswer(
        batch=int(data["batch"]),
        accumulation=data.get("accumulation"),
        at_batch=int(data["at_batch"]),
        measurement=measurement_from_record(data["measurement"]),
        probes=tuple((int(n), measurement_from_record(m)) for n, m in data.get("probes") or ()),
        stopped_by=data.get("stopped_by"),
    )


def _gap_record(gap: CompileGap) -> dict[str, Any]:
    return {
        "compiled_max": gap.compiled_max,
        "eager_max": gap.eager_max,
        "at_batch": gap.at_batch,
        "compiled": measurement_record(gap.compiled),
        "eager": measurement_record(gap.eager),
        "stopped_by": gap.stopped_by,
        "budget": gap.budget,
        "full_budget": measurement_record(gap.full_budget) if gap.full_budget else None,
    }


def _gap_from_record(data: dict[str, Any]) -> CompileGap:
    return CompileGap(
        compiled_max=data.get("compiled_max"),
        eager_max=data.get("eager_max"),
        at_batch=int(data["at_batch"]),
        compiled=measurement_from_record(data["compiled"]),
        eager=measurement_from_record(data["eager"]),
        stopped_by=data.get("stopped_by"),
        budget=float(data.get("budget", 1.0)),
        full_budget=measurement_from_record(full) if (full := data.get("full_budget")) else None,
    )


def report_to_record(r: Report) -> dict[str, Any]:
    """Everything a Report holds, as JSON-able data."""
    return {
        "record_version": RECORD_VERSION,
        "settings": r.settings.to_dict(),
        "costs": r.costs.to_dict(),
        "gpu": gpu_record(r.gpu),
        "backend": r.backend,
        "measurements": [measurement_record(m) for m in r.measurements],
        "elapsed_seconds": r.elapsed_seconds,
        "fixes": [_fix_record(f) for f in r.fixes],
        "batch_1_required_bytes": r.batch_1_required_bytes,
        "fixes_stopped_by": r.fixes_stopped_by,
        "fixes_not_finished": list(r.fixes_not_finished),
        "plan": dataclasses.asdict(r.plan) if r.plan else None,
        "plan_probes": [measurement_record(m) for m in r.plan_probes],
        "evaluation": _eval_record(r.evaluation) if r.evaluation else None,
        "compile_gap": _gap_record(r.compile_gap) if r.compile_gap else None,
        "search_fallback": r.search_fallback,
        "depth_replay": r.depth_replay.to_dict() if r.depth_replay else None,
        "torch_version": r.torch_version,
        "unverified_rules": list(r.unverified_rules),
        "stamp": r.stamp.to_dict() if r.stamp else None,
    }


def record_to_report(data: dict[str, Any]) -> Report:
    """The Report a record was made from. Raises ValueError (one line) when the record cannot
    be read back, e.g. its settings name a `file:` model whose file is gone."""
    try:
        plan = data.get("plan")
        stamp = data.get("stamp")
        evaluation = data.get("evaluation")
        gap = data.get("compile_gap")
        depth = data.get("depth_replay")
        settings = Settings.from_dict(data["settings"])
        check_model(settings)  # Settings read nothing: a file: model since deleted fails here
        return Report(
            settings=settings,
            costs=Costs(**_known(Costs, data["costs"])),
            gpu=gpu_from_record(data["gpu"]),
            backend=str(data["backend"]),
            measurements=tuple(measurement_from_record(m) for m in data["measurements"]),
            elapsed_seconds=float(data["elapsed_seconds"]),
            fixes=tuple(_fix_from_record(f) for f in data.get("fixes") or ()),
            batch_1_required_bytes=data.get("batch_1_required_bytes"),
            fixes_stopped_by=data.get("fixes_stopped_by"),
            fixes_not_finished=tuple(data.get("fixes_not_finished") or ()),
            plan=TrainingPlan(**_known(TrainingPlan, plan)) if plan else None,
            plan_probes=tuple(measurement_from_record(m) for m in data.get("plan_probes") or ()),
            evaluation=_eval_from_record(evaluation) if evaluation else None,
            compile_gap=_gap_from_record(gap) if gap else None,
            search_fallback=data.get("search_fallback"),
            depth_replay=DepthReplay.from_dict(depth) if depth else None,
            torch_version=data.get("torch_version"),
            unverified_rules=tuple(data.get("unverified_rules") or ()),
            stamp=Stamp.from_dict(stamp) if stamp else None,
        )
    except (KeyError, TypeError) as exc:  # not a record this version wrote
        raise ValueError(f"the saved analysis cannot be read back: {exc!r}") from None
    except ValueError as exc:  # its settings no longer resolve (a file: model since deleted)
        raise ValueError(f"the saved analysis cannot be read back: {one_line(exc)}") from None
