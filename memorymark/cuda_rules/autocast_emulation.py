"""Autocast with CUDA's op lists (`autocast_lists`), on CPU tensors.

`torch.autocast("cpu", dtype)` casts by CPU's lists, which leave softmax, layer_norm, sum, pow,
exp... in the input dtype; CUDA runs them in fp32, so a bf16 step on CUDA keeps fp32 activations
that CPU's rules would not (matmul inputs are saved in bf16 on both).

The emulation registers, on the AutocastCPU dispatch key, a Python kernel for every op that CUDA
autocasts and CPU does not, applying CUDA's policy to it. The kernels sit where CUDA's do, above
autograd, so the casts are recorded and inputs are saved in the cast dtype. They read torch's own
autocast state: the step enters `torch.autocast("cpu", dtype)` where on CUDA it enters
`torch.autocast("cuda", dtype)`, so `autocast(enabled=False)` regions in model code, and
activation-checkpoint recomputation (which restores that state), behave as on CUDA. Ops both lists
cover keep CPU's kernel: the policy is the same, except `prod` (CPU fp32, CUDA fp32_set_opt_dtype:
the same output dtype), `grid_sampler` (CPU fp32, CUDA promote) and `binary_cross_entropy` (CPU
fp32, CUDA refuses it); ops only CPU casts (3-D pooling, padding, FFT, `cat`/`stack` promotion)
keep CPU's cast. None of these is in the catalog's models. An op a newer PyTorch autocasts on
CUDA by a policy not listed in `autocast_lists` runs uncast, with one warning when a step calls
it (not at registration: most steps never call it).

The kernels are registered once per process. Outside `emulated()`, and in any other thread, they
redispatch unchanged, which is what the fallthrough they stand in for does.
Must not know models, measurement or search.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from memorymark.cuda_rules.autocast_lists import (
    APPEND_DTYPE,
    APPEND_TARGET,
    FP32,
    LOWER,
    NEWER_POLICIES,
    NOT_EMULATED,
    OLDER_POLICIES,
    POLICIES,
    PROMOTE,
    SET_OPT_DTYPE,
)

_state = threading.local()
_lock = threading.Lock()
_library: torch.library.Library | None = None
_registered: tuple[str, ...] = ()
_unavailable = False
_warned: set[str] = set()
"""Ops of unknown policy a step has called, each warned about once per process."""


def _emulating() -> bool:
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def emulated() -> Iterator[bool]:
    """CPU autocast follows CUDA's lists in this thread for the block; yields False if it can't."""
    available = _register()
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield available
    finally:
        _state.depth -= 1


@contextlib.contextmanager
def cast_cache() -> Iterator[None]:
    """One autocast region: fp32 weights are cast once and reused, as CUDA's `cached_cast` does.

    autocast_mode.cpp keeps the lower-precision copy of each fp32 leaf that requires grad until
    the outermost autocast region exits; outside `emulated()` this does nothing.
    """
    if not _emulating() or getattr(_state, "cache", None) is not None:
        yield
        return
    _state.cache = {}
    try:
        yield
    finally:
        _state.cache = None


def registered_ops() -> list[str]:
    """Op overloads that run CUDA's policy under emulation (empty before the first use)."""
    return sorted(_registered)


def _register() -> bool:
    global _library, _registered, _unavailable
    with _lock:
        if _library is not None or _unavailable:
            return not _unavailable
        try:
            _library, _registered = _register_kernels()
        except Exception as exc:  # noqa: BLE001 - any failure of the internals means: fall back
            _unavailable = True
            warnings.warn(
                f"CUDA's autocast lists can't be emulated with PyTorch {torch.__version__} "
                f"({type(exc).__name__}: {exc}); simulated mixed precision uses CPU's lists",
                RuntimeWarning,
                stacklevel=3,
            )
        return not _unavailable


def _register_kernels() -> tuple[torch.library.Library, tuple[str, ...]]:
    # Each release registers only its own ops; the others are skipped below (not in on_cuda).
    policies = {**OLDER_POLICIES, **POLICIES, **NEWER_POLICIES}
    known = set(policies) | NOT_EMULATED
    # Only aten's lists: an extension's ops (torchvision::nms...) register their own autocast
    # kernels for CPU as for CUDA, and no catalog model calls them.
    registered = _registrations("AutocastCUDA")
    on_cuda = {r.removeprefix("aten::") for r in registered if r.startswith("aten::")}
    library = torch.library.Library("aten", "IMPL")
    ops = []
    for name, policy in policies.items():
        if name not in on_cuda or _has_cpu_kernel(name):
            continue  # not autocast on CUDA in this PyTorch, or CPU's own kernel casts it
        kernel = _kernel(name, policy)
        if kernel is not None:
            library.impl(name, kernel, "AutocastCPU")
            ops.append(name)
    # A newer PyTorch autocasts ops whose CUDA policy is not listed here. Most steps never call
    # them, so a warning at registration would be noise on every run: the warning comes when a
    # step does call one that runs uncast (no CPU autocast kernel either).
    for name in sorted(on_cuda - known):
        kernel = None if _has_cpu_kernel(name) else _unknown_policy_kernel(name)
        if kernel is not None:
            library.impl(name, kernel, "AutocastCPU")
    return library, tuple(ops)


