"""The simulated backend: a real training step on fake tensors, with no GPU and no memory.

The model is built on the meta device (outside fake mode, so models that compute Python numbers
from tensors in `__init__` still build), then each parameter and buffer becomes a fake CPU tensor
of the same shape, dtype and strides, keeping tied weights tied. The step then runs under
`FakeTensorMode`: shapes and dtypes flow, nothing is allocated, and the tracker counts the bytes
every storage would take. Where CUDA kernels allocate differently from CPU ones, `cuda_rules`
decides (for the target GPU's compute capability); this module only wires fake tensors in, and
answers the two questions library code asks of tensor values, which fake tensors don't have.

The optimizer phase (clipping, the optimizer step, the GradScaler's update) reads parameters,
gradients and optimizer state, never the batch: its allocations are the same at every batch
size, and it is a third to a half of a simulated step. So it runs, recorded, at the first probe
and, from the next probe on, its recorded memory and work are spliced into the step instead
(`MemoryTracker.splice`): peak, breakdown, timeline, allocator replay and FLOPs come out as if
it ran. State it replaces every step (Adafactor's RMS) is recorded at the second probe, once the
state it frees is the first probe's. `reuse_optimizer_step=False`, or the environment variable
MEMORYMARK_REUSE_OPTIMIZER_STEP=0, runs it at every probe. Real devices always run it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.amp.grad_scaler import OptState

from memorymark import cuda_rules, gpus
from memorymark.accounting.allocator import canonical_frees
from memorymark.accounting.symbolic import Replays, StepRecord
from memorymark.accounting.throughput import RATE_NONE, OpWork, WorkCounter, work_of
from memorymark.accounting.tracker import MemoryTracker, Segment
from memorymark.backends.base import PHASE_CATEGORY, Backend
from memorymark.backends.depth_worker import Recipe
from memorymark.backends.user_code import ReadingFakeMode
from memorymark.cuda_rules.scoped_patch import ScopedPatch
from memorymark.fit import FitPolicy
from memorymark.measurement import DepthReplay, Measurement, ValueRead
from memorymark.settings import Settings
from memorymark.step import compiled, liger
from memorymark.step.catalog import CatalogStep
from memorymark.step.protocol import Phase, TrainingStep
from memorymark.step.user_job import simulation_scope
from memorymark.step.user_step import each_optimizer

if TYPE_CHECKING:
    from memorymark.backends.depth_replay import DepthReplayer


def to_fake(module: nn.Module, fake_mode: FakeTensorMode) -> nn.Module:
    """Replace every parameter and buffer of `module` with a fake tensor, in place."""
    replaced: dict[int, torch.Tensor] = {}

    def fake_like(t: torch.Tensor) -> torch.Tensor:
        # One replacement per original tensor, so weights tied by identity stay tied.
        if id(t) not in replaced:
            with fake_mode:
                fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
            if isinstance(t, nn.Parameter):
                fake = nn.Parameter(fake, requires_grad=t.requires_grad)
            replaced[id(t)] = fake
        return replaced[id(t)]

    for sub in module.modules():
        for name, param in sub._parameters.items():
            if param is not None:  # a Parameter's stand-in is a Parameter
                sub._parameters[name] = cast(nn.Parameter, fake_like(param))
        for name, buffer in sub._buffers.items():
            if buffer is not None:
                sub._buffers[name] = fake_like(buffer)
    return module


def fake_in_place(
    tensors: tuple[torch.Tensor, ...], fake_mode: FakeTensorMode
) -> tuple[torch.Tensor, ...]:
    """Turn each meta tensor of `tensors` into a fake one of its shape, dtype, strides and
    class, in place (`torch.utils.swap_tensors`: whoever holds it, an EMA model or a list,
    now holds the fake), keeping tensors that share storage sharing it. A tensor that cannot
    be swapped (a view, one held by autograd) stays meta. Returns those swapped."""
    groups: dict[int, list[torch.Tensor]] = {}
    for t in tensors:
        if t.is_meta:
            groups.setdefault(t.untyped_storage()._cdata, []).append(t)
    swapped = []
    for members in groups.values():
        with fake_mode:
            flat = torch.empty(members[0].untyped_storage().nbytes(), dtype=torch.uint8)
        for t in members:
            # A second try: on torch 2.14.1 the first fake a group makes can carry a weak
            # reference of fake mode's own, which `swap_tensors` refuses; the next does not.
            for _ in range(2):
                if _swap_for_fake(t, flat, fake_mode):
                    swapped.append(t)
                    break
    return tuple(swapped)


def _swap_for_fake(t: torch.Tensor, flat: torch.Tensor, fake_mode: FakeTensorMode) -> bool:
    with fake_mode:
        # `set_` onto the one storage: not `as_strided`, whose output fake mode holds a weak
        # reference to, which `swap_tensors` refuses.
        fake = torch.empty(0, dtype=t.dtype)
        fake.set_(flat.untyped_storage(), t.storage_offset(), t.shape, t.stride())
    fake.requires_grad_(t.requires_grad)
    if isinstance(t, nn.Parameter):
        # As `nn.Parameter(fake)` marks a tensor subclass (torch/nn/parameter.py), without the
        # detached copy fake mode would hold a weak reference to.
        fake._is_param = True
    try:
        torch.utils.swap_tensors(t, fake)
    except RuntimeError:
        return False
    return True


def _unpacked_sequences(original: object, position_ids: torch.Tensor) -> None:
    # transformers' masking_utils reads the position ids to detect packed sequences; on a fake
    # tensor it can't, assumes packing, and builds a full causal mask (which rules out flash
    # attention). MemoryMark's batches are never packed: answer as real tensors would.
    return None


def _step_without_readback(
    original: object,
    scaler: torch.amp.GradScaler,
    optimizer: torch.optim.Optimizer,
    *args: Any,
    **kwargs: Any,
) -> object:
    # GradScaler.step reads the inf/NaN flag back to the host (`.item()`); a fake tensor has no
    # value. Simulate the step that found none, the one that runs the optimizer and allocates:
    # unscale (its flag and temporaries count, and `update()` reads them), then step.
    if not scaler.is_enabled():
        # A disabled scaler only steps the optimizer, and has no per-optimizer state: one made
        # before the simulation on a machine without CUDA, which PyTorch disabled.
        return optimizer.step(*args, **kwargs)
    # As GradScaler.step does: unscale unless clipping already did (torch/amp/grad_scaler.py).
    if scaler._per_optimizer_states[id(optimizer)]["stage"] is not OptState.UNSCALED:
        scaler.unscale_(optimizer)
    return optimizer.step(*args, **kwargs)


@functools.cache
def _valueless_patches() -> tuple[ScopedPatch, ...]:
    # Built at the first step, not at import: importing transformers takes seconds.
    patches = [ScopedPatch(torch.amp.GradScaler, "step", _step_without_readback)]
    try:
        from transformers import masking_utils
    except ImportError:
        return tuple(patches)
    if hasattr(masking_utils, "find_packed_sequence_indices"):
        patches.append(
            ScopedPatch(masking_utils, "find_packed_sequence_indices", _unpacked_sequences)
        )
    return tuple(patches)


def _reuse_by_default() -> bool:
    """False when MEMORYMARK_REUSE_OPTIMIZER_STEP is 0 (or false, no, off): the escape hatch."""
    value = os.environ.get("MEMORYMARK_REUSE_OPTIMIZER_STEP", "1")
    return value.strip().lower() not in ("0", "false", "no", "off")


class _WorkRecorder:
    """Keeps what each operator adds to a WorkCounter, in order, one entry per operator (zeros
    too, as the tracker logs one operator end each, so a stretch of operators can be cut out),
    and counts it into `counter` when given: a later step adds the very same parts in the very
    same order (adding a zero leaves a sum as it was)."""

    def __init__(self, counter: WorkCounter | None = None) -> None:
        self.counter = counter
        self.ops: list[OpWork] = []

    def count(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        work = work_of(func, args, kwargs, out) or (0, 0, RATE_NONE)
        self.ops.append(work)
        if self.counter is not None:
            self.counter.add(*work)


_STATE_FIRST = (torch.optim.Adam, torch.optim.AdamW)
"""Optimizers whose first step creates all their state before the update (`_state_first`)."""


def target_capability(settings: Settings, gpu: gpus.GPU | None = None) -> tuple[int, int]:
    """Compute capability of the GPU simulated: `gpu`'s, else the named one's, else Ampere's."""
    if gpu is not None:
        return gpu.compute_capability
    if settings.hardware.gpu is not None and settings.hardware.gpu_memory_gib is None:
        return gpus.find_gpu(settings.hardware.gpu).compute_capability
    return gpus.UNKNOWN_COMPUTE_CAPABILITY


