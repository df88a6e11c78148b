"""A user's own training code as a `TrainingStep`: `memorymark.Training` run as a loop runs it.

`UserStep` calls the user's four functions where the catalog's step runs its own: the model
function builds the model (on the meta device under the simulation, which then makes it fake),
the optimizer function builds one optimizer or several, the batch function makes each batch, and
the step function runs forward, loss, backward and the optimizer step exactly as written.
MemoryMark adds only what a loop adds around a step: `model.train()`, optimizer state primed as
after a first step, gradients freed after it. What the model function makes and keeps besides
the model (EMA weights) is `alongside`, for the backends to hold as weights; a compiled model is
refused while simulating (`compiled_part`). It hears where the step is (forward, backward,
optimizer) from `backward()` and the optimizers' step hooks, to label what each part allocates.

Must not know: how memory is counted, which device runs the step (the backend decides, and maps
the user's `cuda` onto it), or which batch sizes are tried.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import inspect
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from memorymark.cuda_rules.scoped_patch import ScopedPatch
from memorymark.settings import Settings
from memorymark.step import compiled as compiled_step
from memorymark.step.protocol import OnPhase, Phase, RunOptimizer, no_phase, run_now
from memorymark.step.user_job import Training, compile_refusal, simulating

_MODEL_PARAMETER_NAMES = ("model", "module", "net", "network")
"""First-parameter names that make `optimizer_takes="auto"` pass the model, not parameters."""

_listening = threading.local()


def compiled_part(module: Any) -> str | None:
    """Where `module` runs `torch.compile`d code, in words ("the model is compiled"), or None:
    a compiled module (`torch.compile(model)`, an `OptimizedModule`) or submodule, a module
    compiled in place (`model.compile()`), or a compiled `forward` or `training_step` set on
    it (Lightning's `from_compiled`)."""
    if "torch._dynamo" not in sys.modules or not isinstance(module, nn.Module):
        return None  # nothing was ever compiled in this process
    for name, sub in module.named_modules(remove_duplicate=True):
        what = f"its submodule {name!r}" if name else "the model"
        if type(sub).__name__ == "OptimizedModule" and hasattr(sub, "_orig_mod"):
            return f"{what} is torch.compile'd"
        if sub.__dict__.get("_compiled_call_impl") is not None:
            return f"{what} is compiled in place (.compile())"
        for method in ("forward", "training_step"):
            if hasattr(sub.__dict__.get(method), "_torchdynamo_orig_callable"):
                return f"{what}'s {method} is compiled"
    return None


def copy_module(module: nn.Module) -> nn.Module:
    """A copy of an already-built `module` on the current default device, the original left as
    it is: on the meta device (the simulation) no byte is copied, every parameter and buffer
    becomes a meta tensor of its shape, dtype and `requires_grad`; elsewhere a deep copy moved
    there. For integrations that size a model the user has already built."""
    device = torch.empty(()).device
    if device.type != "meta":
        return copy.deepcopy(module).to(device)
    memo: dict[int, Any] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        if id(tensor) in memo:
            continue
        meta = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
        if isinstance(tensor, nn.Parameter):
            meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = meta  # deepcopy reuses it, so tied weights stay tied
    return copy.deepcopy(module, memo)


class Optimizers:
    """Several optimizers (a GAN's generator and discriminator) as one for the backends, which
    prime and count optimizer state; the user's step gets them back as it returned them."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer], returned: Any) -> None:
        self.optimizers = tuple(optimizers)
        self.returned = returned
        """What the user's optimizer function returned (a list or a tuple), for their step."""

    @property
    def state(self) -> dict[Any, Any]:
        """Every optimizer's per-parameter state."""
        merged: dict[Any, Any] = {}
        for optimizer in self.optimizers:
            merged.update(optimizer.state)
        return merged

    def step(self) -> None:
        """Step each optimizer (priming their state)."""
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear each optimizer's gradients."""
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)


def each_optimizer(optimizer: Any) -> tuple[torch.optim.Optimizer, ...]:
    """The optimizers behind what `build_optimizer` returned (none, one, or `Optimizers`)."""
    if optimizer is None:
        return ()
    if isinstance(optimizer, Optimizers):
        return optimizer.optimizers
    return (optimizer,)


