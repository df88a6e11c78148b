"""The answer, in arithmetic: optimal batch, waste, speedup and savings from the measurements.

Pure functions of the measurements, the GPU and the cost inputs: no torch, no I/O. Moving a
price slider builds a new Report from the same measurements, so it never re-runs a sweep.
Memory figures are bytes inside and GiB (2**30 bytes) only where the JSON contract or a person
reads them (`gib`). Which memory figure is which: "memory" is the peak of live tensor bytes
(measured: `max_memory_allocated`); "allocated" is what CUDA would count (512-byte blocks);
"reserved" (a measurement's `required_bytes`) is what the caching allocator holds from the
device, judged by the fit policy against "usable" (the capacity) and the margin below it. The
optimal batch is the largest that fits with the margin, the maximum the largest that runs
without it. A current batch that does not run is never priced as if it ran: no waste, speedup
or savings against it, and a plan that keeps its global batch. Speedup is throughput at the
optimal batch over throughput at the current one, measured on a GPU or estimated from FLOPs and
bytes in simulation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from memorymark.accounting.allocator import LOOP_STARTS
from memorymark.environment import Stamp
from memorymark.fit import FitPolicy
from memorymark.gpus import GPU
from memorymark.measurement import DepthReplay, Measurement, ValueRead, memory_source
from memorymark.search.compile_gap import CompileGap
from memorymark.search.eval_batch import EvalAnswer
from memorymark.search.plan import TrainingPlan
from memorymark.search.sweep import best_fit
from memorymark.settings import Costs, Settings
from memorymark.units import gib, plural
from memorymark.ways_out import Fix

if TYPE_CHECKING:
    from memorymark.search.gpu_count import GpuSearch

# "Where larger batches stop paying off": the smallest batch within 5% of the best throughput.
KNEE_FRACTION = 0.95


def setup_note(set_up_for: str | None, sized_for: str) -> str | None:
    """A sentence saying a training was set up as on the GPU `set_up_for`
    (`memorymark.target_gpu`), not as on this machine, and sized for `sized_for`; None when
    it was set up as on this machine."""
    if set_up_for is None:
        return None
    return (
        f"Set up as on the {set_up_for}, not as on this machine (memorymark.target_gpu): its "
        f"setup's bf16, TF32 and GradScaler checks got the {set_up_for}'s answers, and it is "
        f"sized for the {sized_for}."
    )


def _held(m: Measurement) -> int:
    """What the device holds for a step that ran: its reserved peak, else its live bytes."""
    return m.required_bytes if m.required_bytes is not None else m.peak_bytes


@dataclass(frozen=True, slots=True)
class FitWindow:
    """Batches that fit with the margin free above batches that do not: the fit verdicts are
    not monotone in batch size. The answer stays below the window (`best_fit`): a fit above a
    failure rests on how the caching allocator happened to carve its segments, which a run's
    own first step may carve otherwise (memorymark/accounting/allocator.py: a block split for a
    small request leaves no room for the next large one)."""

    first_failing: int
    last_failing: int
    """The window: the measured batches from the first that does not fit to the last one
    below `fits_from`."""
    fits_from: int
    fits_to: int
    """The measured batches above the window that fit with the margin free (up to the next
    that does not)."""
    why: str
    """Why the window's batches do not fit, in words."""

    def to_dict(self) -> dict[str, object]:
        """The JSON form (`fit_window`)."""
        return {
            "window": [self.first_failing, self.last_failing],
            "fits_above": [self.fits_from, self.fits_to],
            "why": self.why,
        }

    def sentence(self) -> str:
        """What the verdict adds."""
        window = _span(self.first_failing, self.last_failing)
        fits = _span(self.fits_from, self.fits_to)
        verb = "fits" if self.fits_from == self.fits_to else "fit"
        return (
            f"{fits[0].upper()}{fits[1:]} also {verb} with the margin free, above a window "
            f"({window}) that {self.why}; the answer stays below the window, since a fit above "
            "one depends on how the allocator's cache happens to be carved, which a fresh "
            "process's first step may carve otherwise."
        )


def _span(first: int, last: int) -> str:
    return f"batch {first}" if first == last else f"batches {first}-{last}"


