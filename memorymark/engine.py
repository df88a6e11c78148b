"""The engine's front door: one `Session` per `Settings`, the only way into the engine.

A Session resolves, once, which backend runs the step (a real CUDA/MPS device, or the simulation),
which GPU its figures answer for, and the fit policy (capacity and margin) every verdict is judged
by. Then it offers what the CLI, the app, calibrate, the benchmarks and users' scripts need:
`measure` one batch, `stream` a sweep as a generator, `report` on it (with the ways out when
nothing fits), `compare` every catalog GPU, and `proof` of why inference-style numbers crash.

Importing this module loads no torch: the modules that need it are imported when a Session is
made, so the app's UI can import the front door and the plain value types (`Settings`,
`Measurement`, `Report`, `GPU`) and nothing that touches tensors. Must not know how anything is
displayed.

Example (a two-layer BERT on a simulated A10, a few seconds on a laptop):

    >>> from memorymark import Session, Settings
    >>> session = Session(Settings(model="tiny-bert", seq_len=32, gpu="a10", max_batch=64))
    >>> report = session.analyze()
    >>> report.optimal.batch_size, report.memory_source
    (64, 'simulated')
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from memorymark import gpus, models
from memorymark.analyses import compare, layouts, scale_out
from memorymark.analyses.bench import Bench
from memorymark.analyses.compare import GpuFit
from memorymark.analyses.fixes import WaysOutSearch
from memorymark.analyses.layouts import LayoutSearch
from memorymark.analyses.proof import PROOF_STEPS, BackwardProof, ProtocolResult, protocol_settings
from memorymark.analyses.scale_out import ScaleOutRow
from memorymark.backends import selection
from memorymark.environment import stamp, torch_version
from memorymark.fit import FitPolicy
from memorymark.gpus import GPU
from memorymark.measurement import DepthReplay, Measurement, is_measured, memory_source
from memorymark.report import Report
from memorymark.search import estimate, gpu_count
from memorymark.search.compile_gap import CompileGap
from memorymark.search.eval_batch import EvalAnswer, EvalMeasurer
from memorymark.search.gpu_count import GpuSearch, with_gpus
from memorymark.search.pick import pick_strategy
from memorymark.search.plan import TrainingPlan, plan_for_target
from memorymark.search.seq_len import SeqLenAnswer, SeqLenMeasurer, search_cap
from memorymark.search.strategies import FastStrategy, Strategy
from memorymark.search.sweep import SweepLimits, best_fit, sweep
from memorymark.search.symbolic import SymbolicStrategy
from memorymark.settings import Costs, Settings, check_model, parallel_checks
from memorymark.step import user_job
from memorymark.step.user_job import Training
from memorymark.ways_out import FitAnswer

FIXES_STAGE = "nothing fits: simulating what would (checkpointing, bf16, LoRA, a bigger GPU)"
"""What `Session.report` says before it simulates the ways out (its `on_stage`)."""

if TYPE_CHECKING:
    from memorymark.backends.base import Backend


class Session:
    """One analysis: the step `settings` describe, on the GPU and backend they resolve to.

    `cuda` is the device module real runs go through (`torch.cuda` unless a test passes a fake);
    `gpu` judges every verdict against another GPU than the settings name (calibrate's emulated
    GPU on a capped real one). `training` is the user's own training code
    (`memorymark.Training`), sized instead of the catalog model the settings name: then the
    settings say only where it runs and how to search.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        cuda: Any = None,
        gpu: GPU | None = None,
        training: Training | None = None,
    ) -> None:
        if training is not None and not isinstance(training, Training):
            raise ValueError(
                f"training must be a memorymark.Training (got {type(training).__name__})"
            )
        self.training = training
        """The user's own training code, or None for the catalog model the settings name."""
        # The model is resolved first (a `file:` config or the hub is read here, as Settings
        # validate with no I/O), so a model that cannot be read fails before torch loads.
        self.model_entry: models.ModelEntry | None = None
        """The catalog model the settings name, resolved once (None for a training job)."""
        _refuse_unsimulated(settings)
        if training is None:
            self.model_entry = check_model(settings)
            parallel_checks.check_parallel(settings, self.model_entry)
        elif settings.hardware.tp * settings.hardware.cp > 1:
            raise ValueError("--tp and --cp split a catalog model's blocks: not a training job's")
        else:
            user_job.check_settings(settings)
        # torch loads here, not when the front door is imported
        from memorymark.backends import resolve

        self.settings = settings
        self._cuda = cuda
        self._resolution = resolve.resolve(settings, cuda, gpu, training)
        self.backend_name = self._resolution.backend_name
        """cuda, mps, sim or cpu."""
        self.gpu: GPU = self._resolution.gpu
        """The GPU every figure answers for: detected on this machine, or from the catalog;
        on many GPUs, one rank's view of it (NCCL's buffers taken out of usable memory)."""
        self.gpu.check_precision(settings.workload.precision)
        if training is not None:
            _check_set_up_for(training, self.gpu)
        self.gpu.check_attention(settings.workload.attention)
        self.policy: FitPolicy = self._resolution.policy
        """Capacity and margin: what every verdict of this session is judged against."""
        self.gpu_search: GpuSearch | None = None
        """How `--gpus auto` chose this session's GPU count (set by `with_min_gpus`)."""
        self.measurements: list[Measurement] = []
        self.seq_len_probes: list[tuple[int, Measurement]] = []
        """(sequence length, measurement) of a sequence-length search, in the order tried."""
        self.elapsed_seconds = 0.0
        self.stopped_by: str | None = None
        """Which limit ended the sweep early ("the time limit (60 s)"); None when it finished."""
        self.depth_replay: DepthReplay | None = None
        """How the sweep's simulated full-depth steps were had (`--depth`): traced in full, or
        replayed from the model built with fewer blocks; None where the backend does not say
        (a real GPU, or before a sweep)."""
        self._ways_out: WaysOutSearch | None = None
        self._evals: dict[int, EvalAnswer] = {}
        self._compile_gap: CompileGap | None = None
        self._plans: dict[int, tuple[TrainingPlan | None, tuple[Measurement, ...]]] = {}
        self._symbolic: SymbolicStrategy | None = None

    @property
    def runs_for_real(self) -> bool:
        """True when the step runs real kernels on this machine (cuda, mps, cpu), so it must
        take turns with other real runs; False when it runs on fake tensors. Not the same as
        measured: `cpu`'s figures are simulated (see `memory_source`)."""
        return self.backend_name != "sim"

    @property
    def memory_source(self) -> str:
        """'measured' (on a GPU) or 'simulated', as every memory figure of this session is."""
        return memory_source(is_measured(self.backend_name))

    def open_backend(self, settings: Settings | None = None) -> Backend:
        """A fresh backend for `settings` (this session's by default) on this session's GPU."""
        return self._resolution.open_backend(settings)

    @functools.cached_property
    def bench(self) -> Bench:
        """The door the analyses come in through (memorymark/analyses/bench.py): steps of
        any settings on any GPU, resolved as this session was, through its CUDA module. One
        per session, so what it counts once (a model's states) the sweep and the ways out share."""
        return _Bench(self._cuda)

    # -- one batch, a sweep, its report -----------------------------------------------------------
    def measure(self, batch_size: int) -> Measurement:
        """One step (the whole loop, with accumulation) at `batch_size`."""
        with self.open_backend().session() as backend:
            return backend.measure(batch_size)

    def resident_bytes(self) -> dict[str, int]:
        """Bytes by category one rank holds before its first step (parameters or their shards,
        buffers, optimizer state): what the model's states cost, whatever the batch."""
        with self.open_backend().session() as backend:
            return backend.resident_bytes()

    def stream(self, *, answer_only: bool = False) -> Generator[Measurement, None, None]:
        """Yield each measurement of the sweep the moment it exists; the backend is released at
        the end, however the consumer stops (use `contextlib.closing` to stop early). The
        current batch is stepped after the search where it did not (what it would need is the
        report's), unless `answer_only`: a row of a layout or count table reads the answer and
        nothing else.

        The settings' time and probe limits end it early (`stopped_by` says which); a simulated
        model whose shortest sweep is estimated to outlast the time limit is refused
        (ValueError) before the first probe."""
        s = self.settings
        self.check_time_limit()
        if s.hardware.gpu_count is None:
            raise ValueError("--gpus auto: find the count first (Session.with_min_gpus)")
        backend = self.open_backend()
        # A pipeline splits each local batch into its microbatches: only their multiples run.
        multiple = s.hardware.micro_batch_multiple
        step = math.lcm(s.search.step, multiple)
        strategy = self._strategy(
            backend, step=step, max_batch=max(s.search.max_batch, step), floor=self._states_floor()
        )
        strategy.multiple = multiple
        limits = SweepLimits(
            time_limit_seconds=s.search.time_limit_seconds, max_probes=s.search.max_probes
        )
        start = time.perf_counter()
        also = () if answer_only else (s.search.current_batch,)
        probes = sweep(backend, strategy, also=also, limits=limits)
        try:
            with contextlib.closing(probes):
                for measurement in probes:
                    self.measurements.append(measurement)
                    self.elapsed_seconds = time.perf_counter() - start
                    yield measurement
        finally:
            # Kept however the sweep ends (a consumer that stops early reports what it has).
            self.depth_replay = backend.depth_replay
        self.stopped_by = limits.stopped_by

    def _states_floor(self) -> int:
        """Bytes every step of the sweep holds at least, where they are known without a step:
        a simulated catalog model's states, counted on the meta device, on one GPU or
        replicated (DDP); 0 elsewhere. Past the capacity, the sweep traces batch 1 alone
        (Llama-3.1-70B in fp32 on an A10: 1,051 GB of states, 5 probes before)."""
        s = self.settings
        if self.backend_name != "sim" or self.model_entry is None:
            return 0
        if s.hardware.dist not in ("none", "ddp") or s.hardware.model_parallel > 1:
            return 0  # shards, or states on the host: what one rank holds is not the model's
        return self.bench.counted_states(s)[0]

    def _strategy(
        self, measurer: Any, *, step: int, max_batch: int, degree: int = 1, floor: int = 0
    ) -> Strategy:
        """The settings' strategy over `measurer`'s axis; the symbolic one replays where the
        measurer keeps records of its traced steps (a simulation), else it is the fast one and
        says why (`search_fallback`)."""
        strategy = pick_strategy(
            self.settings.search.strategy,
            measurer,
            step=step,
            max_batch=max_batch,
            capacity_bytes=self.policy.capacity_bytes,
            limit_bytes=self.policy.limit_bytes,
            degree=degree,
            why_not=f"the {self.backend_name} backend traces every probe: nothing to replay",
            floor_bytes=floor,
        )
        if isinstance(strategy, SymbolicStrategy):
            self._symbolic = strategy
        return strategy

    @property
    def search_fallback(self) -> str | None:
        """Why the symbolic strategy traced probes where it would have replayed them (None:
        it replayed, or another strategy searched)."""
        return self._symbolic.fallback if self._symbolic is not None else None

    def check_time_limit(self) -> None:
        """Refuse (ValueError, one line) a simulated model whose shortest sweep is estimated to
        outlast the settings' time limit (memorymark/search/estimate.py). A user's training
        has no estimate before it runs: the time limit stops its sweep instead."""
        if self.backend_name == "sim" and self.model_entry is not None:
            estimate.check_time_limit(self.settings, self.model_entry)

    def _catalog_entry(self, what: str) -> models.ModelEntry:
        """The catalog model, for what only a catalog model can do yet (ValueError otherwise)."""
        if self.model_entry is None:
            raise ValueError(
                f"{what} is for catalog models for now: a training job is sized by "
                "analyze and measure"
            )
        return self.model_entry

    def resume(
        self,
        measurements: tuple[Measurement, ...],
        elapsed_seconds: float,
        depth_replay: DepthReplay | None = None,
    ) -> None:
        """Take a finished sweep's measurements as this session's own, so `report` answers from
        them without measuring again (a new target batch, new prices): only its plan's steps
        with accumulation, if any, are measured. The sweep must be of these settings but for
        `target_batch`; `depth_replay` is how its steps were had, as its report said."""
        self.measurements = list(measurements)
        self.elapsed_seconds = elapsed_seconds
        self.depth_replay = depth_replay

    # -- the other axis: the longest sequence at a fixed batch ------------------------------------
    def stream_seq_len(self) -> Iterator[tuple[int, Measurement]]:
        """Yield (sequence length, measurement) for each length a sequence-length search tries
        at batch `settings.search.current_batch`, on one backend whose model and optimizer
        state stay resident; the grid is `settings.search.seq_step` tokens up to the model's
        positions."""
        s = self.settings
        cap = search_cap(s, self._catalog_entry("a sequence-length search").max_positions)
        measurer = SeqLenMeasurer(self.open_backend(), s, s.search.current_batch)
        # Attention scores grow with the square of the length: polynomials of degree 2.
        strategy = self._strategy(
            measurer, step=min(s.search.seq_step, cap), max_batch=cap, degree=2
        )
        start = time.perf_counter()
        with contextlib.closing(sweep(measurer, strategy)) as probes:
            for relabelled in probes:
                seq_len = relabelled.batch_size
                self.seq_len_probes.append((seq_len, measurer.probes[seq_len]))
                self.elapsed_seconds = time.perf_counter() - start
                yield self.seq_len_probes[-1]

    def seq_len_answer(self) -> SeqLenAnswer:
        """The answer over every sequence length probed so far."""
        s = self.settings
        return SeqLenAnswer(
            settings=s,
            batch_size=s.search.current_batch,
            probes=tuple(self.seq_len_probes),
            search_cap=search_cap(s, self._catalog_entry("--find seq-len").max_positions),
            gpu_name=self.gpu.name,
            gpu_total_bytes=self.gpu.total_bytes,
            usable_bytes=self.gpu.usable_bytes,
            memory_source=self.memory_source,
            elapsed_seconds=self.elapsed_seconds,
            search_fallback=self.search_fallback,
        )

    def find_seq_len(self) -> SeqLenAnswer:
        """Run the whole sequence-length search and return its answer."""
        for _ in self.stream_seq_len():
            pass
        return self.seq_len_answer()

    def report(
        self,
        costs: Costs | None = None,
        *,
        fixes: bool = True,
        plan: bool = True,
        on_stage: Callable[[str], None] | None = None,
    ) -> Report:
        """The report over every measurement taken so far, with the plan for the global batch
        (`plan`: its accumulation steps may be measured) and, when nothing fits and `fixes` is
        on, each way out (both computed once per session). Callers that need only the answer
        turn both off. `on_stage(text)` hears, before each of those that runs steps (a model
        built again, a training step per check: seconds to a minute for a large model after
        the sweep's last probe), what it is about to do, so a live view is not silent."""
        from memorymark.cuda_rules import versions

        say = on_stage or (lambda _text: None)

        report = Report(
            settings=self.settings,
            costs=costs or Costs(),
            gpu=self.gpu,
            backend=self.backend_name,
            measurements=tuple(self.measurements),
            elapsed_seconds=self.elapsed_seconds,
            stopped_by=self.stopped_by,
            search_fallback=self.search_fallback,
            depth_replay=self.depth_replay,
            torch_version=torch_version(),
            unverified_rules=versions.unverified_rules(),
            training=self.training.label if self.training is not None else None,
            set_up_for=self.training.set_up_for if self.training is not None else None,
            stamp=stamp(
                backend=self.backend_name,
                device=self.gpu.name,
                memory_source=self.memory_source,
            ),
            gpu_search=self.gpu_search,
        )
        # A sweep a limit stopped measures nothing more: its partial answer is what is known.
        plan, fixes = plan and self.stopped_by is None, fixes and self.stopped_by is None
        if plan and report.optimal is not None:
            planned, probes = self._plan(
                report.optimal.batch_size, report.global_batch, report.replicas, say
            )
            report = replace(report, plan=planned, plan_probes=probes)
        if (
            self.settings.workload.eval_batch is not None
            and self.stopped_by is None
            and self.measurements
        ):
            report = replace(report, evaluation=self.evaluation(report.optimal, say))
        if (
            self.settings.workload.compile
            and self.training is None
            and self.stopped_by is None
            and self.measurements
        ):
            report = replace(report, compile_gap=self.compile_gap(report.optimal, say))
        if fixes and report.optimal is None and self.needs_ways_out:
            if self._ways_out is None:
                say(FIXES_STAGE)
            answer = self.fixes()
            report = replace(
                report,
                fixes=answer.fixes,
                batch_1_required_bytes=answer.required_bytes,
                fixes_stopped_by=answer.stopped_by,
                fixes_not_finished=answer.not_finished,
            )
        return report

    @property
    def needs_ways_out(self) -> bool:
        """True when the sweep finished and no batch it searched fits: `report` then looks for
        the ways out (a training job's own code has no settings to change)."""
        searched = [m for m in self.measurements if m.batch_size <= self.settings.search.max_batch]
        finished = self.stopped_by is None and bool(self.measurements)
        # Under pipeline parallelism the ways out (probed at batch 1) are not searched yet.
        pipelined = self.settings.hardware.pp > 1
        return finished and best_fit(searched) is None and self.training is None and not pipelined

    def analyze(
        self,
        costs: Costs | None = None,
        *,
        fixes: bool = True,
        plan: bool = True,
        answer_only: bool = False,
    ) -> Report:
        """Run the whole sweep and return its report (for scripts that need no live progress);
        `fixes` and `plan` as for `report`, `answer_only` as for `stream`. `--gpus auto` first
        finds the GPU count."""
        if self.settings.hardware.gpu_count is None:
            return self.with_min_gpus().analyze(
                costs, fixes=fixes, plan=plan, answer_only=answer_only
            )
        for _ in self.stream(answer_only=answer_only):
            pass
        return self.report(costs, fixes=fixes, plan=plan)

    def evaluation(
        self, optimal: Measurement | None, on_stage: Callable[[str], None] | None = None
    ) -> EvalAnswer:
        """The evaluation pass the settings ask for, judged at the recommended training batch
        `optimal` (at batch 1 when none fits, so the answer still says which eval batch would
        let training start), and the largest eval batch that fits there: searched with the
        fast strategy on one backend whose model and optimizer state stay resident (once per
        session and training batch), within what the sweep's limits leave. `on_stage` as for
        `report`."""
        s = self.settings
        assert s.workload.eval_batch is not None
        at = optimal.batch_size if optimal is not None else 1
        if at not in self._evals:
            if on_stage is not None:
                on_stage(f"searching the largest eval batch beside training batch {at}")
            asked = optimal or next((m for m in self.measurements if m.batch_size == at), None)
            measurer = EvalMeasurer(self.open_backend(), s, at)
            if asked is None:
                asked = measurer.measure(s.workload.eval_batch)
                asked = measurer.probes.pop(s.workload.eval_batch)
            strategy = FastStrategy(
                step=min(s.search.step, s.search.max_batch),
                max_batch=s.search.max_batch,
                capacity_bytes=self.policy.capacity_bytes,
                limit_bytes=self.policy.limit_bytes,
                find_max=False,
            )
            limits = self._remaining_limits()
            for _ in sweep(measurer, strategy, limits=limits):
                pass
            self._evals[at] = EvalAnswer(
                batch=s.workload.eval_batch,
                accumulation=s.workload.eval_accumulation,
                at_batch=at,
                measurement=asked,
                probes=tuple(measurer.probes.items()),
                stopped_by=limits.stopped_by,
            )
        return self._evals[at]

    def compile_gap(
        self, optimal: Measurement | None, on_stage: Callable[[str], None] | None = None
    ) -> CompileGap:
        """The same step run eagerly beside this compiled one (`--compile`): the eager sweep's
        largest batch, and both steps at the compiled step's recommended batch (1 when none
        fits), whose peaks by category say what compiling changed. Once per session; the eager
        sweep runs on its own session with the time this one's limits leave."""
        if self._compile_gap is None:
            if on_stage is not None:
                on_stage("sizing the same step without torch.compile, to compare")
            eager_settings = self.settings.replace(compile=False, activation_memory_budget=1.0)
            left = self._remaining_limits().time_limit_seconds
            if left is not None:
                eager_settings = eager_settings.replace(time_limit_seconds=max(left, 1.0))
            eager = Session(eager_settings, cuda=self._cuda)
            for _ in eager.stream():
                pass
            at = optimal.batch_size if optimal is not None else 1
            compiled = optimal or self._measured_at(self, at)
            best = best_fit(eager.measurements)
            self._compile_gap = CompileGap(
                compiled_max=optimal.batch_size if optimal is not None else None,
                eager_max=best.batch_size if best is not None else None,
                at_batch=at,
                compiled=compiled,
                eager=self._measured_at(eager, at),
                stopped_by=eager.stopped_by,
                budget=self.settings.workload.activation_memory_budget,
                full_budget=self._at_full_budget(at),
            )
        return self._compile_gap

    def _at_full_budget(self, batch: int) -> Measurement | None:
        """This compiled step at `batch` with the default activation memory budget, when the
        settings ask for less (what the budget saved is read against it); else None."""
        if self.settings.workload.activation_memory_budget == 1.0:
            return None
        full = self.settings.replace(activation_memory_budget=1.0)
        return Session(full, cuda=self._cuda).measure(batch)

    @staticmethod
    def _measured_at(session: Session, batch: int) -> Measurement:
        """`session`'s measurement at `batch`: the one its sweep took, else a new one."""
        taken = next((m for m in session.measurements if m.batch_size == batch), None)
        return taken if taken is not None else session.measure(batch)

    def _remaining_limits(self) -> SweepLimits:
        """What the settings' time and probe limits leave after the sweep."""
        s = self.settings
        seconds = s.search.time_limit_seconds
        probes = s.search.max_probes
        return SweepLimits(
            time_limit_seconds=None if seconds is None else max(seconds - self.elapsed_seconds, 0),
            max_probes=None if probes is None else max(probes - len(self.measurements), 0),
        )

    def ways_out(self) -> WaysOutSearch:
        """When nothing fits: the search for batch 1 as configured and each change (or GPU)
        that might fit, made once per session, within the settings' own time limit for it
        (`ways_out_time_limit_seconds`); iterate its `stages()` to see each as it is found."""
        if self._ways_out is None:
            batch_1 = next((m for m in self.measurements if m.batch_size == 1), None)
            self._ways_out = WaysOutSearch(
                self.settings,
                batch_1,
                bench=self.bench,
                time_limit_seconds=self.settings.search.ways_out_time_limit_seconds,
            )
        return self._ways_out

    def fixes(self) -> FitAnswer:
        """When nothing fits: batch 1 as configured, and each change (or GPU) that might fit
        (what `ways_out()` finds, run to its end or its time limit)."""
        return self.ways_out().answer()

    def _plan(
        self, optimal_batch: int, target: int | None, replicas: int, say: Callable[[str], None]
    ) -> tuple[TrainingPlan | None, tuple[Measurement, ...]]:
        """The plan for global batch `target` over `replicas` data-parallel ranks (once per
        target): divisors of a rank's share are checked with accumulation on a backend of their
        own, since the sweep's steps did not accumulate (`say` hears it first)."""
        accumulating = self.settings.workload.grad_accum
        if target is None or self.training is not None:
            # A training job accumulates in its own step, which no setting can change: its
            # plan is the batch it was measured at.
            as_measured = TrainingPlan(
                micro_batch=optimal_batch, accumulation_steps=accumulating, target_batch=None,
                data_parallel_ranks=replicas,
            )  # fmt: skip
            return as_measured, ()
        if target not in self._plans:
            probes: list[Measurement] = []
            # Any accumulation past one peaks alike: every gradient alive through the next
            # micro-batch, so two micro-batches stand for them all.
            backend = self.open_backend(self.settings.replace(grad_accum=2))

            def fits_accumulating(micro_batch: int) -> bool:
                if not probes:  # said once, before the first step runs
                    say(
                        f"checking the plan for a global batch of {target}: micro-batches "
                        "with gradient accumulation, a training step each"
                    )
                probes.append(backend.measure(micro_batch))
                return probes[-1].fits

            with backend.session():
                plan = plan_for_target(
                    target,
                    optimal_batch,
                    fits_accumulating,
                    accumulation_measured=accumulating > 1,
                    replicas=replicas,
                    multiple=self.settings.hardware.micro_batch_multiple,
                )
            self._plans[target] = plan, tuple(probes)
        return self._plans[target]

    # -- many GPUs ------------------------------------------------------------------------------
    def min_gpus(self, counts: tuple[int, ...] | None = None) -> GpuSearch:
        """The smallest GPU count (of `counts`, a cluster's by default: 1-8, then whole 8-GPU
        nodes up to 1024) on which batch 1 fits under these settings' strategy."""
        self._catalog_entry("--gpus auto")
        if self.settings.hardware.dist == "none":
            raise ValueError("--gpus auto needs a distributed strategy (--dist)")

        gpu = self.gpu

        def limit(n: int) -> int:
            return selection.fit_policy(with_gpus(self.settings, n), gpu).limit_bytes

        def measure(s: Settings) -> Measurement:
            return Session(s, cuda=self._cuda).measure(1)

        hw = self.settings.hardware
        sharded = None
        if hw.dist in ("fsdp", "fsdp-no-reshard") and hw.offload == "none":
            # FSDP2 shards every weight, gradient and optimizer state over all ranks (HSDP only
            # inside a node, DDP none; offloaded ones live on the host).
            sharded = self.bench.counted_states(self.settings)[0]
        return gpu_count.min_gpus(self.settings, measure, counts, limit, sharded)

    def with_min_gpus(self, counts: tuple[int, ...] | None = None) -> Session:
        """A session on the smallest count that trains (the largest tried when none does),
        carrying the search for its report."""
        search = self.min_gpus(counts)
        chosen = search.min_gpus or max(n for n, _ in search.tried)
        session = Session(with_gpus(self.settings, chosen), cuda=self._cuda)
        session.gpu_search = search
        return session

    def scale_out(
        self, counts: tuple[int, ...], costs: Costs | None = None, samples_per_run: float = 1e6
    ) -> Iterator[ScaleOutRow]:
        """Each GPU count's sweep as a row (per-rank memory, per-GPU batch, estimated time and
        cost of a run of `samples_per_run` samples), as it finishes."""
        if self.settings.hardware.dist == "none":
            raise ValueError("scaling out needs a distributed strategy (--dist)")
        s = self.settings
        params = models.parameter_count(
            self._catalog_entry("scaling out"), s.workload.resolved_task
        )
        price = (costs or Costs()).usd_per_hour or self.gpu.usd_per_hour

        return scale_out.scale_out(s, self.bench, counts, params, samples_per_run, price)

    def layouts(
        self, costs: Costs | None = None, samples_per_run: float = layouts.DEFAULT_SAMPLES_PER_RUN
    ) -> LayoutSearch:
        """The data x tensor x pipeline (x context) layouts of these settings' GPU count that
        train, best first by estimated throughput; with `--gpus auto`, the fewest GPUs on
        which one does, and its layouts (memorymark/analyses/layouts.py)."""
        entry = self._catalog_entry("the layout search")
        s, count = self.settings, self.settings.hardware.gpu_count
        layouts.check_settings(s)
        gpu = self.gpu
        inputs = layouts.Inputs(
            shape=layouts.shape_of(models.config_of(entry)),
            param_count=models.parameter_count(entry, s.workload.resolved_task),
            states_bytes=self.bench.counted_states(s)[0],  # once: every layout shares it
            gpu=gpu,
            capacity=lambda chosen: selection.fit_policy(chosen, gpu).capacity_bytes,
            limit=lambda chosen: selection.fit_policy(chosen, gpu).limit_bytes,
            usd_per_hour=(costs or Costs()).usd_per_hour or gpu.usd_per_hour,
            samples_per_run=samples_per_run,
        )
        if count is None:
            return layouts.fewest_gpus(s, self.bench, inputs)
        return layouts.search_layouts(s, self.bench, count, inputs)

    # -- across GPUs and protocols ---------------------------------------------------------------
    def compare(
        self, costs: Costs | None = None, catalog: tuple[GPU, ...] | None = None
    ) -> tuple[list[GpuFit], list[Measurement]]:
        """Each catalog GPU's answer for these settings (simulated), priced against this
        session's GPU, and every measurement it took."""
        self._catalog_entry("comparing GPUs")
        return compare.compare_gpus(
            self.settings, costs, catalog or gpus.CATALOG, reference=self.gpu, bench=self.bench
        )

    def proof(self, batch_size: int, *, sweeps: bool = False) -> Iterator[ProtocolResult]:
        """Forward-only, forward+backward, and the full step (eval and train) at `batch_size`,
        each as it lands (for live progress); with `sweeps`, each one's max batch too."""
        self._catalog_entry("the backward-pass proof")
        for key, label, _ in PROOF_STEPS:
            variant = protocol_settings(self.settings, key)
            m = Session(variant, cuda=self._cuda).measure(batch_size)
            max_batch = None
            if sweeps:
                session = Session(variant.replace(current_batch=batch_size), cuda=self._cuda)
                best = session.analyze(fixes=False, plan=False).optimal
                max_batch = best.batch_size if best else 0
            yield ProtocolResult(
                key=key,
                label=label,
                peak_bytes=m.peak_bytes,
                fits=m.fits,
                max_batch=max_batch,
                measured=m.measured,
            )

    def prove_backward(self, batch_size: int, *, sweeps: bool = False) -> BackwardProof:
        """The four protocols at `batch_size`, with the prototype's verdict."""
        return BackwardProof(
            batch_size=batch_size, results=tuple(self.proof(batch_size, sweeps=sweeps))
        )


