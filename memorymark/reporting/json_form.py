"""The JSON form of a Report: the `analyze --json` contract, kept apart from the arithmetic.

The original API's `/analyze` fields come first under their original names (`*_gb` are GiB,
2**30 bytes), then what later issues added. No torch, no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memorymark import models
from memorymark.distributed import topology
from memorymark.measurement import Breakdown, Measurement
from memorymark.settings import Workload
from memorymark.units import gib, gib_or_none

# The one fit policy (memorymark/fit.py), in words, for every backend alike.
FIT_CRITERION = (
    "runs: no out-of-memory, reserved bytes within usable memory; fits (recommended): runs "
    "with no allocation retry and reserved bytes within usable memory less the margin"
)

if TYPE_CHECKING:
    from memorymark.report import Report

WORKLOAD_FIELDS = tuple(Workload.__dataclass_fields__)
"""The settings a training job's own code says (memorymark/step/user_job.py `check_settings`)."""


def report_to_dict(r: Report) -> dict[str, Any]:
    """The `analyze --json` object: the original API's /analyze fields plus what was added.

    `speedup` is the throughput ratio (`speedup_source` says when it falls back to the batch
    ratio, which `batch_ratio` always holds); memory keys are described in memorymark/report.py.
    """
    optimal, current, maximum = r.optimal, r.current, r.max_fit
    breakdown: Breakdown | None = optimal.breakdown if optimal else None
    return {
        "model_name": r.model_name,
        "model_display_name": r.training
        or models.find_model(r.settings.workload.model).display_name,
        "training": r.training is not None,
        "set_up_for": r.set_up_for,
        "setup_note": r.setup_note,
        "value_reads": [read.to_dict() for read in r.value_reads],
        "graph_breaks": list(r.graph_breaks),
        "device": r.backend,
        "gpu_name": r.gpu.name,
        "gpu_total_gb": gib(r.gpu.total_bytes),
        "optimal_batch_size": optimal.batch_size if optimal else None,
        "optimal_memory_gb": gib(optimal.peak_bytes) if optimal else None,
        "current_batch_size": r.settings.search.current_batch,
        "current_memory_gb": gib(current.peak_bytes) if current and current.runs else None,
        "waste_gb": gib_or_none(r.waste_bytes),
        "waste_percent": r.waste_percent,
        "speedup": r.speedup,
        "speedup_source": r.speedup_source,
        "cost_savings_annual": r.cost_savings_annual,
        "results": [_row(m) for m in sorted(r.measurements, key=_batch)],
        "backend": r.backend,
        "memory_source": r.memory_source,
        "loop_start": r.loop_start,
        "max_batch_size": maximum.batch_size if maximum else None,
        "max_reserved_gb": gib_or_none(maximum.required_bytes if maximum else None),
        "usable_gb": gib(r.gpu.usable_bytes),
        **_memory_dict(r),
        **_throughput_dict(r),
        "current_fits": r.current_fits,
        "capped_at_max_batch": r.capped,
        "verdict": r.verdict(),
        "fit_window": r.fit_window.to_dict() if r.fit_window else None,
        "breakdown": breakdown.to_dict() if breakdown else None,
        **_weights_and_paging(r),
        "probes": len(r.measurements),
        "stopped_by": r.stopped_by,
        "partial_note": r.partial_note,
        "strategy": r.settings.search.strategy,
        "replayed": sum(m.replayed for m in r.measurements),
        "search_fallback": r.search_fallback,
        "search_note": r.search_note,
        "depth_replay": r.depth_replay.to_dict() if r.depth_replay else None,
        "depth_note": r.depth_note,
        "elapsed_seconds": round(r.elapsed_seconds, 3),
        "usd_per_hour": r.usd_per_hour,
        "annual_cost_usd": round(r.annual_cost_usd, 2),
        "global_batch": r.global_batch,
        "plan": r.plan.to_dict() if r.plan else None,
        "plan_note": r.plan_note,
        "plan_probes": [_row(m) for m in r.plan_probes],
        "eval": r.evaluation.to_dict() if r.evaluation else None,
        "compile_gap": r.compile_gap.to_dict() if r.compile_gap else None,
        "fixes": [fix.to_dict(r.fix_usd_per_gpu_hour(fix)) for fix in r.fixes],
        "ways_out_stopped_by": r.fixes_stopped_by,
        "ways_out_not_finished": list(r.fixes_not_finished),
        "ways_out_note": r.ways_out_note,
        "batch_1_required_gb": None
        if r.batch_1_required_bytes is None
        else gib(r.batch_1_required_bytes),
        "distributed": _distributed_dict(r),
        "torch_version": r.torch_version,
        "rules_unverified": list(r.unverified_rules),
        "rules_note": r.rules_note,
        "settings": _settings_dict(r),
        "observed": _observed_dict(r),
        "costs": r.costs.to_dict(),
        "environment": r.stamp.to_dict() if r.stamp else None,
    }


