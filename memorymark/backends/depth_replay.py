"""The simulated backend's depth replay: a deep model's step read off the same model built with
a few blocks (memorymark/accounting/depth.py), so a 70B model's step costs what 5 blocks cost.

At the first batch size it traces the model built at four depths a period apart (the depths of
`LayerPlan.depths`): the first two align the step's logs, the next two place the repeating
stretches, and the fourth checks the whole record entry by entry. At every other batch size it
traces the middle two and reads the full depth off them through the structure found. Each depth
is a backend of its own, kept for the sweep (its model built once, its optimizer step recorded
once), so the batch replay (memorymark/search/symbolic.py) sees full-depth steps as if traced.
Half the depths step in a second process (memorymark/backends/depth_worker.py) while this
one steps the others: they share nothing, and a 2-core machine traces both at once.
Wherever the structure is not found, a figure disagrees, or a shallower step fails, it falls
back for good: the full model is traced from then on and `fallback` says why (a worker that dies
hands its depths back to this process instead). A pipeline rank's stages replay the same way:
its step built at k blocks a stage (`replayer_for`). This module knows nothing about search,
reports or the UI.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, cast

from memorymark.accounting.depth import DepthStep, DepthStructure
from memorymark.accounting.symbolic import StepRecord
from memorymark.backends import depth_worker
from memorymark.backends.depth_worker import Recipe, RemoteShallower
from memorymark.limits import one_line
from memorymark.measurement import DepthReplay, Measurement
from memorymark.models.depth import LayerPlan
from memorymark.settings import Settings
from memorymark.step.catalog import CatalogStep
from memorymark.step.pipeline import PipelineStep
from memorymark.step.protocol import TrainingStep


class ShallowerBackend(Protocol):
    """What the replay asks of a simulated backend (memorymark/backends/sim.py `SimBackend`,
    which holds the replay: named here, not imported)."""

    training_step: TrainingStep
    last_record: StepRecord | None

    def measure(self, batch_size: int) -> Measurement: ...

    def measurement_of(self, batch_size: int, record: StepRecord) -> Measurement: ...

    def shallower(self, step: TrainingStep, group_owner: Any = None) -> ShallowerBackend: ...

    def shallower_recipe(self, step: TrainingStep) -> Recipe | None: ...

    def keep_records(self) -> Any: ...

    def release(self) -> None: ...


_STRUCTURES: dict[tuple[Any, ...], list[DepthStructure]] = {}
"""Structures found in this process, by what decides them (`_structure_key`)."""
_KEPT_STEPS = 64
"""Most steps whose structures are kept (a sweep opens a few dozen backends at most)."""
_REMOTE = slice(1, None, 2)
"""The depths (of `LayerPlan.depths`) the depth worker traces: the second and fourth, so the
two a fitted structure steps at every batch split one and one, and a search's four two and two
with the blocks near even (2 + 4 here, 3 + 5 there)."""


def _structure_key(backend: ShallowerBackend) -> tuple[Any, ...]:
    """What decides a step's structure: the step (what is trained and how), the kind of
    backend and how the model is spread. Not the GPU count (it sizes the shards), the batch, or
    the GPU's kernels: each structure is checked against the steps it is fitted to (their
    allocations, frees and operators at two depths) before a replay reads it, so a structure
    another GPU's kernels do not follow is passed over and one is found for them. (The ways out
    of a 70B model step QLoRA on an L40S, then an A100: one structure serves both.)"""
    s = backend.training_step.settings
    hw = s.hardware
    return (
        s.workload,
        type(backend).__name__,
        hw.dist,
        hw.offload,
        hw.mp_policy,
        (hw.tp, hw.cp, hw.pp, hw.virtual_stages, hw.microbatches, hw.pp_schedule),
        getattr(backend.training_step, "rank", None),  # a pipeline rank holds its own stages
    )


StepAt = Callable[[Settings, int], Any]
"""The backend's training step for `settings` with its model built at a depth (blocks)."""