class SimBackend(Backend):
    """Simulates the step for a target GPU, judged against that GPU's capacity."""

    name = "sim"
    measured = False
    device = "cpu"
    holds_memory = False
    travels: ClassVar[bool] = True
    """Whether `shallower_recipe` rebuilds this kind of backend whole in another process."""

    def __init__(
        self,
        training_step: TrainingStep,
        *,
        policy: FitPolicy,
        gpu: gpus.GPU | None = None,
        resident_allocations: tuple[int, ...] = (),
        thread_workspace: tuple[int, ...] = (),
        cuda_rules: bool = True,
        reuse_optimizer_step: bool | None = None,
    ) -> None:
        # No tracker budget: fake tensors cost nothing, so a step past the capacity traces to
        # its end and the replay says what it would need.
        super().__init__(
            training_step,
            policy=policy,
            resident_allocations=resident_allocations,
            thread_workspace=thread_workspace,
        )
        # A user's code may hold real tensors and read values: a mode that answers for them.
        user = training_step.user_code
        self._fake_mode = ReadingFakeMode() if user else FakeTensorMode()
        self.compute_capability = target_capability(training_step.settings, gpu)
        """(major, minor) of the GPU whose kernel choices the step imitates."""
        self.cuda_rules = cuda_rules
        """Apply `cuda_rules` (True) or keep CPU's kernels, as the `cpu` backend does (False)."""
        self.reuse_optimizer_step = (
            _reuse_by_default() if reuse_optimizer_step is None else reuse_optimizer_step
        ) and not user  # a user's step calls its optimizers itself, never `run_optimizer`
        """Run the optimizer phase once and splice its record into later probes (True), or run
        it at every probe (False); set it before the first probe. None: on unless
        MEMORYMARK_REUSE_OPTIMIZER_STEP=0."""
        self._kernel_patches: tuple[ScopedPatch, ...] = ()
        """Module-level functions the model's kernels replace while it steps (Liger's RoPE)."""
        self._optimizer_record: tuple[Segment, list[OpWork] | None] | None = None
        """The optimizer phase's memory and work (None: no work counted), once reusable."""
        self._keeping = False
        self._depth: DepthReplayer | None = None
        self.depth_why: str | None = None
        """Why the depth replay does not apply to this step, when it was asked for."""
        self.last_record: StepRecord | None = None
        """What the last probe's traced step left, when records are kept (`keep_records`);
        None after a probe that ran an evaluation pass or failed."""

    @contextlib.contextmanager
    def _step_context(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            stack.enter_context(simulation_scope())
            stack.enter_context(self._user_code("cpu"))
            stack.enter_context(self._fake_mode)
            for patch in _valueless_patches():
                stack.enter_context(patch.active())
            if self.cuda_rules:
                stack.enter_context(cuda_rules.applied(self.compute_capability))
            for patch in self._kernel_patches:
                stack.enter_context(patch.active())
            if self.training_step.settings.workload.compile:
                stack.enter_context(compiled.breaks_recorded())
                stack.enter_context(compiled.dynamo_quiet())
            yield

    @property
    def graph_breaks(self) -> tuple[str, ...]:
        """Where the compiled step's graphs broke, as Dynamo said while compiling (the first
        probe): each region after a break ran eagerly."""
        found = dict.fromkeys(f"{b.where}: {b.reason}" for b in compiled.log().breaks)
        return tuple(found)

    def _build_model(self) -> nn.Module:
        if self.training_step.settings.workload.compile:
            # This model's compiles only, none cached from an earlier model of the same code
            # (Dynamo's recompile limit would turn later ones eager without a word).
            compiled.reset_log()
            torch._dynamo.reset()
        with torch.device("meta"), simulation_scope(), self._user_code("meta"):
            model = self.training_step.build_model(emulate_kernels=True)
        if self.training_step.settings.workload.kernels == "liger":
            self._kernel_patches = liger.rope_patches(model)
        # A user's EMA weights and the like: the same objects, fake from now on.
        fake_in_place(getattr(self.training_step, "alongside", ()), self._fake_mode)
        return to_fake(model, self._fake_mode)

    def _build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer | None:
        optimizer = super()._build_optimizer(model)
        if self.cuda_rules:
            for one in each_optimizer(optimizer):
                cuda_rules.default_to_foreach(one)
        return optimizer

    def _value_reads(self) -> tuple[ValueRead, ...]:
        if isinstance(self._fake_mode, ReadingFakeMode):
            return self._fake_mode.take_reads()
        return ()

    def _prime(
        self, model: nn.Module, optimizer: torch.optim.Optimizer | None, tracker: MemoryTracker
    ) -> None:
        if not self._state_first(optimizer):
            super()._prime(model, optimizer, tracker)
            return

        def record(first_step: Callable[[], None]) -> None:
            # The first step creates the state, then runs the update every later step runs:
            # keep the update as the optimizer phase's record, so no probe has to run it.
            recorder = _WorkRecorder() if self.roofline is not None else None
            tracker.work_counter = recorder
            tracker.start_segment()
            try:
                first_step()
            finally:
                tracker.work_counter = None
            later = tracker.finish_state_segment(PHASE_CATEGORY[Phase.OPTIMIZER])
            if later is not None:
                segment, cut = later
                work = recorder.ops[: cut.start] + recorder.ops[cut.stop :] if recorder else None
                self._optimizer_record = segment, work

        self.training_step.prime_optimizer(model, optimizer, record)

    def _state_first(self, optimizer: torch.optim.Optimizer | None) -> bool:
        """Whether this optimizer's first step makes all its state before its update, the
        update being what every later step runs: Adam and AdamW (torch/optim/adam.py
        `_init_group` creates `step`, `exp_avg` and `exp_avg_sq` before any arithmetic, for the
        foreach, fused and for-loop kernels alike). Not SGD (momentum is cloned inside the
        update), nor a GradScaler's or clipping's extra work around the step."""
        s = self.training_step.settings
        return (
            self.reuse_optimizer_step
            and type(optimizer) in _STATE_FIRST
            and s.workload.max_grad_norm is None
            and not cuda_rules.uses_grad_scaler(s.workload.precision)
        )

    def _run_optimizer(self, optimizer_phase: Callable[[], None]) -> None:
        tracker = self._tracker
        if not self.reuse_optimizer_step or tracker is None:
            optimizer_phase()
            return
        counter = tracker.work_counter
        if self._optimizer_record is not None:
            segment, work = self._optimizer_record
            if (work is None) == (counter is None):
                tracker.splice(segment)
                if isinstance(counter, WorkCounter) and work is not None:
                    counter.add_all(work)
                return
            # Recorded without a throughput estimate and now asked for one (a roofline set
            # after the first probe): record again. (State spliced as replaced, Adafactor's
            # RMS, would then be counted freed twice; no caller sets a roofline that late.)
            self._optimizer_record = None
        recorder = _WorkRecorder(counter) if isinstance(counter, WorkCounter) else None
        tracker.work_counter = recorder or counter
        tracker.start_segment()
        completed = False
        try:
            optimizer_phase()
            completed = True
        finally:
            tracker.work_counter = counter
            recorded = tracker.finish_segment(completed=completed)
        if recorded is not None and (counter is None or recorder is not None):
            self._optimizer_record = recorded, recorder.ops if recorder else None

    # -- the depth replay (memorymark/backends/depth_replay.py) -------------------------------
    def replay_depth(self) -> None:
        """From the first probe on, read the full-depth step off the model built shallower,
        where its config says how (else trace it, and `depth_why` says why)."""
        from memorymark.backends.depth_replay import replayer_for

        found = replayer_for(self)
        self._depth, self.depth_why = (None, found) if isinstance(found, str) else (found, None)

    @property
    def depth_replay(self) -> DepthReplay | None:
        """What the depth replay traced and replayed, or why it fell back to tracing the full
        model; None where it does not apply (not asked for, no layer count, too few blocks to
        gain, the user's own code: the full model is traced, as `depth_why` says)."""
        return self._depth.summary if self._depth is not None else None

    def shallower(self, step: CatalogStep, group_owner: SimBackend | None = None) -> SimBackend:
        """A backend of this one's kind and set-up for `step` (the model built shallower):
        the same GPU kernels, workspaces, fit policy and roofline. `group_owner`: a shallower
        backend already open, whose process group a distributed one shares."""
        backend = type(self)(
            step,
            policy=self.policy,
            resident_allocations=self.resident_allocations,
            thread_workspace=self.thread_workspace,
            cuda_rules=self.cuda_rules,
            reuse_optimizer_step=self.reuse_optimizer_step,
        )
        backend.compute_capability = self.compute_capability
        backend.roofline = self.roofline
        return backend

    def shallower_recipe(self, step: CatalogStep) -> Recipe | None:
        """How another process builds `shallower(step)` (memorymark/backends/depth_worker.py);
        None for a backend that holds more than its constructor says (a pipeline's stages)."""
        if not self.travels:
            return None
        arguments = {
            "policy": self.policy,
            "resident_allocations": self.resident_allocations,
            "thread_workspace": self.thread_workspace,
            "cuda_rules": self.cuda_rules,
            "reuse_optimizer_step": self.reuse_optimizer_step,
        }
        return Recipe(type(self), step, arguments, self.compute_capability, self.roofline)

    def measure(self, batch_size: int) -> Measurement:
        """One step at `batch_size`: read off the model built shallower when the depth replay
        holds, else traced."""
        replayed = self._depth.measure(batch_size) if self._depth is not None else None
        if replayed is None:
            return super().measure(batch_size)
        measurement, record = replayed
        self.last_record = record if self._keeping else None
        return measurement

    # -- the symbolic sweep's replays (memorymark/accounting/symbolic.py) ---------------------
    def keep_records(self) -> Replays:
        """From the next probe on, keep what each traced step leaves (`last_record`), and the
        `Replays` that fit a symbolic step to them and replay it; call before the first probe."""
        self._keeping = True
        return Replays(self.measurement_of, lambda: self.last_record)

    def _prepare(self) -> MemoryTracker:
        tracker = super()._prepare()
        if self._keeping and tracker.category_timeline is None:
            tracker.category_timeline = []  # from the next reset, kept per step
        return tracker

    def _work_counter(self) -> WorkCounter | None:
        counter = super()._work_counter()
        if counter is not None and self._keeping:
            counter.ops = []  # each operator's parts, for the record
        return counter

    def _result(
        self,
        batch_size: int,
        error: str | None,
        seconds: float | None,
        work: WorkCounter | None,
        device_peak: tuple[int, int | None] | None,
        stats: dict[str, int] | None,
        evaluation: Any = None,
        tracked: StepRecord | None = None,
    ) -> Measurement:
        tracker = self._tracker
        self.last_record = None
        # A step with an evaluation pass is not kept: its pass's log is not in the record.
        if self._keeping and error is None and tracked is None and evaluation is None:
            if tracker is not None and tracker.category_timeline is not None:
                first, setup = tracker.baseline_events
                self.last_record = StepRecord(
                    events_first_seq=tracker.events_first_seq,
                    events=canonical_frees(tracker.events, tracker.optimizer_at),
                    baseline_events=(first, canonical_frees(setup, tracker.state_from)),
                    timeline=list(tracker.timeline),
                    categories=list(tracker.category_timeline),
                    start_categories=tracker.start_categories,
                    work=None if work is None or work.ops is None else list(work.ops),
                    unified_bytes=tracker.unified_bytes,
                    quantized_weight_bytes=self._quantized_bytes,
                    state_from=tracker.state_from,
                    optimizer_at=tracker.optimizer_at,
                    operators=None if tracker.operators is None else list(tracker.operators),
                )
        return super()._result(
            batch_size, error, seconds, work, device_peak, stats, evaluation, tracked
        )

    def release(self) -> None:
        self._optimizer_record = None  # it numbers the tracker's allocations, which go too
        if self._depth is not None:
            self._depth.release()
        super().release()