def _settings_dict(r: Report) -> dict[str, Any]:
    """Every setting by its flat name. A training job's own code says its model and how it
    steps (precision, optimizer, sequence length...), which the settings then do not know:
    those are null, never the catalog's defaults; `observed` says what the job was seen to do."""
    settings = r.settings.to_dict()
    if r.training is None:
        return settings
    return {**settings, **dict.fromkeys(WORKLOAD_FIELDS)}


def _observed_dict(r: Report) -> dict[str, Any] | None:
    """A training job: what its step was seen to do while it ran off its GPU (`autocast_dtypes`,
    null when not observed, as on a real GPU). None for the catalog's step."""
    if r.training is None:
        return None
    dtypes = r.autocast_dtypes
    return {"autocast_dtypes": None if dtypes is None else list(dtypes)}


def _weights_and_paging(r: Report) -> dict[str, Any]:
    """Quantized weights' GiB and paged optimizer state (memorymark/step/paging.py), from any
    traced probe: neither depends on the batch size, except whether the state pages."""
    first = next((m for m in r.measurements if m.paged_bytes is not None), None)
    quantized = next((m.quantized_weight_bytes for m in r.measurements), None)
    shown = r.optimal or first
    return {
        "quantized_weights_gb": None if quantized is None else gib(quantized, 4),
        "paged_optimizer_state_gb": None if first is None else gib(first.paged_bytes or 0, 4),
        "optimal_pages_to_host": shown.pages_to_host if shown is not None else None,
    }


def _memory_dict(r: Report) -> dict[str, Any]:
    """Which memory number is which: allocated, reserved, the limit and the margin."""
    optimal, current = r.optimal, r.current
    current_fit = current if current is not None and current.runs else None
    return {
        "optimal_allocated_gb": gib_or_none(optimal.cuda_allocated_bytes if optimal else None),
        "optimal_reserved_gb": gib_or_none(optimal.cuda_reserved_bytes if optimal else None),
        "current_reserved_gb": gib_or_none(
            current_fit.cuda_reserved_bytes if current_fit else None
        ),
        "limit_gb": gib(r.limit_bytes),
        "margin_gb": gib(r.margin_bytes),
        "headroom_gb": gib_or_none(r.headroom_bytes),
        "predicted_oom_batch": r.predicted_oom_batch,
        "fit_criterion": FIT_CRITERION,
        # Only the context: the cuBLAS workspaces come from the caching allocator, so they are
        # inside usable memory and inside each step's reserved bytes.
        # NCCL's buffers (estimated) on each rank of a distributed run, 0 on one GPU.
        "gpu_overheads_gb": {"context": gib(r.gpu.context_bytes), "nccl": gib(r.gpu.nccl_bytes)},
    }


