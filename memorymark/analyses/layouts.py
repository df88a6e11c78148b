"""The layout search: which data x tensor x pipeline (x context) layouts of a GPU count train
the model, each one's largest per-GPU micro-batch, peak and estimated throughput, best first.

For each candidate of memorymark/distributed/layout_costs.py a rank's share of the model's
states (counted once, on the meta device) is checked against a GPU first: a layout it alone
overflows is pruned unstepped. Every other one is swept (`bench.analyze`: the depth and batch
replays make each sweep a few small traces) up to the local batch the target global batch asks
of a rank, and its time per step is estimated as
scale_out estimates it (compute from the simulated step's FLOPs on the GPU's roofline, FSDP's
traffic over the data-parallel ranks overlapping it), plus what layout_costs says tensor,
context and pipeline parallelism add: their traffic, which the compute waits for, and the
pipeline's bubble. Given no count, the fewest GPUs a cluster offers on which some layout
trains, and its layouts.

Reaches the engine through its door (memorymark/analyses/bench.py) only; imports no torch, so
the app's pages can import it. Must not know how anything is displayed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from memorymark.analyses import scale_out
from memorymark.distributed import layout_costs, topology
from memorymark.distributed.layout_costs import Candidate, ModelShape
from memorymark.search import gpu_count
from memorymark.settings import Settings
from memorymark.units import gib

if TYPE_CHECKING:
    from memorymark.analyses.bench import Bench
    from memorymark.gpus import GPU
    from memorymark.measurement import Measurement
    from memorymark.report import Report

DEFAULT_SAMPLES_PER_RUN = 1e6
"""Samples a run is priced for, as the Scale out page prices one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutRow:
    """One layout's answer (memory simulated; time and cost estimated)."""

    candidate: Candidate
    status: str
    """fits, no fit (the smallest batch it runs does not), pruned (the states alone pass a
    GPU), refused (not simulated, or its step failed), or not searched (the time limit passed
    before its turn)."""
    note: str | None = None
    """Why a layout was pruned or refused, in one line."""
    per_gpu_batch: int | None = None
    """The largest local batch (samples a data-parallel rank steps at once) that fits."""
    accumulation: int = 1
    global_batch: int | None = None
    """per-GPU batch x data-parallel ranks x accumulation."""
    microbatches: int | None = None
    """A pipeline's microbatches per local batch, as simulated (`pipeline_microbatches`)."""
    peak_bytes: int | None = None
    """The (worst) rank's peak live bytes at that batch; where none fits, what the smallest
    batch stepped needs."""
    states_bytes: float | None = None
    """A rank's share of the model's states (counted, not stepped)."""
    worst_rank: int | None = None
    """The global rank whose figures these are, under pipeline parallelism."""
    compute_seconds: float | None = None
    bubble_fraction: float = 0.0
    model_parallel_seconds: float | None = None
    """Tensor, context and pipeline traffic a step waits for."""
    dp_seconds: float | None = None
    """FSDP's (or DDP's) traffic over the data-parallel ranks, overlapping compute."""
    step_seconds: float | None = None
    samples_per_second: float | None = None
    usd_per_run: float | None = None
    traced_steps: int = 0

    @property
    def fits(self) -> bool:
        """Whether some batch trains on this layout."""
        return self.status == "fits"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, memory in GiB, times marked estimated."""
        lay = self.candidate.layout
        per_gpu = None
        if self.samples_per_second is not None:
            per_gpu = self.samples_per_second / lay.gpus
        return {
            "layout": self.candidate.describe(), "gpus": lay.gpus, "dp": lay.dp,
            "dp_shard": lay.dp_shard, "tp": lay.tp, "cp": lay.cp, "pp": lay.pp,
            "pp_schedule": self.candidate.schedule if lay.pp > 1 else None,
            "virtual_stages": self.candidate.virtual_stages, "status": self.status,
            "note": self.note, "per_gpu_batch": self.per_gpu_batch,
            "accumulation": self.accumulation, "global_batch": self.global_batch,
            "microbatches": self.microbatches,
            "peak_gb": None if self.peak_bytes is None else gib(self.peak_bytes),
            "states_gb": None if self.states_bytes is None else gib(int(self.states_bytes)),
            "worst_rank": self.worst_rank, "compute_seconds": _round(self.compute_seconds),
            "bubble_fraction": round(self.bubble_fraction, 4),
            "model_parallel_seconds": _round(self.model_parallel_seconds),
            "dp_seconds": _round(self.dp_seconds), "step_seconds": _round(self.step_seconds),
            "samples_per_second": _round(self.samples_per_second),
            "samples_per_second_per_gpu": _round(per_gpu),
            "usd_per_run": _round(self.usd_per_run), "traced_steps": self.traced_steps,
            "memory_source": "simulated", "time_source": "estimated",
        }  # fmt: skip


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutSearch:
    """The layouts of one GPU count, best first, and what finding them took."""

    gpus: int
    rows: tuple[LayoutRow, ...]
    states_bytes: int
    """The model's states, counted once on the meta device."""
    refused_by_shape: int
    """Degrees the model's heads, layers or sequence cannot take (never candidates)."""
    elapsed_seconds: float
    counts_tried: tuple[int, ...] = ()
    """Without a count asked for: the counts searched, fewest first."""
    count_probes: int = 0
    """Without a count asked for: the batch-1 steps the count search took (one a count and
    kind of layout tried), besides the sweeps' steps."""

    @property
    def best(self) -> LayoutRow | None:
        """The layout with the highest estimated throughput that fits; None when none does."""
        return next((r for r in self.rows if r.fits), None)

    @property
    def pruned(self) -> int:
        """Layouts not stepped because their states alone pass a GPU."""
        return sum(r.status == "pruned" for r in self.rows)

    @property
    def traced_steps(self) -> int:
        """Simulated steps traced over every layout (the rest were replayed)."""
        return sum(r.traced_steps for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: the count, every row best first, and the work done."""
        return {
            "gpus": self.gpus, "best": None if self.best is None else self.best.to_dict(),
            "layouts": [r.to_dict() for r in self.rows], "pruned": self.pruned,
            "refused_by_shape": self.refused_by_shape, "traced_steps": self.traced_steps,
            "states_gb": gib(self.states_bytes), "elapsed_seconds": round(self.elapsed_seconds, 2),
            "counts_tried": list(self.counts_tried), "count_probes": self.count_probes,
        }  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Inputs:
    """What the search reads besides the steps: the model, the GPU and the prices."""

    shape: ModelShape
    param_count: int
    states_bytes: int
    gpu: GPU
    """The GPU as one rank sees it (its bandwidths and price)."""
    capacity: Callable[[Settings], int]
    """The bytes a rank of these settings may reserve (the fit policy's capacity)."""
    limit: Callable[[Settings], int]
    """The bytes a rank's step may need to fit (the fit policy's capacity less its margin)."""
    usd_per_hour: float
    samples_per_run: float = DEFAULT_SAMPLES_PER_RUN


def check_settings(settings: Settings) -> None:
    """Refuse, in one line, settings the search cannot start from."""
    hw = settings.hardware
    if hw.dist == "none":
        raise ValueError("the layout search needs a data-parallel strategy: --dist fsdp")
    if hw.model_parallel > 1:
        raise ValueError("the layout search picks --tp, --cp and --pp itself: leave them out")


def layout_settings(settings: Settings, c: Candidate) -> Settings:
    """`settings` under candidate `c`'s degrees (data parallelism as FSDP where asked for)."""
    lay = c.layout
    return settings.replace(
        gpus=str(lay.gpus), nodes=None, dist=lay.dist, tp=lay.tp, cp=lay.cp, pp=lay.pp,
        pp_schedule=c.schedule if lay.pp > 1 else "1f1b",
        virtual_stages=c.virtual_stages if lay.pp > 1 else 1,
    )  # fmt: skip


def search_layouts(settings: Settings, bench: Bench, gpus: int, inputs: Inputs) -> LayoutSearch:
    """Every candidate layout of `gpus` GPUs, best first: fitting ones by estimated throughput
    (so by cost per run too: the count is the same), then those that do not fit, the pruned
    and the refused."""
    start = time.monotonic()
    dist = settings.hardware.dist
    found, refused = layout_costs.candidates(
        gpus, dist, inputs.shape, settings.workload.seq_len, settings.hardware.nodes
    )
    limit = settings.search.time_limit_seconds
    rows = []
    for c in found:
        if limit is not None and time.monotonic() - start > limit:
            rows.append(_not_searched(c, inputs, limit))
        else:
            rows.append(_row(settings, bench, c, inputs))
    rows = _ranked(rows)
    # The interleaved schedule is tried as a variant of the fastest pipeline only: it changes
    # the bubble and the stages' memory, not which degrees fit (one sweep, not one per layout).
    piped = next((r for r in rows if r.fits and r.candidate.layout.pp > 1), None)
    variant = piped and layout_costs.interleaved(
        piped.candidate, inputs.shape, settings.workload.seq_len
    )
    if variant:
        if limit is not None and time.monotonic() - start > limit:
            extra = _not_searched(variant, inputs, limit)
        else:
            extra = _row(settings, bench, variant, inputs)
        rows = _ranked([*rows, extra])
    return LayoutSearch(
        gpus=gpus, rows=tuple(rows), states_bytes=inputs.states_bytes, refused_by_shape=refused,
        elapsed_seconds=time.monotonic() - start,
    )  # fmt: skip


def _ranked(rows: list[LayoutRow]) -> list[LayoutRow]:
    order = {"fits": 0, "no fit": 1, "pruned": 2, "refused": 3, "not searched": 4}
    return sorted(rows, key=lambda r: (order[r.status], -(r.samples_per_second or 0.0)))


def fewest_gpus(
    settings: Settings, bench: Bench, inputs: Inputs, counts: tuple[int, ...] | None = None
) -> LayoutSearch:
    """The smallest of `counts` (a cluster's: 1-8, then whole nodes) on which some layout
    trains batch 1, with that count's layouts searched in full.

    Each kind of layout (its tp, cp and pp degrees and schedule) has its smallest count found
    as `--gpus auto` finds FSDP's (memorymark/search/gpu_count.py: a batch-1 step a count tried,
    counts its states alone overflow never stepped, a + b/n fitted), over the counts its degrees
    divide; the fewest of them wins. When no kind trains on any count, the largest count's
    layouts say how far off each is."""
    start = time.monotonic()
    counts = counts or topology.cluster_counts()
    kinds, _ = layout_costs.candidates(
        topology.MAX_GPUS, settings.hardware.dist, inputs.shape, settings.workload.seq_len
    )
    tried: set[int] = set()
    probes = 0
    fewest: int | None = None
    for kind in kinds:
        degrees = kind.layout.model_parallel
        mine = tuple(n for n in counts if n % degrees == 0 and (fewest is None or n < fewest))
        if not mine:
            continue
        try:
            found = _min_gpus(settings, bench, inputs, kind, mine)
        except ValueError:  # degrees the engine does not step (yet): the search lists them
            continue
        tried.update(n for n, _ in found.tried)
        probes += len(found.tried)
        if found.min_gpus is not None:
            fewest = found.min_gpus
    answer = search_layouts(settings, bench, fewest or counts[-1], inputs)
    return LayoutSearch(
        gpus=answer.gpus, rows=answer.rows, states_bytes=answer.states_bytes,
        refused_by_shape=answer.refused_by_shape, elapsed_seconds=time.monotonic() - start,
        counts_tried=tuple(sorted(tried)), count_probes=probes,
    )  # fmt: skip


def _min_gpus(
    settings: Settings, bench: Bench, inputs: Inputs, kind: Candidate, counts: tuple[int, ...]
) -> gpu_count.GpuSearch:
    """`kind`'s smallest count of `counts` on which batch 1 fits (gpu_count.min_gpus)."""

    def measure(s: Settings) -> Measurement:  # `s`: `kind` on a count of `counts`
        return bench.measure(s, bench.simulated_gpu(s), 1)

    return kind_min_gpus(settings, kind, counts, measure, inputs.limit, inputs.states_bytes)


def kind_min_gpus(
    settings: Settings,
    kind: Candidate,
    counts: tuple[int, ...],
    measure: Callable[[Settings], Measurement],
    limit: Callable[[Settings], int],
    states_bytes: int,
) -> gpu_count.GpuSearch:
    """The smallest of `counts` on which batch 1 of layout `kind` (its degrees, on any count)
    fits within `limit`, `measure` stepping batch 1 of the settings on a count; a ValueError
    where the engine does not step those degrees."""

    def on(n: int) -> Settings:
        lay = replace(kind.layout, gpus=n, nodes=topology.nodes_for(n))
        return layout_settings(settings, replace(kind, layout=lay))

    # A rank holds 1/n of the states times the context-parallel degree (cp ranks share a shard).
    sharded = None
    if settings.hardware.offload == "none" and settings.hardware.dist in topology.SHARDED:
        sharded = states_bytes * kind.layout.cp
    return gpu_count.min_gpus(on(counts[0]), measure, counts, lambda n: limit(on(n)), sharded)


PARALLEL_LAYOUT = "a parallel layout"
"""The way out's label when nothing fits (its layout named after it)."""


def way_out(
    settings: Settings,
    shape: ModelShape,
    measure: Callable[[Settings], Measurement],
    limit: Callable[[Settings], int],
    states_bytes: int,
    counts: tuple[int, ...] | None = None,
) -> tuple[str, Settings, Measurement] | None:
    """When nothing fits: the fewest GPUs on which batch 1 of a model-parallel layout (tp, cp
    or pp above 1, FSDP over the rest) fits within `limit`, as (label naming the layout, its
    settings, its batch-1 step); None when no such layout trains on any count, or none is simulated.
    memorymark/analyses/fixes.py offers it as a `Fix` beside the fewest GPUs under FSDP."""
    base = settings if settings.hardware.dist != "none" else settings.replace(dist="fsdp")
    kinds, _ = layout_costs.candidates(
        topology.MAX_GPUS, base.hardware.dist, shape, base.workload.seq_len
    )
    counts = counts or topology.cluster_counts()
    best: tuple[int, Candidate, Measurement] | None = None
    for kind in (k for k in kinds if k.layout.parallel):
        degrees = kind.layout.model_parallel
        mine = tuple(n for n in counts if n % degrees == 0 and (best is None or n < best[0]))
        if not mine:
            continue
        try:
            found = kind_min_gpus(base, kind, mine, measure, limit, states_bytes)
        except ValueError:
            continue
        if found.min_gpus is not None:
            step = next(m for n, m in found.tried if n == found.min_gpus)
            best = (found.min_gpus, kind, step)
    if best is None:
        return None
    n, kind, step = best
    lay = replace(kind.layout, gpus=n, nodes=topology.nodes_for(n))
    chosen = replace(kind, layout=lay)
    return f"{PARALLEL_LAYOUT} ({chosen.describe()})", layout_settings(base, chosen), step


def _pruned(settings: Settings, c: Candidate, inputs: Inputs) -> bool:
    if settings.hardware.offload != "none":
        return False  # the states live on the host
    capacity = inputs.capacity(layout_settings(settings, c))
    return layout_costs.pruned(inputs.states_bytes, c.layout, capacity)


def _not_searched(c: Candidate, inputs: Inputs, limit: float) -> LayoutRow:
    """A candidate left unstepped: the search's time limit had passed (`--time-limit`)."""
    return LayoutRow(
        candidate=c, status="not searched", states_bytes=layout_costs.sharded_states(
            inputs.states_bytes, c.layout),
        note=f"the search passed its time limit ({limit:g} s) before this layout's turn",
    )  # fmt: skip


def _row(settings: Settings, bench: Bench, c: Candidate, inputs: Inputs) -> LayoutRow:
    """One candidate's row: pruned, refused by the engine, or swept and estimated."""
    share = layout_costs.sharded_states(inputs.states_bytes, c.layout)
    if _pruned(settings, c, inputs):
        return LayoutRow(
            candidate=c, status="pruned", states_bytes=share,
            note=f"its share of the states alone ({gib(int(share))} GiB) passes a GPU",
        )  # fmt: skip
    try:
        report = bench.analyze(_capped(layout_settings(settings, c), c), answer_only=True)
    except (ValueError, RuntimeError) as exc:
        # Degrees the simulation does not run yet, or a step that failed on this layout alone
        # (the engine's StepError is a RuntimeError): one row says so, the search goes on.
        return LayoutRow(candidate=c, status="refused", note=str(exc).splitlines()[0],
                         states_bytes=share)  # fmt: skip
    return estimate_row(report, c, inputs, share)


def _capped(settings: Settings, c: Candidate) -> Settings:
    """`settings` with the sweep stopped at the local batch the target global batch asks of
    each data-parallel rank (a pipeline's: a multiple of its microbatches): a larger one is a
    bigger global batch than asked for, so no layout's row uses it, and each probe past it
    costs a sweep seconds. The grid's step shrinks to that batch where it is smaller: a sweep
    starts at its step (Llama-3.1-70B, FSDP 64 at 8,192 tokens: batch 8, where 4 is asked)."""
    target = settings.search.target_batch
    if not target:
        return settings
    multiple = settings.hardware.micro_batch_multiple
    need = multiple * math.ceil(target / c.layout.dp / multiple)
    s = settings.search
    return settings.replace(max_batch=min(s.max_batch, need), step=min(s.step, need))


def traced_steps(report: Report) -> int:
    """Steps a sweep traced: the depth replay's small traces, else every step not replayed."""
    replay = report.depth_replay
    if replay is not None and replay.traced_depths:
        return replay.traced_steps
    return sum(not m.replayed for m in report.measurements)


def estimate_row(report: Report, c: Candidate, inputs: Inputs, share: float) -> LayoutRow:
    """A swept layout's row: its best batch, peak and estimated step time and cost."""
    lay, s, traced = c.layout, report.settings, traced_steps(report)
    best = report.optimal
    # Where nothing fits, the smallest batch stepped: 1, or a pipeline's microbatch count
    # (only its multiples run).
    smallest = min(report.measurements, key=lambda m: m.batch_size, default=None)
    shown = best or smallest
    worst = _worst_rank(shown)
    if best is None or best.samples_per_second is None:
        least = 1 if smallest is None else smallest.batch_size
        return LayoutRow(
            candidate=c, status="no fit", note=f"batch {least} does not fit",
            peak_bytes=None if shown is None else shown.required_bytes, states_bytes=share,
            worst_rank=worst, traced_steps=traced,
        )  # fmt: skip
    local = best.batch_size
    target = s.search.target_batch
    accumulation = max(1, math.ceil(target / (local * lay.dp))) if target else s.workload.grad_accum
    micro = s.hardware.pipeline_microbatches if lay.pp > 1 else None
    bubble = layout_costs.bubble_fraction(lay.pp, micro or 1, c.schedule, c.virtual_stages)
    # A pipeline's rate is its slowest stage's, the bubble already taken off (pipeline_sim).
    compute = local / best.samples_per_second
    elem = 2 if s.workload.precision in ("bf16-mixed", "16-mixed", "bf16-true") else 4
    gathered, reduced = (
        scale_out.element_bytes(s, compute=True),
        scale_out.element_bytes(s, compute=False),
    )
    seq = s.workload.seq_len or 0
    gpu = inputs.gpu
    intra, inter = (
        gpu.intra_node_bytes_per_s,
        gpu.inter_node_bytes_per_s or gpu.intra_node_bytes_per_s,
    )
    args = (lay, inputs.shape, local, seq, elem)
    cp_link = intra if lay.tp * lay.cp <= topology.GPUS_PER_NODE else inter
    pp_link = inter if layout_costs.pp_crosses_nodes(lay) else intra
    waits = (
        layout_costs.tp_bytes(*args) / intra
        + layout_costs.cp_bytes(*args) / cp_link
        + layout_costs.pp_bytes(*args) / pp_link
    )
    # FSDP over the data-parallel ranks: each holds 1/(tp x pp) of the parameters.
    shard_params = inputs.param_count // (lay.tp * lay.pp)
    traffic = topology.step_traffic(
        s.hardware.dist, lay.dp, layout_costs.dp_nodes(lay), shard_params, gathered, reduced
    )
    dp = topology.comm_seconds(traffic, intra, inter)
    step = accumulation * max(compute + waits, dp)
    samples = local * lay.dp * accumulation
    throughput = samples / step
    hours = inputs.samples_per_run / throughput / 3600
    return LayoutRow(
        candidate=c, status="fits", per_gpu_batch=local, accumulation=accumulation,
        global_batch=samples, microbatches=micro, peak_bytes=best.peak_bytes, states_bytes=share,
        worst_rank=worst, compute_seconds=compute, bubble_fraction=bubble,
        model_parallel_seconds=waits, dp_seconds=dp, step_seconds=step,
        samples_per_second=throughput, usd_per_run=lay.gpus * inputs.usd_per_hour * hours,
        traced_steps=traced,
    )  # fmt: skip


def _worst_rank(m: Any) -> int | None:
    """The global rank of a pipeline measurement's worst stage (the pipeline simulation's
    `stages` and `worst_stage`), read defensively: None where the step carries none."""
    stages = getattr(m, "stages", None)
    index = getattr(m, "worst_stage", None)
    if not stages or index is None:
        return None
    return getattr(stages[index], "rank", None)


_SHAPE_KEYS = {
    "heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "kv_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads"),
    "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
}


def shape_of(config: dict[str, Any] | None) -> ModelShape:
    """The heads, key/value heads, layers and width a config.json gives (None: not given;
    the key/value heads default to the heads, as transformers' configs do)."""
    config = config or {}
    found = {
        what: next((v for k in keys if isinstance(v := config.get(k), int)), None)
        for what, keys in _SHAPE_KEYS.items()
    }
    found["kv_heads"] = found["kv_heads"] or found["heads"]
    return ModelShape(**found)