def _unknown_policy_kernel(name: str) -> Callable[..., Any] | None:
    """A kernel for an op CUDA autocasts by a policy not listed here: it runs the op uncast, as
    the fallthrough it stands in for does, and warns once when a step calls it emulated."""
    overload = _overload(name)
    if overload is None:
        return None
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            if _emulating() and name not in _warned:
                _warned.add(name)
                warnings.warn(
                    f"the step calls {name}, which PyTorch {torch.__version__} autocasts on CUDA "
                    "by a policy the simulation does not know; it ran uncast, so its outputs' "
                    "dtype (and memory) may differ on the GPU",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return overload(*args, **kwargs)

    return kernel


def _registrations(key: str) -> list[str]:
    return list(torch._C._dispatch_get_registrations_for_dispatch_key(key))


def _has_cpu_kernel(name: str) -> bool:
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "AutocastCPU"))


def _overload(name: str) -> torch._ops.OpOverload | None:
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    return getattr(packet, overload or "default", None) if packet is not None else None


@dataclass(frozen=True, slots=True)
class _Op:
    """An op overload and what its policy needs of its schema, read once at registration."""

    overload: torch._ops.OpOverload
    target: torch._ops.OpOverload
    """The overload to call: the same, or for fp32_append_dtype the one taking a dtype."""
    arg_names: tuple[str, ...]
    arg_defaults: tuple[Any, ...]


def _kernel(name: str, policy: str) -> Callable[..., Any] | None:
    overload = _overload(name)
    if overload is None:
        return None
    target = _overload(APPEND_TARGET[name]) if policy == APPEND_DTYPE else overload
    if target is None:  # a release without the overload an append policy calls
        return None
    schema = overload._schema.arguments
    op = _Op(
        overload, target, tuple(a.name for a in schema), tuple(a.default_value for a in schema)
    )
    apply = _POLICY_FUNCTIONS[policy]
    # As CUDA's wrappers do (ExcludeDispatchKeyGuard no_autocast), nothing below is autocast again.
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    guard = torch._C._ExcludeDispatchKeyGuard

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with guard(exclude):
            if not _emulating():
                return overload(*args, **kwargs)  # what the fallthrough it stands in for does
            call, args, kwargs = apply(op, args, kwargs)
            return call(*args, **kwargs)

    return kernel


# -- the policies (autocast_mode.h WrapFunction_ specialisations) ----------------------------


def _eligible(value: Any) -> bool:
    # is_eligible: a defined floating tensor on the device, not float64.
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
        and value.device.type == "cpu"
    )


def _cached_cast(dtype: torch.dtype, value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_cached_cast(dtype, v) for v in value)
    if not _eligible(value) or value.dtype == dtype:
        return value
    cache = getattr(_state, "cache", None)
    cacheable = (
        cache is not None
        and dtype == torch.get_autocast_dtype("cpu")
        and value.dtype == torch.float32
        and value.requires_grad
        and value.is_leaf
        and not value._is_view()
        and torch.is_autocast_cache_enabled()
        and not torch.is_inference_mode_enabled()
    )
    if not cacheable or cache is None:  # (the second: for the type checker)
        return value.to(dtype)
    hit = cache.get(id(value))
    if hit is not None and hit[0]() is value:
        return hit[1]
    with torch.enable_grad():  # a cached copy keeps its history even if made under no_grad
        casted = value.to(dtype)
    cache[id(value)] = (weakref.ref(value), casted)
    return casted


def _cast_all(dtype: torch.dtype, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return (
        tuple(_cached_cast(dtype, a) for a in args),
        {k: _cached_cast(dtype, v) for k, v in kwargs.items()},
    )


Call = tuple[torch._ops.OpOverload, tuple, dict]


def _lower(op: _Op, args: tuple, kwargs: dict) -> Call:
    return (op.overload, *_cast_all(torch.get_autocast_dtype("cpu"), args, kwargs))


def _fp32(op: _Op, args: tuple, kwargs: dict) -> Call:
    return (op.overload, *_cast_all(torch.float32, args, kwargs))


def _set_opt_dtype(op: _Op, args: tuple, kwargs: dict) -> Call:
    # If the caller named an output dtype, keep it; otherwise ask for fp32 output.
    if not (args and _eligible(args[0])):
        return op.overload, args, kwargs
    index = op.arg_names.index("dtype")
    if index < len(args):
        if args[index] is None:
            args = (*args[:index], torch.float32, *args[index + 1 :])
    elif kwargs.get("dtype") is None:
        kwargs = {**kwargs, "dtype": torch.float32}
    return op.overload, args, kwargs


def _append_dtype(op: _Op, args: tuple, kwargs: dict) -> Call:
    # norm without a dtype becomes norm with one: fp32 for an eligible input.
    out_type = torch.float32 if _eligible(args[0]) else args[0].dtype
    given = len(args)
    rest = [
        kwargs.get(n, d) for n, d in zip(op.arg_names[given:], op.arg_defaults[given:], strict=True)
    ]
    return op.target, (*args, *rest), {"dtype": out_type}


def _promote(op: _Op, args: tuple, kwargs: dict) -> Call:
    # The widest floating type among the eligible inputs: fp32 if any is fp32.
    leaves = [*args, *kwargs.values()]
    leaves += [t for v in leaves if isinstance(v, (list, tuple)) for t in v]
    fp32 = any(_eligible(t) and t.dtype == torch.float32 for t in leaves)
    widest = torch.float32 if fp32 else torch.get_autocast_dtype("cpu")
    return (op.overload, *_cast_all(widest, args, kwargs))


_POLICY_FUNCTIONS = {
    LOWER: _lower,
    FP32: _fp32,
    SET_OPT_DTYPE: _set_opt_dtype,
    APPEND_DTYPE: _append_dtype,
    PROMOTE: _promote,
}