def _distributed_dict(r: Report) -> dict[str, Any]:
    """Many GPUs: the strategy, per-GPU and global batch, and rank 0's memory (simulated on
    rank 0 of a fake process group; every rank holds the same but for uneven shards)."""
    s, optimal = r.settings, r.optimal
    per_rank = optimal.breakdown.to_dict() if optimal and optimal.breakdown else None
    return {
        "dist": s.hardware.dist,
        "zero_stage": topology.ZERO_STAGE.get(s.hardware.dist),
        "gpus": r.gpus,
        "nodes": s.hardware.node_count if s.hardware.gpu_count else 1,
        "offload": s.hardware.offload,
        "mp_policy": s.hardware.mp_policy,
        # The parallel layout (torchtitan's mesh, memorymark/distributed/layout.py): tensor and
        # context parallel degrees, what data parallelism is left, and the mesh simulated.
        **_layout_dict(s),
        "per_gpu_batch": optimal.batch_size if optimal else None,
        "global_batch": r.global_batch_per_step,
        "per_rank_breakdown_bytes": per_rank,
        "per_rank_nccl_gb": gib(r.gpu.nccl_bytes),
        **(r.gpu_search.to_dict() if r.gpu_search else {"min_gpus": None}),
        "pipeline": _pipeline_dict(r),
    }


def _pipeline_dict(r: Report) -> dict[str, Any] | None:
    """Pipeline parallelism: the layout, the schedule, and each distinct rank's simulated peak
    at the optimal batch, with the worst rank (torchtitan reports the maximum over GPUs)."""
    h, optimal = r.settings.hardware, r.optimal
    if h.pp <= 1:
        return None
    stages = optimal.stages if optimal else ()
    worst = stages[optimal.worst_stage] if optimal and optimal.worst_stage is not None else None
    return {
        "layout": h.layout(r.gpus).describe(),
        "pp": h.pp,
        "schedule": h.pp_schedule,
        "virtual_stages": h.virtual_stages,
        "microbatches": h.pipeline_microbatches,
        "micro_batch": worst.micro_batch if worst else None,
        "stages": [stage.to_dict() for stage in stages],
        "worst_rank": worst.rank if worst else None,
        "worst_pp_rank": worst.pp_rank if worst else None,
        "worst_peak_gb": gib(worst.peak_bytes) if worst else None,
    }


def _layout_dict(s: Any) -> dict[str, Any]:
    """tp, cp, the data-parallel degree, the layout in torchtitan's words and its mesh."""
    hw = s.hardware
    count = hw.gpu_count
    if count is None:
        return {"tp": hw.tp, "cp": hw.cp, "dp": None, "layout": None, "mesh": None}
    layout = hw.layout(count)
    shape, names = layout.mesh()
    return {
        "tp": hw.tp,
        "cp": hw.cp,
        "dp": layout.dp,
        "layout": layout.describe(),
        "mesh": dict(zip(names, shape, strict=True)),
    }


def _throughput_dict(r: Report) -> dict[str, Any]:
    """Throughput at the optimal and current batch, and where larger batches stop paying."""
    optimal, current, knee = r.optimal, r.current, r.knee()
    return {
        "batch_ratio": r.batch_ratio,
        "throughput_source": r.throughput_source,
        "optimal_samples_per_second": _sps(optimal),
        "current_samples_per_second": _sps(current if current and current.runs else None),
        "diminishing_returns_batch": knee.batch_size if knee else None,
        "diminishing_returns_fraction": r.knee_fraction,
    }


def _row(m: Measurement) -> dict[str, Any]:
    """One results row: the original API's three keys, then what later issues added.

    `success` is the recommended verdict (fits with the margin), `runs` the one with none;
    `required_bytes` is what the step needs (past the capacity too, when simulated; null for a
    measured OOM)."""
    return {
        "batch_size": m.batch_size,
        "memory_gb": gib(m.peak_bytes),
        "success": m.fits,
        "runs": m.runs,
        "replayed": m.replayed,
        "required_bytes": m.required_bytes,
        "reserved_gb": gib_or_none(m.cuda_reserved_bytes),
        "alloc_retries": m.alloc_retries,
        "samples_per_second": _sps(m),
        "error": m.error,
    }


def _batch(m: Measurement) -> int:
    return m.batch_size


def _sps(m: Measurement | None) -> float | None:
    return None if m is None or m.samples_per_second is None else round(m.samples_per_second, 2)
