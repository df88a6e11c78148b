"""One batch size's result: a frozen record the sweep yields and the report reads.

A Measurement never holds a tensor, so it can cross threads, be cached and be serialised.
An OOM is a Measurement with `fits=False`, not an exception. This module knows nothing about
how the numbers were taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from memorymark.units import gib, gib_text, plural

MEASURING_BACKENDS = ("cuda", "mps")
"""The backends whose memory figures the device reports itself: "measured". `sim` and `cpu` are
"simulated": `cpu` runs real kernels, but its figures come from the tracker and the allocator
replay, as the simulation's do."""


def is_measured(backend: str | None) -> bool:
    """True when `backend`'s memory figures are measured on the device: the one place that
    decides it for a backend's name (a `Measurement` carries the answer as `measured`)."""
    return backend in MEASURING_BACKENDS


def memory_source(measured: bool) -> str:
    """How a memory figure was obtained, in the one word every output uses."""
    return "measured" if measured else "simulated"


class Category(str, Enum):
    """What a tracked byte is for: the kinds a peak is broken down into. Members are their
    names as strings, so they key JSON and the breakdown as the names do. (str, Enum) rather
    than StrEnum, which needs Python 3.11: the package supports 3.10."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATIONS = "activations"
    LOGITS = "logits"
    TEMPORARY = "temporary"

    def __str__(self) -> str:
        return self.value


CATEGORIES: tuple[str, ...] = tuple(c.value for c in Category)
"""The categories' names, in the breakdown's order (the UI's and the JSON's keys)."""


@dataclass(frozen=True, slots=True)
class ValueRead:
    """One place the user's step read a tensor's value (`loss.item()`, `float(t)`, `bool(t)`),
    which the simulation answered with zero: control flow after it followed that zero."""

    file: str
    line: int
    op: str
    """The source line that read it, as written."""
    library_file: str | None = None
    """When the read itself is inside an installed library (TRL's trainer calling `.item()`),
    the innermost such frame: `file` and `line` are then the user's own frame that called it.
    None when the user's own line read the value."""
    library_line: int | None = None
    library_op: str | None = None
    """The library's source line that read it, as written."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: {file, line, op, library}, `library` being {file, line, op} of the
        library's line that read the value, or None when the user's own line did."""
        library = None
        if self.library_file is not None:
            library = {"file": self.library_file, "line": self.library_line, "op": self.library_op}
        return {"file": self.file, "line": self.line, "op": self.op, "library": library}

    @property
    def where(self) -> str:
        """One line for people: the line that read the value, and the user's line that called
        it when that was a library's."""
        if self.library_file is None:
            return f"{self.file}:{self.line}  {self.op}"
        return (
            f"{self.library_file}:{self.library_line}  {self.library_op}  (called from "
            f"{self.file}:{self.line}  {self.op})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Breakdown:
    """Live bytes by kind at the moment of the peak."""

    parameters: int = 0
    """Weights and buffers (batch-norm statistics)."""
    gradients: int = 0
    """Parameter gradients (.grad)."""
    optimizer_state: int = 0
    """AdamW's two moments, SGD's momentum buffer."""
    activations: int = 0
    """Everything the forward pass created that is still alive: inputs, saved activations, masks."""
    logits: int = 0
    """A causal LM's output layer and loss: the vocabulary-sized logits, their fp32 upcast and
    log-probabilities (or a fused loss's chunks and saved gradients), alive at the peak."""
    temporary: int = 0
    """Backward and optimizer intermediates that are not gradients or state."""

    @property
    def total(self) -> int:
        """The sum of every kind, equal to the peak it was taken at."""
        return sum(self.to_dict().values())

    def to_dict(self) -> dict[str, int]:
        """Bytes by category, in a fixed order."""
        return {name: getattr(self, name) for name in CATEGORIES}


@dataclass(frozen=True, slots=True, kw_only=True)
class StagePeak:
    """One pipeline rank's simulated peak (memorymark/backends/pipeline_sim.py)."""

    pp_rank: int
    """Its place in the pipeline (0: the first stage's rank)."""
    rank: int
    """Its global rank on the device mesh (pp outermost: pp_rank x GPUs / pp)."""
    stages: tuple[int, ...]
    """The pipeline stages it holds (several under an interleaved schedule)."""
    stands_for: tuple[int, ...]
    """The pipeline ranks its figures stand for (rank 1 bounds the middle ones)."""
    micro_batch: int
    """Samples in each microbatch it runs."""
    peak_bytes: int
    reserved_bytes: int | None
    """Peak reserved bytes over the loop (the figure the fit verdict reads), predicted."""
    fits: bool

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (GiB values are 2**30 bytes)."""
        return {
            "pp_rank": self.pp_rank,
            "rank": self.rank,
            "stages": list(self.stages),
            "stands_for": list(self.stands_for),
            "micro_batch": self.micro_batch,
            "peak_bytes": self.peak_bytes,
            "memory_gb": gib(self.peak_bytes, 4),
            "reserved_bytes": self.reserved_bytes,
            "success": self.fits,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One full training step (or the step the settings describe) at one batch size."""

    batch_size: int
    """The micro-batch: samples per forward/backward pass."""
    fits: bool
    """The fit policy's verdict with the margin (memorymark/fit.py): the step runs and its
    reserved peak leaves the margin free. The recommended batch is the largest that fits."""
    peak_bytes: int
    """Peak allocated bytes of the step; for an OOM, the peak reached before it failed."""
    backend: str
    """cuda, mps, cpu or sim."""
    measured: bool
    """True when the bytes come from real hardware; False when simulated on fake tensors."""
    reserved_bytes: int | None = None
    """Peak bytes the caching allocator reserved, as CUDA reported it (measured only)."""
    predicted_allocated_bytes: int | None = None
    """Simulated: peak allocated bytes as CUDA would report them (512-byte rounded blocks), from
    the allocator model; None when measured."""
    predicted_reserved_bytes: int | None = None
    """Simulated: peak bytes the caching allocator would reserve up to the end of step 1 of a
    fresh process started as `loop_start` says (a training loop: the weights, no flush, the
    optimizer state made inside step 1), from the allocator model: what a first-step
    measurement of that loop reports. For an OOM, replayed with no limit. None when
    measured."""
    loop_reserved_bytes: int | None = None
    """Simulated: the reserved peak of the whole training loop replayed (every step until the
    allocator's segments stop changing), which the verdict reads; `predicted_reserved_bytes`
    is step 1's. None when measured."""
    predicted_retries: tuple[int, ...] | None = None
    """Simulated: the allocation retries of each loop step replayed, in order (a recommended
    batch has none at any step). None when measured."""
    loop_steps: int | None = None
    """Simulated: how many loop steps the replay ran (until steady, an OOM, or its cap)."""
    loop_start: str | None = None
    """How the process whose figures these are reached its first step: "training loop" (the
    loop people write: no cache flush, optimizer state made inside step 1; what a simulation
    replays by default), "Lightning's loop" (the same, with the cache emptied once after
    setting up), or "probe" (state primed and the cache emptied before the step: what a
    measurement on a real GPU runs). None when unknown."""
    breakdown: Breakdown | None = None
    """Live bytes by kind at the peak (None for an OOM)."""
    eval_peak_bytes: int | None = None
    """Peak allocated bytes of the evaluation pass run after the step (the settings'
    `eval_batch`), the weights and optimizer state included; None with no evaluation pass or
    when the loop failed first. `fits` and `runs` judge the loop with the pass."""
    step_seconds: float | None = None
    """Wall-clock seconds of the step on real hardware (median of timed steps); None when
    simulated."""
    samples_per_second: float | None = None
    """Training throughput at this batch size: measured, or estimated from FLOPs and bytes."""
    throughput_source: str | None = None
    """'measured', 'estimated', or None when no throughput is known."""
    runs: bool | None = None
    """The fit policy's verdict with no margin: the step completes with no OOM within the
    capacity (allocation retries allowed). None when constructed without one: as `fits`."""
    required_bytes: int | None = None
    """What the device must hold for this step: its peak reserved bytes (simulated: predicted,
    and for a step past the capacity what it would need; measured: `max_memory_reserved`).
    None for a measured OOM, whose need the device never reached."""
    demand_bytes: int | None = None
    """Simulated: the reserved peak the step reaches when nothing limits it, so the allocator
    never flushes its cache. The step fits exactly when this is within the capacity less the
    margin; it equals `required_bytes` unless the step ran only after a flush. None when
    measured (the device flushes when it must, and says only what it then held)."""
    alloc_retries: int | None = None
    """Allocations that succeeded only after the allocator flushed its cache (measured:
    `num_alloc_retries` during the step; simulated: the replay's). None when unknown."""
    memory_stats: dict[str, int] | None = None
    """Measured on CUDA: `torch.cuda.memory_stats()` entries read right after the first step of
    the probe, before any timed step (peaks, `num_alloc_retries`, `num_ooms`)."""
    step_flops: int | None = None
    """FLOPs the step's matmuls, convolutions and attention ran (estimated throughput only)."""
    error: str | None = None
    """One line saying why the step failed, or why one that ran is not recommended."""
    quantized_weight_bytes: int | None = None
    """Bytes of the quantized base weights and their quantization state (within `parameters`);
    None when the weights are not quantized."""
    paged_bytes: int | None = None
    """Optimizer state in CUDA unified memory (bitsandbytes' paged optimizers): outside the
    peak, the breakdown and the fit verdict (memorymark/step/paging.py); None when not paged."""
    pages_to_host: bool | None = None
    """True when the step and the paged state do not fit the GPU together: the step runs, its
    optimizer state paging to host memory (slower). None when not paged."""
    timeline: tuple[int, ...] = field(default=(), repr=False, compare=False)
    """Live bytes after each operator of the step: what the fast strategy extrapolates."""
    value_reads: tuple[ValueRead, ...] = ()
    """Where a user's step read a tensor value the simulation answered with zero."""
    autocast_dtypes: tuple[str, ...] | None = None
    """A user's step run off its GPU (simulated or `cpu`): the dtypes of the autocast regions
    it entered ("bfloat16"; empty: none). None where nothing was observed: the catalog's step
    (its settings say its precision), a real GPU, or a replayed step."""
    stages: tuple[StagePeak, ...] = ()
    """Under pipeline parallelism, each distinct rank's peak; this measurement's own figures
    are the worst one's (`worst_stage`). Empty without pipeline parallelism."""
    worst_stage: int | None = None
    """The index in `stages` of the rank whose figures these are (the furthest from fitting)."""
    graph_breaks: tuple[str, ...] = ()
    """A compiled step (--compile): each place Dynamo broke the graph, "file:line: reason",
    its region run eagerly; empty when it compiled whole or was not compiled."""
    replayed: bool = False
    """True when this simulated step was not traced but read off traced ones (the symbolic
    sweep, memorymark/accounting/symbolic.py): the same figures a trace gives, by arithmetic."""

    @property
    def needs_bytes(self) -> int | None:
        """What the step needs with no cache flush: `demand_bytes` where known (simulated),
        else `required_bytes`. Past the capacity where a step runs only after a flush, whose
        `required_bytes` is then the capacity it held."""
        return self.demand_bytes if self.demand_bytes is not None else self.required_bytes

    @property
    def held_back(self) -> str | None:
        """Why a step that runs is not recommended ("after a cache flush", "inside the
        margin"), or None for one that fits or does not run."""
        if self.fits or not self.runs:
            return None
        return "after a cache flush" if self.alloc_retries else "inside the margin"

    def why_not(self, capacity_bytes: int) -> str | None:
        """Why this step is not recommended, with the figure the reason is about; None for one
        that fits. A row's "needs" figure alone says it only for a step past `capacity_bytes`
        (`needs 23.90 GiB`); a step that needed a cache flush, ran out below the capacity (the
        replay ran out after a flush, or the step itself ran out of memory) or stayed inside the
        margin needs its reason beside a figure below the limit, or it reads as a contradiction.
        """
        if self.fits:
            return None
        held = self.required_bytes
        flushed = "a cache flush (allocation retry)"
        if self.runs:
            figure = gib_text(held if held is not None else self.peak_bytes)
            if self.alloc_retries:
                return f"needs {flushed} at {figure}"
            return f"inside the margin at {figure}"
        if held is None:
            # The step itself raised out of memory: its peak is where it stopped, not its need.
            return f"ran out of memory after {gib_text(self.peak_bytes)} allocated"
        if held > capacity_bytes:
            return f"needs {gib_text(held)}"
        # The replay ran out below the capacity: a flush left the cache fragmented (the need is
        # the loop replayed with no limit, which never flushes).
        after = f" after {flushed}" if self.alloc_retries else ""
        return f"ran out of memory{after}: fragmented, though it needs {gib_text(held)}"

    def __post_init__(self) -> None:
        if self.runs is None:
            object.__setattr__(self, "runs", self.fits)
        if self.fits and not self.runs:
            raise ValueError("a step that fits with the margin also runs without it")

    @property
    def cuda_allocated_bytes(self) -> int:
        """Peak allocated bytes as CUDA counts them: predicted when simulated, else measured."""
        if self.predicted_allocated_bytes is not None:
            return self.predicted_allocated_bytes
        return self.peak_bytes

    @property
    def cuda_reserved_bytes(self) -> int | None:
        """Peak reserved bytes over the loop (the figure the fit verdict reads): predicted when
        simulated, measured on CUDA, else unknown. Step 1's own prediction is a fallback only:
        in a training loop step 1 runs before the optimizer's state exists, so beside the peak
        (taken with that state) it read less than the peak itself."""
        for held in (self.loop_reserved_bytes, self.predicted_reserved_bytes):
            if held is not None:
                return held
        return self.reserved_bytes

    def to_dict(self) -> dict[str, Any]:
        """The `measure --json` record (GiB values are 2**30 bytes)."""
        return {
            "batch_size": self.batch_size,
            "success": self.fits,
            "peak_bytes": self.peak_bytes,
            "memory_gb": gib(self.peak_bytes, 4),
            "runs": self.runs,
            "required_bytes": self.required_bytes,
            "demand_bytes": self.demand_bytes,
            "alloc_retries": self.alloc_retries,
            "memory_stats": self.memory_stats,
            "reserved_bytes": self.reserved_bytes,
            "predicted_allocated_bytes": self.predicted_allocated_bytes,
            "predicted_reserved_bytes": self.predicted_reserved_bytes,
            "loop_reserved_bytes": self.loop_reserved_bytes,
            "predicted_retries": list(self.predicted_retries)
            if self.predicted_retries is not None
            else None,
            "loop_steps": self.loop_steps,
            "loop_start": self.loop_start,
            "samples_per_second": _round(self.samples_per_second),
            "throughput_source": self.throughput_source,
            "step_flops": self.step_flops,
            "breakdown": self.breakdown.to_dict() if self.breakdown else None,
            "eval_peak_bytes": self.eval_peak_bytes,
            "step_seconds": self.step_seconds,
            "backend": self.backend,
            "memory_source": memory_source(self.measured),
            "error": self.error,
            "quantized_weight_bytes": self.quantized_weight_bytes,
            "paged_bytes": self.paged_bytes,
            "pages_to_host": self.pages_to_host,
            "value_reads": [read.to_dict() for read in self.value_reads],
            "autocast_dtypes": None if self.autocast_dtypes is None else list(self.autocast_dtypes),
            "graph_breaks": list(self.graph_breaks),
            **self._pipeline_dict(),
        }

    def _pipeline_dict(self) -> dict[str, Any]:
        """The per-stage peaks and the worst rank, under pipeline parallelism only."""
        if not self.stages or self.worst_stage is None:
            return {}
        worst = self.stages[self.worst_stage]
        return {
            "stages": [stage.to_dict() for stage in self.stages],
            "worst_rank": worst.rank,
            "worst_pp_rank": worst.pp_rank,
        }


@dataclass(frozen=True, slots=True)
class DepthReplay:
    """How a simulated sweep got its full-depth steps: traced in full, or replayed from
    steps of the same model built with fewer blocks (`--depth`, memorymark/accounting/depth.py).

    >>> DepthReplay(80, (2, 3), 6, 6).says()
    '80 blocks replayed from simulated traces at 2 and 3 blocks (6 steps traced, 6 replayed)'
    """

    layers: int
    """The model's blocks (its config's layer count); 0 when its config gives none."""
    traced_depths: tuple[int, ...]
    """Depths (block counts) traced; () when the full model was traced."""
    traced_steps: int
    """Small-depth steps traced."""
    replayed_steps: int
    """Full-depth steps synthesized from them."""
    fallback: str | None = None
    """Why the full model was traced instead; None when it replayed (or `--depth trace`). Beside
    `traced_depths`: why some pipeline ranks' stages were traced in full."""
    stages: int = 1
    """Pipeline stages (pp x virtual stages) the model is split into, each of `layers` blocks
    replayed; 1 when the model is not split."""

    def says(self) -> str:
        """One line for reports: what was traced and what replayed, saying it was simulated
        ("40 blocks a stage (2 stages) replayed from simulated traces at 3 and 4 blocks a
        stage (4 steps traced, 2 replayed)" for a pipeline)."""
        if self.traced_depths:
            *first, last = self.traced_depths
            depths = f"{', '.join(map(str, first))} and {last}" if first else str(last)
            split = f" a stage ({self.stages} stages)" if self.stages > 1 else ""
            said = (
                f"{plural(self.layers, 'block')}{split} replayed from simulated traces at "
                f"{depths} blocks{' a stage' if split else ''} "
                f"({plural(self.traced_steps, 'step')} traced, {self.replayed_steps:,} replayed)"
            )
            return f"{said}; {self.fallback}" if self.fallback else said
        blocks = f"{plural(self.layers, 'block')}, " if self.layers else ""
        full = f"the full model traced ({blocks}simulated)"
        return f"{full}: {self.fallback}" if self.fallback else full

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: {layers, traced_depths, traced_steps, replayed_steps, fallback,
        stages}."""
        return {
            "layers": self.layers,
            "traced_depths": list(self.traced_depths),
            "traced_steps": self.traced_steps,
            "replayed_steps": self.replayed_steps,
            "fallback": self.fallback,
            "stages": self.stages,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DepthReplay:
        """The DepthReplay `to_dict` wrote."""
        return cls(
            layers=int(data["layers"]),
            traced_depths=tuple(int(n) for n in data["traced_depths"]),
            traced_steps=int(data["traced_steps"]),
            replayed_steps=int(data["replayed_steps"]),
            fallback=data.get("fallback"),
            stages=int(data.get("stages", 1)),
        )


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