def _window_why(window: list[Measurement]) -> str:
    """Why a window's batches do not fit, each reason once, in the order of their gravity."""
    reasons = []
    if any(not m.runs for m in window):
        reasons.append("runs out of memory")
    if any(m.runs and m.alloc_retries for m in window):
        reasons.append("needs a cache flush (an allocation retry)")
    if any(m.runs and not m.alloc_retries for m in window):
        reasons.append("leaves less than the margin free")
    return " or ".join(reasons)


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """What one sweep found, and what the current batch size costs."""

    settings: Settings
    costs: Costs
    gpu: GPU
    backend: str
    measurements: tuple[Measurement, ...]
    elapsed_seconds: float
    fixes: tuple[Fix, ...] = ()
    """When nothing fits: each change that might, with its simulated batch-1 step."""
    batch_1_required_bytes: int | None = None
    """When nothing fits: what batch 1 needs as configured (simulated, no memory limit)."""
    fixes_stopped_by: str | None = None
    """The limit that ended the search for ways out before it finished ("the time limit
    (120 s)"): `fixes` are those found, `fixes_not_finished` the rest. None when it finished
    (or did not run)."""
    fixes_not_finished: tuple[str, ...] = ()
    """The ways out the search did not finish looking at, when a limit stopped it."""
    plan: TrainingPlan | None = None
    """Micro-batch x accumulation steps for the global batch (`global_batch`), checked with
    accumulation by the engine; None when no plan reaches it. Without a global batch to reach,
    the optimal batch with the settings' own accumulation."""
    plan_probes: tuple[Measurement, ...] = ()
    """The steps with accumulation the plan was checked with."""
    evaluation: EvalAnswer | None = None
    """The evaluation pass the settings ask for (`eval_batch`), at the recommended batch: does
    the loop with it fit, and the largest eval batch that would. None with no pass asked."""
    stopped_by: str | None = None
    """The limit that ended the sweep early ("the time limit (60 s)"): the answer is partial,
    the best known within what was measured. None when the search finished."""
    compile_gap: CompileGap | None = None
    """With --compile, the same step run eagerly beside it (memorymark/search/compile_gap.py);
    None otherwise, or when the sweep was cut short."""
    search_fallback: str | None = None
    """Why the symbolic search traced probes it would have replayed (None: it replayed, or
    another strategy searched)."""
    depth_replay: DepthReplay | None = None
    """How the simulated sweep's full-depth steps were had (`--depth`): traced in full, or
    replayed from the model built with fewer blocks. None where the backend did not say (a
    real GPU)."""
    torch_version: str | None = None
    """The PyTorch that ran the steps."""
    unverified_rules: tuple[str, ...] = ()
    """Simulation rules whose verified torch releases do not include `torch_version`."""
    stamp: Stamp | None = None
    """Versions, backend, device and the time the analysis ended (memorymark/environment.py)."""
    gpu_search: GpuSearch | None = None
    """`--gpus auto`: the smallest GPU count that trains batch 1, and the counts tried."""
    training: str | None = None
    """The name of the user's own training code that was sized (`memorymark.Training`), or
    None for the catalog model the settings name."""
    set_up_for: str | None = None
    """The GPU the training's setup code ran as on (`memorymark.target_gpu`), or None."""

    @property
    def model_name(self) -> str:
        """What was sized: the user's training, or the settings' catalog model."""
        return self.training or self.settings.workload.model

    @property
    def value_reads(self) -> tuple[ValueRead, ...]:
        """Each place the step read a tensor value the simulation answered with zero (control
        flow after it followed that zero), once, in the order first seen."""
        seen: dict[ValueRead, None] = {}
        evaluated = self.evaluation.probes if self.evaluation is not None else ()
        for m in (*self.measurements, *self.plan_probes, *(m for _, m in evaluated)):
            seen.update(dict.fromkeys(m.value_reads))
        return tuple(seen)

    @property
    def graph_breaks(self) -> tuple[str, ...]:
        """A compiled step (--compile): where its graphs broke ("file:line: reason", each once,
        in the order first seen), the regions after them run eagerly."""
        seen: dict[str, None] = {}
        for m in (*self.measurements, *self.plan_probes):
            seen.update(dict.fromkeys(m.graph_breaks))
        return tuple(seen)

    @property
    def autocast_dtypes(self) -> tuple[str, ...] | None:
        """A training job: the autocast dtypes its step was seen to enter ("bfloat16"; empty:
        none), over every traced probe. None when not observed: the catalog's step (its
        settings say its precision), or a job run on a real GPU."""
        seen: dict[str, None] | None = None
        for m in (*self.measurements, *self.plan_probes):
            if m.autocast_dtypes is not None:
                seen = seen if seen is not None else {}
                seen.update(dict.fromkeys(m.autocast_dtypes))
        return None if seen is None else tuple(seen)

    def __repr__(self) -> str:
        # The dataclass's own would print every measurement (about 10 KB for a sweep): a
        # result holding a Report (LightningBatch, TrainerBatch) must print in a line.
        optimal, maximum = self.optimal, self.max_fit
        return (
            f"Report(model={self.model_name!r}, gpu={self.gpu.name!r}, "
            f"optimal_batch={optimal.batch_size if optimal else None}, "
            f"max_batch={maximum.batch_size if maximum else None}, "
            f"probes={len(self.measurements)}, memory={self.memory_source!r})"
        )

    @property
    def setup_note(self) -> str | None:
        """A sentence saying the training was set up as on a GPU, not as on this machine."""
        return setup_note(self.set_up_for, self.gpu.name)

    # -- many GPUs ---------------------------------------------------------------------------------
    @property
    def gpus(self) -> int:
        """GPUs the step is spread over (1 without a distributed strategy)."""
        return self.settings.hardware.gpu_count or 1

    @property
    def global_batch_per_step(self) -> int | None:
        """Samples each optimizer step sees over every rank at the optimal per-GPU batch: the
        data-parallel ranks' (the tensor and context parallel ranks of one share its batch)."""
        optimal = self.optimal
        if optimal is None:
            return None
        return optimal.batch_size * self.replicas * self.settings.workload.grad_accum

    @property
    def replicas(self) -> int:
        """Data-parallel ranks, each stepping its own batch: the ranks of one tensor, context
        or pipeline parallel group share theirs."""
        return self.settings.hardware.layout(self.gpus).dp

    @property
    def rules_note(self) -> str | None:
        """A sentence saying which rules rest on releases other than the one that ran."""
        if not self.unverified_rules or self.measured:
            return None
        return (
            f"PyTorch {self.torch_version} is outside the releases these simulation rules were "
            f"verified on: {', '.join(self.unverified_rules)}; the answer assumes they hold."
        )

    # -- memory --------------------------------------------------------------------------------
    @property
    def measured(self) -> bool:
        """True when memory was measured on the GPU itself; False when simulated."""
        return any(m.measured for m in self.measurements)

    @property
    def memory_source(self) -> str:
        """'measured' or 'simulated': how every memory figure here was obtained."""
        return memory_source(self.measured)

    @property
    def loop_start(self) -> str | None:
        """How the loop whose memory is reported reached its first step ("training loop",
        "Lightning's loop", "probe": `allocator.LoopStart`), or None when no probe says."""
        return next((m.loop_start for m in self.measurements if m.loop_start), None)

    @property
    def loop_note(self) -> str | None:
        """One line saying which loop the memory figures are for, or None."""
        start = LOOP_STARTS.get(self.loop_start or "")
        return None if start is None else f"memory figures are for {start.says}"

    @property
    def optimal(self) -> Measurement | None:
        """The largest batch measured as fitting below every batch that did not fit."""
        return best_fit(self.searched)

    @property
    def current(self) -> Measurement | None:
        """The measurement at the user's current batch size, if it was taken."""
        for m in self.measurements:
            if m.batch_size == self.settings.search.current_batch:
                return m
        return None

    @property
    def searched(self) -> list[Measurement]:
        """The measurements the answer may come from: none past `max_batch` (the current batch,
        measured for its waste or its needs, may lie beyond it)."""
        return [m for m in self.measurements if m.batch_size <= self.settings.search.max_batch]

    @property
    def max_fit(self) -> Measurement | None:
        """The largest batch measured to run with no margin (no OOM; an allocation retry
        allowed)."""
        return best_fit(self.searched, runs=True)

    def max_note(self) -> str | None:
        """What the max batch is, in words with its memory: one that keeps the margin free (the
        optimal batch's own), or why it is not recommended (it eats into the margin, or runs
        only after a cache flush). None when no batch runs."""
        maximum = self.max_fit
        if maximum is None:
            return None
        figure = f"{gib(_held(maximum)):.2f} GiB reserved"
        if maximum.fits:
            return f"keeps the margin free: {figure}"
        if maximum.alloc_retries:
            return f"runs only after a cache flush (an allocation retry): {figure}"
        return (
            f"runs, but inside the {self.settings.search.margin} margin: {figure}, above the "
            f"{gib(self.limit_bytes):.2f} GiB limit"
        )

    @property
    def current_fits(self) -> bool:
        """False when the current batch does not run (out of memory), or a smaller one did not."""
        current = self.current
        if current is not None:
            return bool(current.runs)
        limit = self.settings.search.current_batch
        return all(m.runs or m.batch_size > limit for m in self.measurements)

    @property
    def capped(self) -> bool:
        """True when the search stopped at max_batch with everything fitting."""
        return self.optimal is not None and all(m.fits for m in self.searched)

    @property
    def global_batch(self) -> int | None:
        """The global batch the plan must reach: the target asked for, else the current batch
        when it does not run (the plan keeps it with accumulation), else None."""
        if self.settings.search.target_batch is not None:
            return self.settings.search.target_batch
        # The current global batch: each optimizer step sees current_batch x grad_accum on
        # every data-parallel rank.
        s = self.settings
        current = s.search.current_batch * s.workload.grad_accum * self.replicas
        return None if self.current_fits else current

    @property
    def waste_bytes(self) -> int | None:
        """Usable memory the current batch leaves idle: capacity less what it reserves. None
        when it does not run, or was not measured."""
        current = self.current
        if current is None or not current.runs:
            return None
        return max(0, self.gpu.usable_bytes - _held(current))

    @property
    def waste_percent(self) -> float | None:
        """waste_bytes as a percentage of usable memory."""
        waste = self.waste_bytes
        return None if waste is None else round(100 * waste / self.gpu.usable_bytes, 1)

    @property
    def policy(self) -> FitPolicy:
        """The fit policy every probe was judged by: the GPU's usable memory and the margin."""
        return FitPolicy.on(self.settings, self.gpu)

    @property
    def margin_bytes(self) -> int:
        """The headroom the user asked the search to keep below usable memory."""
        return self.policy.margin_bytes

    @property
    def limit_bytes(self) -> int:
        """Usable memory less the margin: what each probe's reserved bytes had to fit in."""
        return self.policy.limit_bytes

    @property
    def headroom_bytes(self) -> int | None:
        """Usable memory the optimal batch leaves free: its distance from an out-of-memory."""
        optimal = self.optimal
        return None if optimal is None else self.gpu.usable_bytes - _held(optimal)

    @property
    def predicted_oom_batch(self) -> int | None:
        """The smallest batch measured not to run: out of memory (None when none was)."""
        return min((m.batch_size for m in self.searched if not m.runs), default=None)

    # -- time and money --------------------------------------------------------------------------
    @property
    def batch_ratio(self) -> float | None:
        """optimal batch / current batch: the speedup if throughput grew with batch size (None
        when the current batch does not run: there is nothing to compare against)."""
        optimal = self.optimal
        if optimal is None or not self.current_fits:
            return None
        return round(optimal.batch_size / self.settings.search.current_batch, 3)

    @property
    def throughput_source(self) -> str | None:
        """'measured', 'estimated', or None when no probe carries a throughput."""
        sources = {m.throughput_source for m in self.measurements} - {None}
        return "measured" if "measured" in sources else next(iter(sources), None)

    @property
    def throughput_ratio(self) -> float | None:
        """samples/s at the optimal batch / samples/s at the current one, when both are known."""
        optimal, current = self.optimal, self.current
        if optimal is None or current is None or not current.runs:
            return None
        if not (optimal.samples_per_second and current.samples_per_second):
            return None
        return round(optimal.samples_per_second / current.samples_per_second, 3)

    @property
    def speedup(self) -> float | None:
        """The throughput ratio; the batch ratio when a throughput is unknown (`speedup_source`
        says which)."""
        ratio = self.throughput_ratio
        return ratio if ratio is not None else self.batch_ratio

    @property
    def speedup_source(self) -> str | None:
        """'throughput' (measured or estimated: see throughput_source) or 'batch_ratio'."""
        if self.throughput_ratio is not None:
            return "throughput"
        return "batch_ratio" if self.batch_ratio is not None else None

    @property
    def knee_fraction(self) -> float:
        """The share of the best throughput where larger batches stop paying off."""
        return KNEE_FRACTION

    def knee(self, fraction: float = KNEE_FRACTION) -> Measurement | None:
        """Where larger batches stop paying off: the smallest batch that fits whose throughput
        reaches `fraction` of the best one measured. Only batch sizes measured count, so a fast
        sweep's few probes give a coarse answer; the optimal batch itself means throughput was
        still growing there."""
        ceiling = self._first_failure()
        timed = [
            (m, m.samples_per_second)
            for m in self.searched
            if m.fits and m.samples_per_second and (ceiling is None or m.batch_size < ceiling)
        ]
        if not timed:
            return None
        best = max(rate for _, rate in timed if rate is not None)
        return min(
            (m for m, rate in timed if rate is not None and rate >= fraction * best),
            key=lambda m: m.batch_size,
        )

    @property
    def usd_per_hour(self) -> float:
        """The price of one GPU-hour: the user's, else the catalog's."""
        if self.costs.usd_per_hour is not None:
            return self.costs.usd_per_hour
        return self.gpu.usd_per_hour

    def fix_usd_per_gpu_hour(self, fix: Fix) -> float | None:
        """The user's price per GPU-hour for a way out on the GPU kind they chose (more of it,
        or a change of settings there); None, the catalog's price, for another kind."""
        return self.costs.usd_per_hour if fix.gpu.name == self.gpu.name else None

    @property
    def annual_cost_usd(self) -> float:
        """What a year of training runs costs at the current batch size."""
        return self.usd_per_hour * self.costs.hours_per_run * self.costs.runs_per_year

    @property
    def cost_savings_annual(self) -> float | None:
        """The time saved processing the same samples `speedup` times faster, priced:
        cost * (1 - 1/speedup), at least 0; None when the current batch does not run."""
        if not self.current_fits:
            return None
        speedup = self.speedup
        if speedup is None or speedup <= 1:
            return 0.0
        return round(self.annual_cost_usd * (1 - 1 / speedup), 2)

    def with_costs(self, costs: Costs) -> Report:
        """The same measurements priced with other cost inputs."""
        return replace(self, costs=costs)

    # -- words and JSON ---------------------------------------------------------------------------
    def verdict(self) -> str:
        """One sentence a person reads first."""
        optimal, current, maximum = self.optimal, self.current, self.max_fit
        b, gpu = self.settings.search.current_batch, self.gpu.name
        if optimal is None and maximum is not None:
            return (
                f"No batch size on this {gpu} leaves the margin free without an allocation "
                f"retry; batch {maximum.batch_size} {self.max_note()}."
            )
        if optimal is None and self.settings.workload.eval_batch is not None:
            return (
                f"No batch size trains on this {gpu} evaluating at eval batch "
                f"{self.settings.workload.eval_batch} between steps: even batch 1 runs out of "
                "memory."
            )
        h = self.settings.hardware
        if optimal is None and h.pp > 1:
            smallest = h.pipeline_microbatches  # a pipeline's local batch splits into these
            return (
                f"No batch size trains on this {gpu}: even a local batch of {smallest} (one "
                "sample a microbatch) runs out of memory on the worst pipeline stage."
            )
        if optimal is None:
            return f"No batch size trains on this {gpu}: even batch 1 runs out of memory."
        if maximum is not None and maximum.batch_size > optimal.batch_size:
            answer = (
                f"batch {optimal.batch_size} trains with the margin free "
                f"({maximum.batch_size} runs with none)"
            )
        else:
            above = "" if self.capped else f", {self._first_failure()} does not"
            answer = f"batch {optimal.batch_size} trains{above}"
        window = self.fit_window
        if window is not None:
            answer += f". {window.sentence()[:-1]}"
        if not self.current_fits:
            needs = ""
            if current is not None and current.required_bytes is not None:
                needs = (
                    f" (needs {gib(current.required_bytes):.2f} of "
                    f"{gib(self.gpu.usable_bytes):.2f} GiB)"
                )
            return f"Batch {b} crashes with out of memory on this {gpu}{needs}; {answer}."
        if current is not None and not current.fits:
            why = (
                "only after the allocator flushed its cache"
                if current.alloc_retries
                else "but leaves less than the margin free"
            )
            return f"Batch {b} runs on this {gpu} {why}; {answer}."
        used = 0.0 if current is None else 100 * _held(current) / self.gpu.usable_bytes
        return f"Batch {b} uses {used:.0f}% of this {gpu}'s usable memory; {answer}."

    @property
    def fit_window(self) -> FitWindow | None:
        """Batches measured to fit with the margin free above the first that does not (a
        fragmentation window below them), or None when the verdicts are monotone."""
        ceiling = self._first_failure()
        if ceiling is None or self.optimal is None:
            return None
        ordered = sorted(self.searched, key=lambda m: m.batch_size)
        above = [m for m in ordered if m.batch_size > ceiling]
        fits_from = next((m.batch_size for m in above if m.fits), None)
        if fits_from is None:
            return None
        window = [m for m in above if m.batch_size < fits_from] + [
            m for m in ordered if m.batch_size == ceiling
        ]
        later = [m.batch_size for m in above if m.batch_size > fits_from and not m.fits]
        fits_to = max(
            m.batch_size for m in above if m.fits and (not later or m.batch_size < min(later))
        )
        last = max(m.batch_size for m in window)
        return FitWindow(ceiling, last, fits_from, fits_to, _window_why(window))

    def _first_failure(self) -> int | None:
        return min((m.batch_size for m in self.searched if not m.fits), default=None)

    @property
    def partial_note(self) -> str | None:
        """When a limit ended the sweep: which one, and what the probes so far establish."""
        if self.stopped_by is None:
            return None
        fits = max((m.batch_size for m in self.searched if m.fits), default=None)
        fails = self._first_failure()
        known = (f"batch {fits} fits" if fits is not None else "no batch measured so far fits") + (
            f" and batch {fails} does not, so the largest lies between them"
            if fails is not None and fits is not None
            else f"; batch {fails} does not"
            if fails is not None
            else "; no larger batch was measured, so a larger one may fit too"
        )
        n = len(self.measurements)
        return (
            f"Partial answer: the sweep stopped at {self.stopped_by} after {n} "
            f"probe{'s' if n != 1 else ''}; {known}."
        )

    @property
    def ways_out_note(self) -> str | None:
        """When a limit ended the search for ways out: that the sweep itself finished, which
        ways out were found and which were not finished (None when the search finished)."""
        if self.fixes_stopped_by is None:
            return None
        n = len(self.fixes)
        found = (
            f"after finding {plural(n, 'way out', 'ways out')} (listed)"
            if n
            else "before it found any"
        )
        rest = ", ".join(self.fixes_not_finished) or "none"
        return (
            f"The sweep finished (no batch fits); the search for ways out then stopped at "
            f"{self.fixes_stopped_by}, {found}. Not finished: {rest}."
        )

    @property
    def search_note(self) -> str | None:
        """How the symbolic search got its answer: how many steps it traced and replayed, or
        why it traced every probe; None for another strategy."""
        if self.search_fallback is not None:
            return f"The symbolic search traced every probe: {self.search_fallback}."
        replayed = sum(m.replayed for m in self.measurements)
        if not replayed:
            return None
        traced = len(self.measurements) - replayed
        return (
            f"{plural(traced, 'step')} traced, {replayed} replayed from them by arithmetic "
            "(the symbolic search: the same figures a trace gives)."
        )

    @property
    def depth_note(self) -> str | None:
        """What was traced and what replayed at the model's depth (simulated), as a sentence;
        None when the backend did not say."""
        if self.depth_replay is None:
            return None
        line = self.depth_replay.says()
        return f"{line[0].upper()}{line[1:]}."

    @property
    def plan_note(self) -> str | None:
        """Why there is no plan for the global batch, when there is none."""
        target = self.global_batch
        if target is None or self.plan is not None or self.optimal is None:
            return None
        if target % self.replicas:
            return (
                f"no plan reaches a global batch of {target}: it is not a multiple of the "
                f"{self.replicas} data-parallel ranks, which step the same micro-batches"
            )
        share = "it" if self.replicas == 1 else f"a rank's share ({target // self.replicas})"
        multiple = self.settings.hardware.micro_batch_multiple
        if multiple > 1 and (target // self.replicas) % multiple:
            return (
                f"no plan reaches a global batch of {target}: {share} is not a multiple of the "
                f"{multiple} microbatches a pipeline step splits each micro-batch into"
            )
        if multiple > 1:
            share += f", a multiple of the pipeline's {multiple} microbatches,"
        return (
            f"no plan reaches a global batch of {target}: no micro-batch that divides {share} "
            "fits with gradient accumulation (every gradient stays alive through the next "
            "micro-batch)"
        )
