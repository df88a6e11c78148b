"""When nothing fits: which settings, which GPU, or how many GPUs would make the model train.

For a model that runs out of memory even at batch 1, each candidate change of settings
(memorymark/analyses/changes.py: gradient checkpointing, bf16 weights, LoRA, 8-bit AdamW, their
combination, QLoRA, Liger's fused loss for a causal LM) is simulated at batch 1 on the chosen
GPU; a simulated step traces to its end even past the GPU's capacity, so the answer says how far
off each one is, not only whether it fits.
Then other hardware (memorymark/analyses/hardware.py): the cheapest bigger catalog GPU that
trains batch 1, when no change fits here the change that comes closest on the cheapest bigger
GPU that trains it, and the fewest GPUs of the chosen kind under FSDP (last: for a large model
their steps are most of the search's time). What the states alone
decide is not stepped: the weights, gradients and optimizer state all live at the optimizer
step, so when their bytes (memorymark/backends/states.py) already pass a limit, the change is
reported as needing at least that. Every peak a way out states otherwise is its own simulated
step, with the settings it applies, on the GPU it names. Every step, state count and GPU comes
through the engine's door (memorymark/analyses/bench.py), which the Session hands the search.

`WaysOutSearch` runs these as stages, one per candidate, and hands each way out over the moment
its stage ends (the app and the CLI show them as they come), within a time budget of its own
(memorymark/analyses/budget.py): past it the search stops between two pieces of work, and
`not_finished` names the stages it did not finish. This module composes settings; it never
builds a backend or a step, and never touches a real device; the records (`Fix`, `FitAnswer`)
live in memorymark/ways_out.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import NamedTuple

from memorymark import gpus
from memorymark.analyses import hardware
from memorymark.analyses.bench import Bench
from memorymark.analyses.budget import OutOfTime, TimeBudget
from memorymark.analyses.changes import QLORA, qlora_recipe, settings_changes
from memorymark.backends import selection
from memorymark.measurement import Measurement
from memorymark.settings import Settings
from memorymark.ways_out import FitAnswer, Fix

__all__ = [
    "FitAnswer",
    "Fix",
    "WaysOutSearch",
    "simulated_step",
]

CHECKPOINTED_SEVERAL = f"gradient checkpointing, on {hardware.SEVERAL_GPUS}"
QLORA_SEVERAL = f"{QLORA}, on {hardware.SEVERAL_GPUS}"
CLOSEST_ELSEWHERE = f"the change that comes closest, on {hardware.BIGGER_GPU}"
Stage = tuple[str, Fix | None]
"""One stage of the search as it ends: its label, and the way out it found (None: none)."""


def simulated_step(
    bench: Bench, settings: Settings, gpu: gpus.GPU, batch_size: int = 1
) -> Measurement:
    """One simulated step at `batch_size` for `gpu`: past its capacity, the step still traces
    to its end and reports what it would need (`required_bytes`)."""
    return bench.measure(settings.replace(backend="sim"), gpu, batch_size)


class WaysOutSearch:
    """One search for the ways out, stage by stage: `stages()` yields each stage as it ends,
    with the way out it found, so a live view shows each at once; `answer()` is all of them.

    Its stages are planned when it is made (`planned`: the changes of settings, then a bigger
    GPU, the closest change on one, several GPUs and what follows from them); past
    `time_limit_seconds` it stops before the next state count or step (`stopped_by`), and
    `not_finished` names every planned stage that did not end. `batch_1` is the sweep's own
    simulated step at batch 1 as configured, when it took one: it is not stepped again. Every
    step and state count is `bench`'s; `clock` is a test's fake clock."""

    def __init__(
        self,
        settings: Settings,
        batch_1: Measurement | None = None,
        *,
        bench: Bench,
        time_limit_seconds: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.settings = settings
        self.bench = bench
        self.gpu = bench.simulated_gpu(settings)
        self.budget = TimeBudget(time_limit_seconds=time_limit_seconds, clock=clock)
        self._batch_1 = batch_1 if batch_1 is not None and not batch_1.measured else None
        self._changes = settings_changes(settings, self.gpu)
        self.planned: tuple[str, ...] = (
            *(label for label, _ in self._changes),
            hardware.BIGGER_GPU,
            CLOSEST_ELSEWHERE,
            *(stage.label for stage in _several_gpus_plan(settings, self.gpu)),
        )
        """Every stage's label, in the order they run."""
        self.done: list[str] = []
        """The labels of the stages that ended, in order."""
        self.found: list[Fix] = []
        """Each way out found so far, in the order `answer()` lists them."""
        self.required_bytes: int | None = None
        """What batch 1 needs as configured, once known (the search's first piece of work)."""
        self._counted: dict[Settings, tuple[int, int]] = {}
        self._run: Iterator[Stage] | None = None

    @property
    def stopped_by(self) -> str | None:
        """The limit that ended the search early ("the time limit (60 s)"); None otherwise."""
        return self.budget.stopped_by

    @property
    def not_finished(self) -> tuple[str, ...]:
        """The planned stages that have not ended (all that are left while it runs)."""
        return tuple(label for label in self.planned if label not in self.done)

    def stages(self) -> Iterator[Stage]:
        """Each stage as it ends: (label, the way out it found or None). Resumes where an
        earlier, abandoned iteration stopped; ends early when the budget runs out."""
        if self._run is None:
            self._run = self._stages()
        for label, fix in self._run:
            self.done.append(label)
            if fix is not None:
                self.found.append(fix)
            yield label, fix

    def __iter__(self) -> Iterator[Fix]:
        """Each way out the moment its stage finds it."""
        return (fix for _, fix in self.stages() if fix is not None)

    def answer(self) -> FitAnswer:
        """The whole search (run to its end or its budget): every way out found, in order."""
        for _ in self.stages():
            pass
        return FitAnswer(
            required_bytes=self.required_bytes,
            fixes=tuple(self.found),
            stopped_by=self.stopped_by,
            not_finished=self.not_finished if self.stopped_by else (),
        )

    # -- the stages ---------------------------------------------------------------------------
    def _stages(self) -> Iterator[Stage]:
        try:
            yield from self._all_stages()
        except OutOfTime:
            return  # `stopped_by` says why; `not_finished` what is left

    def _all_stages(self) -> Iterator[Stage]:
        s, gpu = self.settings, self.gpu
        limit = selection.fit_policy(s, gpu).limit_bytes
        base = self._batch_1
        if base is None or base.required_bytes is None:
            base = self._step(s, gpu)
        self.required_bytes = hardware.required(base)
        changes = []
        for label, variant in self._changes:
            fix = self._change(label, variant, limit)
            # A change that needs no less than batch 1 as configured, in live or reserved
            # bytes, is no way out: not offered (other hardware helps by its capacity instead).
            if fix is not None and (
                fix.required_bytes < self.required_bytes
                or (not fix.lower_bound and fix.peak_bytes < base.peak_bytes)
            ):
                changes.append(fix)
                yield label, fix
            else:
                yield label, None
        states, parameters = self._count(s)
        bigger = _bigger_gpu(s, gpu, self._step, states)
        yield hardware.BIGGER_GPU, bigger
        # Before the many-GPU steps (most of the search's time for a large model): the change
        # that comes closest often fits on one bigger GPU (Llama-3.1-70B's QLoRA, an A100).
        closest = None
        if not any(f.fits for f in changes):
            others = [bigger] if bigger is not None else []
            closest = _closest_change_elsewhere(changes, gpu, others, self._step, self._count)
        yield CLOSEST_ELSEWHERE, closest
        yield from _several_gpus_stages(s, gpu, states, parameters, self._step, self._count)

    def _change(self, label: str, variant: Settings, limit: int) -> Fix | None:
        """One change of settings on the chosen GPU: bounded by its states, else stepped; None
        when the model has no such switch (checkpointing on a plain ResNet, ...)."""
        try:
            states = hardware.per_rank_states(variant, self._count(variant)[0])
        except ValueError:
            return None
        if states > limit:
            return _bound(label, variant, self.gpu, states, limit)
        return _fix(label, variant, self.gpu, self._step(variant, self.gpu), limit)

    def _step(self, settings: Settings, gpu: gpus.GPU) -> Measurement:
        """A simulated batch-1 step, within the budget."""
        return self.budget.spend("step", simulated_step, self.bench, settings, gpu)

    def _count(self, settings: Settings) -> tuple[int, int]:
        """The bench's `counted_states`, once per settings (a 70B model takes 10-20 s), within
        the budget."""
        if settings not in self._counted:
            count = self.bench.counted_states
            self._counted[settings] = self.budget.spend("count", count, settings)
        return self._counted[settings]


