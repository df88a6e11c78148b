"""The seam between a training step and everything that measures it: one small protocol.

Backends, search and report take any object that follows `TrainingStep`: build the model, build
its optimizer, make a batch of size N, prime the optimizer state, run one loop step; and,
optionally (a `run_eval` method, see `evaluates`), run an evaluation pass between steps. The
catalog's step (memorymark/step/catalog.py, built from `Settings`) is one implementation; a
user's own training code is meant to be another, run unchanged under the same CUDA rules,
allocator replay and fit policy.

Must not know: how memory is counted, which device the step runs on, or which batch sizes are
tried. It holds types only and imports torch for them alone.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from memorymark.settings import Settings


class Phase(Enum):
    """The parts of a step, in the order it runs them; reported through `on_phase`."""

    FORWARD = "forward"
    """Forward pass and loss of one micro-batch."""
    LOGITS = "logits"
    """The output layer and the loss of a causal LM: from the end of its decoder to the end of
    forward (the vocabulary-sized logits and the loss's copies of them)."""
    BACKWARD = "backward"
    """Its backward pass, gradients adding up."""
    OPTIMIZER = "optimizer"
    """Clipping (when asked), the optimizer step and the GradScaler's update: over parameters,
    gradients and optimizer state only, whatever the batch size."""


OnPhase = Callable[[Phase], None]
RunOptimizer = Callable[[Callable[[], None]], None]
"""Given the optimizer phase as a function of no arguments, runs it (or stands in for it)."""


def no_phase(_: Phase) -> None:
    """The default `on_phase`: nobody listens."""


def run_now(optimizer_phase: Callable[[], None]) -> None:
    """The default `run_optimizer`: run the optimizer phase as it is."""
    optimizer_phase()


class TrainingStep(Protocol):
    """What a backend needs of a training step. The step is device-agnostic: the backend
    chooses the device (a context `torch.device`, or fake tensors) and the step follows it.

    `settings` are the choices the step follows (precision, accumulation, quantization,
    paging, distribution): the backends read them to account for what the step cannot tell.
    """

    @property
    def settings(self) -> Settings:
        """The choices the step follows."""
        ...

    @property
    def user_code(self) -> bool:
        """True when the step runs code MemoryMark did not write (`memorymark.Training`): the
        backends then answer its value reads and map its `cuda` devices onto theirs."""
        ...

    def build_model(self, *, emulate_kernels: bool = False) -> nn.Module:
        """The model with random weights on the current default device. `emulate_kernels`
        (the simulation) stands in for CUDA-only kernels with what they allocate."""
        ...

    def build_optimizer(self, model: nn.Module) -> Any:
        """The optimizer over the parameters that train (an `Optimizer`, or an object with
        `state`, `step()` and `zero_grad()` standing for several), or None for a forward-only
        step."""
        ...

    def make_batch(self, batch_size: int, device: torch.device | str) -> Any:
        """One micro-batch of `batch_size` samples on `device`, labels included."""
        ...

    def prime_optimizer(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        run_step: RunOptimizer = run_now,
    ) -> None:
        """Create the optimizer's state (what every step after the first carries)."""
        ...

    def run_step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        batch_size: int,
        device: torch.device | str,
        on_phase: OnPhase = no_phase,
        run_optimizer: RunOptimizer = run_now,
    ) -> None:
        """One loop step at micro-batch `batch_size`: accumulation, clipping, the optimizer
        step (through `run_optimizer`). Raises the device's OOM error if it does not fit."""
        ...


class EvaluatingStep(TrainingStep, Protocol):
    """A step that also runs an evaluation pass between training steps (the catalog's, when
    its settings name an eval batch). Optional: a user's own step has none, and backends ask
    with `evaluates`."""

    def run_eval(
        self,
        model: nn.Module,
        batch_size: int,
        device: torch.device | str,
        on_phase: OnPhase = no_phase,
    ) -> None:
        """The evaluation pass at eval batch `batch_size`, with the training state resident:
        `model.eval()`, no_grad, forward with labels, the predictions kept as the loop keeps
        them, then dropped; the model back in training mode. Raises the device's OOM error if
        it does not fit."""
        ...


def evaluates(step: TrainingStep) -> int | None:
    """The eval batch of the evaluation pass `step` runs between training steps, or None when
    it runs none (no `run_eval`, or settings that ask for none).

    The pass is optional (a user's own step has none): a step that runs one has
    `run_eval(model, batch_size, device, on_phase)`, the pass at eval batch `batch_size` with the
    training state resident: `model.eval()`, no_grad, forward with labels, the predictions kept
    as the loop keeps them, then dropped; the model back in training mode. It raises the device's
    OOM error if it does not fit (the catalog's step, when its settings name an eval batch)."""
    if not callable(getattr(step, "run_eval", None)):
        return None
    return step.settings.workload.eval_batch