class _Bench:
    """The analyses' door (memorymark/analyses/bench.py), as a Session resolves: backends
    for any settings on any GPU through one CUDA device module (`torch.cuda` unless a test
    passes a fake), the states counted on the meta device, and whole sweeps as Sessions."""

    def __init__(self, cuda: Any) -> None:
        self._cuda = cuda
        self._counted: dict[Settings, tuple[int, int]] = {}

    def backend(self, settings: Settings, gpu: GPU) -> Backend:
        """A fresh backend for `settings` answering for `gpu` as one of their ranks sees it."""
        _refuse_unsimulated(settings)  # as a Session does: the layout search steps through here
        from memorymark.backends import resolve  # torch loads here

        return resolve.resolve(settings, self._cuda, gpu).open_backend()

    def measure(self, settings: Settings, gpu: GPU, batch_size: int = 1) -> Measurement:
        """One step of `settings` at `batch_size` on `gpu`, on a backend of its own."""
        backend = self.backend(settings, gpu)
        with backend.session():
            return backend.measure(batch_size)

    def simulated_gpu(self, settings: Settings) -> GPU:
        """The whole GPU a simulation of `settings` answers for."""
        from memorymark.backends import resolve

        return resolve.resolve_gpu(settings, "sim", self._cuda)

    def counted_states(self, settings: Settings) -> tuple[int, int]:
        """(bytes of the model's states, its parameter count), counted on the meta device."""
        from memorymark.backends import states

        if settings not in self._counted:
            self._counted[settings] = states.counted_states(settings)
        return self._counted[settings]

    def analyze(self, settings: Settings, *, answer_only: bool = False) -> Report:
        """A whole sweep of `settings` in a Session of its own, with no ways out or plan
        (`answer_only` as for `Session.stream`)."""
        session = Session(settings, cuda=self._cuda)
        return session.analyze(fixes=False, plan=False, answer_only=answer_only)


def _refuse_unsimulated(settings: Settings) -> None:
    hw = settings.hardware
    if hw.pp > 1 and hw.cp > 1:
        # Each is simulated alone; an answer that dropped one would be another layout's.
        raise ValueError(
            "--pp beside --cp is not simulated yet: size the pipeline with FSDP and tensor "
            "parallelism (--dist fsdp --tp T --pp N), or context parallelism without it"
        )


def _check_set_up_for(training: Training, gpu: GPU) -> None:
    """Refuse a training set up as on a GPU with bf16 (`memorymark.target_gpu`), sized for
    one without: arguments that could not be made there. Any other pair answers the setup's
    questions (bf16, TF32, a GradScaler) alike."""
    if training.set_up_for in (None, gpu.name):
        return
    try:
        target = gpus.find_gpu(training.set_up_for)
    except gpus.UnknownGPUError:
        return  # a custom GPU: set up and sized for in the same run (--training)
    if target.supports_bf16 and not gpu.supports_bf16:
        raise ValueError(
            f"{training.label} was set up as on the {target.name} (memorymark.target_gpu), "
            f"which has bf16, but is sized for the {gpu.name}, which has none: set it up under "
            f"target_gpu for the {gpu.name}, or size it for the {target.name}"
        )