class _SeveralGpus(NamedTuple):
    """One several-GPU stage: its label, the settings it shards, and whether it counts their
    states itself (QLoRA's 4-bit weights) or takes those of the settings as they are
    (checkpointing changes no state)."""

    label: str
    settings: Settings
    own_states: bool


def _several_gpus_plan(settings: Settings, gpu: gpus.GPU) -> list[_SeveralGpus]:
    """The several-GPU stages these settings take, in order: FSDP over the fewest GPUs of this
    kind as they are; then, each tried when the stage before found only counts too small, with
    gradient checkpointing (sharding leaves activations whole: checkpointing is what lets more
    GPUs help) and QLoRA sharded (the 4-bit base weights are what is left to shard:
    Llama-3.1-70B on 4 x A10, where 72 in fp32 do not train it: docs/cli.md, "When nothing
    fits")."""
    plan = [_SeveralGpus(hardware.SEVERAL_GPUS, settings, own_states=False)]
    if settings.workload.checkpointing != "full":
        on = settings.replace(checkpointing="full")
        plan.append(_SeveralGpus(CHECKPOINTED_SEVERAL, on, own_states=False))
    qlora = qlora_recipe(settings, gpu)
    if qlora is not None and qlora != settings:
        plan.append(_SeveralGpus(QLORA_SEVERAL, qlora, own_states=True))
    return plan