def _catalog_step_at(settings: Settings, depth: int) -> CatalogStep:
    return CatalogStep(settings, layers=depth)


class DepthReplayer:
    """Full-depth steps of `backend`'s model, read off shallower builds of it. `plan` counts
    the blocks `step_at` builds (a pipeline stage's: `replayer_for`)."""

    def __init__(
        self, backend: ShallowerBackend, plan: LayerPlan, step_at: StepAt = _catalog_step_at
    ) -> None:
        self._backend = backend
        """The full-depth backend: it judges the steps replayed, and traces them on a fallback."""
        self.plan = plan
        self._step_at = step_at
        self.fallback: str | None = None
        """Why the full model is traced instead; None while the replay holds."""
        self.traced_steps = 0
        self.replayed_steps = 0
        self._depths_traced: set[int] = set()
        self._variants: dict[int, ShallowerBackend | RemoteShallower] = {}
        self._steps: dict[int, int] = {}
        """Steps each shallower backend has run."""
        if len(_STRUCTURES) >= _KEPT_STEPS:
            _STRUCTURES.clear()
        self._structures = _STRUCTURES.setdefault(_structure_key(backend), [])
        """Every structure found so far for this step (in any backend of this process: the
        ways out, GPU counts and lengths tried each open one), the latest first: batch 1's step
        can run operators larger ones do not, and an FSDP model's first step some no later one
        does."""

    @property
    def summary(self) -> DepthReplay:
        """What was traced and what replayed, for the report."""
        traced = tuple(sorted(self._depths_traced)) if self.fallback is None else ()
        return DepthReplay(
            self.plan.layers, traced, self.traced_steps, self.replayed_steps, self.fallback
        )

    def measure(self, batch_size: int) -> tuple[Measurement, StepRecord] | None:
        """The full-depth step at `batch_size` and its record, read off shallower ones; None
        once the replay has fallen back (the caller traces the full model)."""
        if self.fallback is not None:
            return None
        try:
            record, first = self._record(batch_size)
        except Exception as exc:  # noqa: BLE001 - the full model is traced instead: what is real raises there
            record = f"a shallower step failed: {one_line(exc, 200)}"
        if isinstance(record, str):
            self._fall_back(record)
            return None
        measurement = self._backend.measurement_of(batch_size, record)
        self.replayed_steps += 1
        # Traced as far as a batch search can tell (it fits its polynomials through it), and
        # what autocast ran is what the shallower step ran.
        replayed = dataclasses.replace(
            measurement, replayed=False, autocast_dtypes=first.autocast_dtypes
        )
        return replayed, record

    def release(self) -> None:
        """Release every shallower backend (the first opened, which may hold a process group
        the others share, last). Each sets up afresh at its next step, a first step again (a
        pipeline's stages are released after every probe: their process group is the next
        rank's)."""
        for depth in sorted(self._variants, reverse=True):
            self._variants[depth].release()
        self._steps.clear()

    def _record(self, batch_size: int) -> tuple[StepRecord | str, Measurement]:
        """The full-depth record at `batch_size` (or why there is none) and a shallower step's
        measurement."""
        depths = self.plan.depths()
        have: dict[int, tuple[StepRecord, Measurement]] = {}
        if self._structures:
            traced, first = self._traced(depths[1:3], batch_size)
            if isinstance(traced, str):
                return traced, first
            for structure in self._structures:
                fitted = DepthStep.fit(
                    structure,
                    traced[depths[1]],
                    traced[depths[2]],
                    base=depths[0],
                    period=self.plan.period,
                )
                if not isinstance(fitted, str):
                    return self._at_full_depth(fitted), first
            # No structure found before holds at this batch (batch 1 runs operators larger
            # ones do not): these two steps start the search for one.
            have = {d: (traced[d], first) for d in depths[1:3]}
        traced, first = self._traced(depths, batch_size, have)
        if isinstance(traced, str):
            return traced, first
        found = DepthStructure.found([traced[d] for d in depths])
        if isinstance(found, str):
            return found, first
        fitted = DepthStep.fit(
            found, traced[depths[1]], traced[depths[2]], base=depths[0], period=self.plan.period
        )
        if isinstance(fitted, str):
            return fitted, first
        why = fitted.disagreement(depths[3], traced[depths[3]])
        if why is not None:
            return f"the step at {depths[3]} blocks differs from its replay: {why}", first
        self._structures.insert(0, found)
        return self._at_full_depth(fitted), first

    def _at_full_depth(self, fitted: DepthStep) -> StepRecord | str:
        record = fitted.at(self.plan.layers)
        if record is None:
            return f"no step at {self.plan.layers} blocks: a figure would be negative there"
        return record

    def _traced(
        self,
        depths: tuple[int, ...],
        batch_size: int,
        have: dict[int, tuple[StepRecord, Measurement]] | None = None,
    ) -> tuple[dict[int, StepRecord] | str, Measurement]:
        """The records of the model built at each of `depths`, traced at `batch_size`, and the
        first one's measurement; or why one left none. `have` holds steps just traced at this
        batch (a depth's latest), kept where they line up with the others. Depths that live in
        the depth worker step there while this process steps the rest."""
        have = have or {}
        # Steps are aligned only between backends that have run as many: a first step can run
        # operators no later one does (FSDP's lazy initialisation). One that ran fewer (a depth
        # traced only to find a structure) catches up first; a step in `have` is already the
        # step the others are brought to, or is traced again.
        target = max(self._steps.get(d, 0) + (d not in have) for d in depths)
        todo = [d for d in depths if not (d in have and self._steps.get(d) == target)]
        variants = {d: self._variant(d) for d in todo}
        remote = [d for d in todo if isinstance(variants[d], RemoteShallower)]
        for depth in remote:
            for _ in range(target - self._steps.get(depth, 0)):
                cast(RemoteShallower, variants[depth]).begin(batch_size)
        stepped: dict[int, tuple[Measurement, StepRecord | None]] = {}
        try:
            for depth in (d for d in todo if d not in remote):
                backend = variants[depth]
                for _ in range(target - 1 - self._steps.get(depth, 0)):
                    backend.measure(batch_size)
                    self.traced_steps += 1
                stepped[depth] = backend.measure(batch_size), backend.last_record
                self.traced_steps += 1
                self._steps[depth] = target
        finally:  # every step asked of the worker is collected, whatever happened here
            failed = None
            for depth in remote:
                backend = cast(RemoteShallower, variants[depth])
                try:
                    for _ in range(target - 1 - self._steps.get(depth, 0)):
                        backend.finish()
                        self.traced_steps += 1
                    stepped[depth] = backend.finish(), backend.last_record
                    self.traced_steps += 1
                    self._steps[depth] = target
                except RuntimeError as exc:
                    failed = failed or exc
        if failed is not None:
            if not self._worker_lost():
                raise failed
            # The worker died: its depths are traced here from their first step.
            return self._traced(depths, batch_size, have)
        records: dict[int, StepRecord] = {}
        first: Measurement | None = None
        for depth in depths:
            if depth not in stepped:
                records[depth], measurement = have[depth]
                first = first or measurement
                continue
            measurement, record = stepped[depth]
            self._depths_traced.add(depth)
            first = first or measurement
            if record is None:
                why = measurement.error or "it ran an evaluation pass, whose log is not kept"
                return f"the step at {depth} blocks left no record ({why})", first
            records[depth] = record
        assert first is not None
        return records, first

    def _worker_lost(self) -> bool:
        """Whether the depth worker is gone; if so its depths are dropped, to be built here."""
        gone = [d for d, v in self._variants.items() if isinstance(v, RemoteShallower)]
        pool = depth_worker.worker()
        if not gone or pool is not None:
            return False
        for depth in gone:
            del self._variants[depth]
            self._steps.pop(depth, None)
        return True

    def _variant(self, depth: int) -> ShallowerBackend | RemoteShallower:
        """The backend of the model built with `depth` blocks, as the full one is set up (its
        GPU's kernels, workspaces, roofline, and the settings it steps now: a sequence-length
        search changes them between probes): in the depth worker for half the depths traced
        (`_REMOTE`), where one serves, else here."""
        full = self._backend
        settings = full.training_step.settings
        variant = self._variants.get(depth)
        if variant is None:
            step = self._step_at(settings, depth)
            variant = self._remote(depth, step) or self._local(step)
            self._variants[depth] = variant
        elif variant.training_step.settings != settings:
            variant.training_step = self._step_at(settings, depth)
        return variant

    def _local(self, step: TrainingStep) -> ShallowerBackend:
        local = [v for v in self._variants.values() if not isinstance(v, RemoteShallower)]
        owner = local[0] if local else None  # the first opened holds the process group
        variant = self._backend.shallower(step, group_owner=owner)
        variant.keep_records()
        return variant

    def _remote(self, depth: int, step: TrainingStep) -> RemoteShallower | None:
        if depth not in self.plan.depths()[_REMOTE]:
            return None
        recipe = self._backend.shallower_recipe(step)
        pool = depth_worker.worker() if recipe is not None else None
        if pool is None or recipe is None:
            return None
        remote = [v for v in self._variants.values() if isinstance(v, RemoteShallower)]
        return RemoteShallower(pool, recipe, remote[0] if remote else None)

    def _fall_back(self, why: str) -> None:
        """Trace the full model from now on, saying why; the shallower backends go (a process
        group they hold must be free for the full model's)."""
        self.fallback = why
        self.release()
        self._variants.clear()