def _backward(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # The step calls backward itself: what it allocates until the next forward is backward's.
    on_phase = getattr(_listening, "on_phase", no_phase)
    on_phase(Phase.BACKWARD)
    try:
        return original(*args, **kwargs)
    finally:
        # Accumulating steps run forward again after backward; a clipping call after the last
        # one is counted as forward's (a few parameter-sized temporaries at most).
        on_phase(Phase.FORWARD)


_BACKWARD = ScopedPatch(torch.autograd, "backward", _backward)
"""`Tensor.backward()` calls `torch.autograd.backward` (torch/_tensor.py), as do loops that call
it directly."""


class UserStep:
    """A `Training` as a `TrainingStep`. `settings` hold the search and hardware the user chose;
    what they would say of the model and step (precision, optimizer, LoRA...) stays at its
    defaults, since the user's code says it (the Session checks)."""

    user_code = True
    """The step runs code MemoryMark did not write: the simulation answers its value reads and
    maps its `cuda` devices and autocast onto the simulated GPU."""

    def __init__(self, training: Training, settings: Settings) -> None:
        self.training = training
        self.settings = settings
        self.alongside: tuple[torch.Tensor, ...] = ()
        """Tensors the model function made on the model's device besides the model, kept
        after it returned (EMA weights): resident for the whole run, as the model is."""

    @property
    def flushes_before_first_step(self) -> bool:
        """Whether the user's loop empties the cache after setting up (the Training says)."""
        return self.training.flush_before_first_step

    def build_model(self, *, emulate_kernels: bool = False) -> nn.Module:
        """The user's model, on the current default device (meta under the simulation).
        What else the model function made on that device and keeps (an EMA copy of the
        model, `AveragedModel(model)`) is `alongside`."""
        device = torch.empty(()).device
        with _kept(device) as kept:
            model = self.training.model()
        if not isinstance(model, nn.Module):
            raise ValueError(
                f"Training(model=...) must return a torch.nn.Module; "
                f"{self.training.label} returned {type(model).__name__}"
            )
        self.alongside = _besides(model, kept)
        compiled = compiled_part(model) if simulating() else None
        if compiled is not None:
            raise compile_refusal(f"{compiled}, as Training(model=...) returns it")
        if self.settings.workload.compile:
            # As Trainer(torch_compile=True) compiles it: the whole model.
            backend = compiled_step.simulated_backend() if simulating() else "inductor"
            compiled_step.compile_model(model, backend, whole=True)
        return model

    def build_optimizer(self, model: nn.Module) -> Any:
        """The user's optimizer(s) over `model`: one optimizer, `Optimizers` for several, or
        None when the Training has no optimizer function."""
        make = self.training.optimizer
        if make is None:
            return None
        if self._takes_model(make):
            built = make(model)
        else:
            built = make([p for p in model.parameters() if p.requires_grad])
        if isinstance(built, torch.optim.Optimizer):
            return built
        if isinstance(built, (list, tuple)) and built:
            if all(isinstance(o, torch.optim.Optimizer) for o in built):
                return Optimizers(built, built)
        raise ValueError(
            "Training(optimizer=...) must return a torch.optim.Optimizer or a list of them; "
            f"got {type(built).__name__}"
        )

    def _takes_model(self, make: Callable[[Any], Any]) -> bool:
        takes = self.training.optimizer_takes
        if takes != "auto":
            return takes == "model"
        try:
            parameters = list(inspect.signature(make).parameters.values())
        except (TypeError, ValueError):  # a builtin or a C callable: no signature to read
            return False
        if not parameters:
            return False
        first = parameters[0]
        annotation = first.annotation
        if isinstance(annotation, type) and issubclass(annotation, nn.Module):
            return True
        if isinstance(annotation, str) and annotation.split(".")[-1] in ("Module", "nn.Module"):
            return True
        return first.name in _MODEL_PARAMETER_NAMES

    def make_batch(self, batch_size: int, device: torch.device | str) -> Any:
        """The user's batch of `batch_size`, every tensor in it on `device`. Under the
        simulation a real tensor (made with numpy, or by a data loader) becomes a fake one of
        its shape and dtype, so its bytes count; its values are zeros, as the catalog's are."""
        with torch.device(device):
            batch = self.training.batch(batch_size)
        return tree_map_only(torch.Tensor, lambda t: _on_device(t, device), batch)

    def prime_optimizer(
        self,
        model: nn.Module,
        optimizer: Any,
        run_step: RunOptimizer = run_now,
    ) -> None:
        """Create each optimizer's state with zero gradients, as after a first step."""
        for one in each_optimizer(optimizer):
            for group in one.param_groups:
                for p in group["params"]:
                    if p.requires_grad and p.grad is None:
                        p.grad = torch.zeros_like(p)
            run_step(one.step)
            one.zero_grad(set_to_none=True)

    def run_step(
        self,
        model: nn.Module,
        optimizer: Any,
        batch_size: int,
        device: torch.device | str,
        on_phase: OnPhase = no_phase,
        run_optimizer: RunOptimizer = run_now,
    ) -> None:
        """The user's step at `batch_size`, as written. `run_optimizer` is not used: the
        user's step calls its optimizers itself."""
        model.train()
        on_phase(Phase.FORWARD)
        batch = self.make_batch(batch_size, device)
        handed = optimizer.returned if isinstance(optimizer, Optimizers) else optimizer
        try:
            with self._phases(on_phase, each_optimizer(optimizer)):
                self.training.step(model, batch, handed)
        finally:
            del batch
            # As the loop's next zero_grad(set_to_none=True) would; after an OOM it also drops
            # partial gradients, so the next probe starts from the same baseline.
            model.zero_grad(set_to_none=True)

    @contextlib.contextmanager
    def _phases(
        self, on_phase: OnPhase, optimizers: tuple[torch.optim.Optimizer, ...]
    ) -> Iterator[None]:
        handles = []
        for optimizer in optimizers:
            handles.append(optimizer.register_step_pre_hook(lambda *_: on_phase(Phase.OPTIMIZER)))
            handles.append(optimizer.register_step_post_hook(lambda *_: on_phase(Phase.FORWARD)))
        previous = getattr(_listening, "on_phase", None)
        _listening.on_phase = on_phase
        try:
            with _BACKWARD.active():
                yield
        finally:
            _listening.on_phase = previous
            for handle in handles:
                handle.remove()


@contextlib.contextmanager
def _kept(device: torch.device) -> Iterator[list[torch.Tensor]]:
    """The tensors on `device` that the block created and that outlive it, found among the
    objects the garbage collector tracks (tensors are tracked): with everything older frozen
    (`gc.freeze`), only what the block made is listed, so the cost is the block's own."""
    kept: list[torch.Tensor] = []
    frozen = gc.get_freeze_count() == 0  # someone else's frozen objects are left frozen
    before = None if frozen else {id(t): t for t in _tensors(gc.get_objects())}
    if frozen:
        gc.freeze()
    try:
        yield kept
        gc.collect()  # cycles the block left (only its own objects: the rest is frozen)
        made = _tensors(gc.get_objects())
    finally:
        if frozen:
            gc.unfreeze()
    kept.extend(t for t in made if t.device.type == device.type and id(t) not in (before or ()))


def _tensors(objects: list[Any]) -> list[torch.Tensor]:
    # `type(o)`, not isinstance: a proxy object's `__class__` may warn or import when asked.
    return [o for o in objects if issubclass(type(o), torch.Tensor)]


def _storage_key(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # a subclass with no storage of its own
        return None


def _besides(model: nn.Module, made: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Of the tensors the model function `made`, those that are no part of `model`: not its
    parameters or buffers, nor a plain tensor attribute of one of its modules (which
    `model.to("cuda")` would leave on the host), nor a view of any of those."""
    owned = {_storage_key(t) for t in [*model.parameters(), *model.buffers()]}
    for module in model.modules():
        owned.update(_storage_key(v) for v in vars(module).values() if isinstance(v, torch.Tensor))
    return tuple(t for t in made if _storage_key(t) not in owned and _storage_key(t) is not None)


def _on_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    fake_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if fake_mode is not None and not isinstance(tensor, torch._subclasses.FakeTensor):
        # A real tensor under the simulation: a fake one of its shape, counted as the batch.
        return torch.zeros(tensor.shape, dtype=tensor.dtype, device=device)
    return tensor.to(device)