def _several_gpus_stages(
    settings: Settings,
    gpu: gpus.GPU,
    states: int,
    parameters: int,
    step: hardware.Step,
    count: Callable[[Settings], tuple[int, int]],
) -> Iterator[Stage]:
    """Each stage of `_several_gpus_plan`, with the way out it found or None; `states` and
    `parameters` are the settings' as they are."""
    found: Fix | None = None
    for n, stage in enumerate(_several_gpus_plan(settings, gpu)):
        if n and (found is None or found.fits):
            found = None  # the stage before found no count, or one that trains it already
        else:
            found = _fewest_gpus(stage, gpu, step, count, (states, parameters))
        yield stage.label, found


def _fewest_gpus(
    stage: _SeveralGpus,
    gpu: gpus.GPU,
    step: hardware.Step,
    count: Callable[[Settings], tuple[int, int]],
    as_is: tuple[int, int],
) -> Fix | None:
    try:
        states, parameters = count(stage.settings) if stage.own_states else as_is
        return hardware.fewest_gpus(stage.settings, gpu, step, states, parameters, stage.label)
    except ValueError:
        return None  # a switch this model does not have (checkpointing a plain ResNet)


def _bigger_gpu(settings: Settings, gpu: gpus.GPU, step: hardware.Step, states: int) -> Fix | None:
    """The cheapest bigger GPU that fits, or, when the states alone overflow the biggest, that
    bound on it; None when neither."""
    cheapest = hardware.cheapest_gpu(settings, gpu, step, states)
    if cheapest is not None:
        return cheapest
    biggest = max(gpus.CATALOG, key=lambda g: g.usable_bytes)
    on_it = settings.replace(gpu=biggest.name, gpu_memory_gib=None)
    limit = hardware.limit_bytes(on_it, biggest)
    # A rank's share: 405B's 3,024 GiB over 80 FSDP ranks is 38 GiB, no bound past an H200.
    share = hardware.per_rank_states(settings, states)
    if biggest.usable_bytes > gpu.usable_bytes and share > limit:
        return replace(_bound(hardware.BIGGER_GPU, on_it, biggest, share, limit), hardware=True)
    return None


def _closest_change_elsewhere(
    changes: list[Fix],
    gpu: gpus.GPU,
    others: list[Fix],
    step: hardware.Step,
    count: Callable[[Settings], tuple[int, int]],
) -> Fix | None:
    """The change that needs least here, on the cheapest bigger GPU where it fits: offered when
    that GPU is cheaper than the one the unchanged settings need (or none does)."""
    if not changes:
        return None
    closest = min(changes, key=lambda f: f.required_bytes)
    # The model's whole states (`count` keeps them: the change's were counted already);
    # cheapest_gpu takes a rank's share.
    states = count(closest.settings)[0]
    label = f"{closest.label}, on {hardware.BIGGER_GPU}"
    found = hardware.cheapest_gpu(closest.settings, gpu, step, states, label)
    unchanged = next((f for f in others if f.gpus == 1 and f.fits), None)
    if found is None or (
        unchanged is not None and unchanged.gpu.usd_per_hour <= found.gpu.usd_per_hour
    ):
        return None
    return found


def _bound(label: str, settings: Settings, gpu: gpus.GPU, states: int, limit: int) -> Fix:
    return Fix(
        label=label,
        settings=settings,
        gpu=gpu,
        peak_bytes=states,
        required_bytes=states,
        limit_bytes=limit,
        lower_bound=True,
    )


def _fix(label: str, settings: Settings, gpu: gpus.GPU, m: Measurement, limit: int) -> Fix:
    return Fix(
        label=label,
        settings=settings,
        gpu=gpu,
        peak_bytes=m.peak_bytes,
        required_bytes=hardware.required(m),
        limit_bytes=limit,
        samples_per_second=m.samples_per_second if hardware.required(m) <= limit else None,
    )
