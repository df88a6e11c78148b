"""A user's own training code, described by four callables: `memorymark.Training`.

The public, torch-free half of the user's step: what the user hands over (`Training`), the error
the simulation raises for what fake tensors cannot size (`SimulationError`), and `simulating()`,
which lets user code skip what only matters on real data. `memorymark/step/user_step.py` turns a
Training into a `TrainingStep`. Importing this module loads no torch, so `import memorymark`
stays light.

Must not know: how memory is counted, which device runs the step, or which batch sizes are tried.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from memorymark.settings import Settings

OptimizerTakes = Literal["auto", "params", "model"]


class SimulationError(ValueError):
    """The user's step does something fake tensors cannot size: a shape that depends on values
    (`nonzero`, boolean-mask indexing, `unique`, `masked_select`), or a device it cannot run on.
    The message is one line naming the user's file, line and operation, and how to write it
    so it runs."""


_state = threading.local()


def simulating() -> bool:
    """True while this thread runs a step on fake tensors (the simulation), so user code can
    skip what needs real values: `if not mm.simulating(): mask = x[x > 0]`."""
    return getattr(_state, "depth", 0) > 0


def compile_refusal(where: str, how: str | None = None) -> SimulationError:
    """The one line for `torch.compile`, which the simulation does not model yet: `where` it
    was found, and `how` to size without it (by default, compiling behind a flag)."""
    how = how or (
        "compile behind a flag that is off while sizing, e.g. `if not memorymark.simulating(): "
        "model = torch.compile(model)`"
    )
    return SimulationError(
        f"torch.compile is not modelled yet ({where}): size the step uncompiled, so the "
        f"answer is eager mode's (compiled code usually needs less): {how}"
    )


@contextlib.contextmanager
def simulation_scope() -> Iterator[None]:
    """Marks this thread as simulating for the block (the simulated backend enters it)."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


@dataclass(frozen=True, slots=True)
class Training:
    """A user's training, as four callables MemoryMark calls as a training loop would:

    - `model()` returns the `nn.Module` to train, built from its config with random weights
      (never loading real ones: MemoryMark builds it on the meta device, then on fake tensors);
    - `batch(batch_size)` returns one batch, whatever `step` takes (tensors, dicts, tuples);
      make it with torch (`torch.randint`, `torch.zeros`), as values do not change memory;
    - `step(model, batch, optimizer)` runs forward, the loss, backward and the optimizer
      step, as the user's loop does (autocast, clipping, several optimizers included);
    - `optimizer(params)` or `optimizer(model)` returns one optimizer, or a list or tuple of
      them (`optimizer_takes` says which argument: `auto` passes the model when the first
      parameter is named model, module or net, or annotated as a module; else the parameters
      that require grad). None: a step with no optimizer, `step` gets None.

    `name` names it in reports (the model function's name by default). `set_up_for` is the
    GPU its setup ran as on (`target_gpu`), which it must be sized for: the integrations and
    `--training` set it.
    `flush_before_first_step`: the loop empties the CUDA cache once after setting up, before
    its first step (Lightning's `Trainer.fit` does; a plain loop and HF's Trainer do not).
    """

    model: Callable[[], Any]
    batch: Callable[[int], Any]
    step: Callable[[Any, Any, Any], Any]
    optimizer: Callable[[Any], Any] | None = None
    name: str | None = None
    optimizer_takes: OptimizerTakes = "auto"
    set_up_for: str | None = None
    flush_before_first_step: bool = False

    def __post_init__(self) -> None:
        if _is_module(self.model):
            raise ValueError(
                "Training(model=...) must be a function that builds the model (the class, or "
                "lambda: MyModel(config)), not a built one: MemoryMark builds it with no "
                "weights in memory"
            )
        for field in ("model", "batch", "step"):
            if not callable(getattr(self, field)):
                raise ValueError(
                    f"Training({field}=...) must be a function; got "
                    f"{type(getattr(self, field)).__name__}"
                )
        if self.optimizer is not None and not callable(self.optimizer):
            raise ValueError(
                "Training(optimizer=...) must be a function of the parameters or the model; "
                f"got {type(self.optimizer).__name__}"
            )
        if self.optimizer_takes not in ("auto", "params", "model"):
            raise ValueError(
                f"optimizer_takes must be auto, params or model (got {self.optimizer_takes!r})"
            )

    @property
    def label(self) -> str:
        """What reports call this training."""
        if self.name:
            return self.name
        return str(getattr(self.model, "__name__", None) or "training")


def _is_module(value: object) -> bool:
    """True for a built `torch.nn.Module`, asked without importing torch."""
    return any(
        c.__name__ == "Module" and c.__module__.startswith("torch.nn") for c in type(value).__mro__
    )


_BESIDE_A_JOB = ("model", "compile", "activation_memory_budget")
"""Workload settings a training job takes beside its code: `compile` is how the HF
integration passes on `TrainingArguments(torch_compile=True)` (the whole model compiled)."""


def check_settings(settings: Settings) -> None:
    """Refuse (ValueError, one line) settings beside a training job that the job's own code
    says: the model and how it steps (precision, optimizer, LoRA, checkpointing...), and what
    this release cannot yet do with a user's code (many GPUs, a sequence-length search, a
    target batch reached by accumulation)."""
    from memorymark.settings import Workload  # the settings' package, torch-free

    defaults = Workload()
    given = [
        name
        for name in Workload.__dataclass_fields__
        if name not in _BESIDE_A_JOB and getattr(settings.workload, name) != getattr(defaults, name)
    ]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(
            f"{flags} describe{'s' if len(given) == 1 else ''} the model or its step, which "
            "a training job's own code says: set it there (autocast, the optimizer, "
            "checkpointing), not beside it"
        )
    if settings.hardware.dist != "none" or settings.hardware.gpus.strip() != "1":
        raise ValueError(
            "a training job is sized on one GPU for now: drop --dist/--gpus (each rank of a "
            "data-parallel run holds what one GPU does)"
        )
    if settings.search.find != "batch":
        raise ValueError("a training job searches batch sizes only: drop --find")
    if settings.search.target_batch is not None:
        raise ValueError(
            "a training job accumulates in its own step: drop --target-batch, and choose "
            "accumulation from the answer"
        )