def replayer_for(backend: Any) -> DepthReplayer | str:
    """A depth replayer for `backend`'s step, or why its depth is traced in full."""
    from memorymark import models
    from memorymark.models import depth

    step = backend.training_step
    stage = step if isinstance(step, PipelineStep) else None
    if stage is not None:
        step = stage.catalog
    if not isinstance(step, CatalogStep):
        return "your own training code is traced as written"
    config = models.config_of(step.entry)
    if config is None:
        return f"{step.entry.display_name} is built by its library, with no config to deepen"
    plan = depth.layer_plan(config, step.settings.workload.checkpoint_every)
    if isinstance(plan, str):
        return plan
    step_at: StepAt = _catalog_step_at
    if stage is not None:
        found = _stage_plan(plan, stage.n_stages)
        if isinstance(found, str):
            return found
        plan, step_at = found, _stage_step_at(stage)
    if not plan.worth_replaying():
        traced = plan.depths()
        each = " a stage" if stage is not None else ""
        return (
            f"{plan.layers} blocks{each} are too few to gain: the replay traces {traced[1]} "
            f"and {traced[2]} blocks{each} at each batch size"
        )
    return DepthReplayer(backend, plan, step_at)


def _stage_plan(plan: LayerPlan, stages: int) -> LayerPlan | str:
    """The depth of each of a pipeline's `stages` (pp x virtual stages, the model's blocks split
    evenly, as `memorymark/step/pipeline.py` splits them), or why a stage is traced in full. A
    model built with k blocks a stage is split into stages of k blocks: the same stage, at
    depth k. Only where every block is alike: a layer pattern or every K-th block checkpointed
    puts other blocks in each stage of a shallower build."""
    if plan.period != 1 or plan.prefix:
        return "its blocks follow a pattern, which a pipeline stage's shallower builds would not"
    if plan.layers % stages:
        return f"its {plan.layers} blocks do not split evenly into {stages} pipeline stages"
    return dataclasses.replace(plan, layers=plan.layers // stages)


def _stage_step_at(stage: PipelineStep) -> StepAt:
    """Pipeline rank `stage.rank`'s step with each of its stages built at a depth: the model
    built with that many blocks a stage."""

    def step_at(settings: Settings, depth: int) -> PipelineStep:
        return dataclasses.replace(
            stage, settings=settings, layers=depth * stage.n_stages, group=None
        )

    return step_at
