"""Running code MemoryMark did not write, on a machine that is not the GPU it was written for.

A user's step says `device="cuda"`, `.cuda()`, `torch.autocast("cuda", ...)`, logs `loss.item()`
and may index with a boolean mask. The simulated and `cpu` backends answer each as the GPU would,
or say in one line why they can't:

- `cuda` devices become the backend's own (CPU) device: factories, `.to()`, `.cuda()`, modules'
  `.to()` (`CudaAsHost`); `torch.cuda.synchronize` does nothing, and `empty_cache` tells
  whoever listens (`hearing_flushes`: the backend, which logs the flush where it was made);
- `torch.autocast("cuda", dtype)` runs as the simulation's CPU autocast with CUDA's op lists
  (memorymark/cuda_rules/autocast_emulation.py), its default dtype CUDA's (fp16), and a CUDA
  `GradScaler` as a CPU one; the dtype of each autocast region entered is recorded, so a
  report can say what the job ran;
- on fake tensors (`ReadingFakeMode`), a read of a value (`.item()`, `float()`, `bool()`) gets
  zero, as the catalog step's zero-valued inputs would, and is recorded with the user's file and
  line, and the library's when an installed one (TRL's trainer) read it; a shape that depends on
  values (`nonzero`, boolean-mask indexing, `unique`) is a `SimulationError` naming them;
- `torch.compile`d code, which the simulation does not model yet, is a `SimulationError` as it
  is first called, before dynamo traces it.

Must not know which batch sizes are tried, how memory is counted, or how anything is shown.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from types import FrameType, TracebackType
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.overrides import TorchFunctionMode

from memorymark.cuda_rules import autocast_emulation
from memorymark.cuda_rules.scoped_patch import ScopedPatch
from memorymark.measurement import ValueRead
from memorymark.step.user_job import SimulationError, compile_refusal

_VALUE_READ = torch.ops.aten._local_scalar_dense.default
"""What `.item()`, `float(t)`, `bool(t)` and `.tolist()` reach (aten/native/Scalar.cpp)."""

_PACKAGE_DIRS = tuple(
    os.path.dirname(os.path.abspath(module.__file__ or ""))
    for module in (torch, sys.modules["memorymark"])
)
"""torch's and MemoryMark's folders: never the user's line."""
_STDLIB_DIR = os.path.dirname(os.path.abspath(contextlib.__file__))
_INSTALLED = ("site-packages", "dist-packages")

_NO_CUDA = (
    "not compiled with CUDA",
    "not linked with support for cuda",
    "no NVIDIA driver",
    "CUDA driver",
    "cuda lazy initialization",
)
"""What torch says when a CUDA call finds no GPU (torch/cuda/__init__.py `_lazy_init`)."""

_COMPILER_MODULES = ("torch._dynamo", "torch._inductor")
"""Where torch.compile's exceptions are defined (torch/_dynamo/exc.py, torch/_inductor/exc.py)."""

_REFUSED_COMPILE = "Detected recompile when torch.compile stance is 'fail_on_recompile'"
"""What a compiled function raises under that stance (torch/_dynamo/eval_frame.py)."""

_FIXES = (
    "write it with fixed shapes (torch.where instead of a boolean mask, a padded top-k instead "
    "of nonzero), or skip it while sizing: `if not memorymark.simulating(): ...`"
)


def _installed(filename: str) -> bool:
    return any(part in filename for part in _INSTALLED)


def _is_library(filename: str) -> bool:
    path = os.path.abspath(filename)
    if filename.startswith("<") or path.startswith(_PACKAGE_DIRS):
        return True
    return path.startswith(_STDLIB_DIR) and not _installed(path)


def user_location(frame: FrameType | None) -> tuple[str, int] | None:
    """(file, line) of the innermost frame from `frame` outwards that is the user's: outside
    torch, MemoryMark and the standard library, and preferably outside installed packages
    (a transformers model's line when no frame of the user's own is on the stack)."""
    library_line = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_library(filename):
            if not _installed(filename):
                return filename, frame.f_lineno
            library_line = library_line or (filename, frame.f_lineno)
        frame = frame.f_back
    return library_line


def library_location(frame: FrameType | None) -> tuple[str, int] | None:
    """(file, line) of the innermost frame from `frame` outwards in an installed package other
    than torch (TRL's trainer reading `.item()`), when it is inside the user's innermost frame;
    None when the user's own code is reached first (the user's line is then the whole story)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_library(filename):
            return (filename, frame.f_lineno) if _installed(filename) else None
        frame = frame.f_back
    return None


def traceback_location(tb: TracebackType | None) -> tuple[str, int] | None:
    """`user_location` of the innermost frame of a traceback."""
    last = None
    while tb is not None:
        last, tb = tb.tb_frame, tb.tb_next
    return user_location(last)


def _source(location: tuple[str, int]) -> str:
    return linecache.getline(*location).strip() or "?"


def _where(location: tuple[str, int] | None) -> str:
    if location is None:
        return "in the training step"
    return f"at {location[0]}:{location[1]} ({_source(location)})"


class ReadingFakeMode(FakeTensorMode):
    """Fake tensors for user code: real tensors it holds (constants, a numpy-made batch) join
    the fake ones, value reads get zero and are recorded, and a value-dependent shape is a
    `SimulationError` naming the user's line."""

    def __init__(self) -> None:
        super().__init__(allow_non_fake_inputs=True)
        self.reads: dict[tuple[tuple[str, int], tuple[str, int] | None], ValueRead] = {}
        """Each place that read a value since the last `take_reads`, in order."""

    def take_reads(self) -> tuple[ValueRead, ...]:
        """The reads recorded since the last call, and forget them."""
        reads, self.reads = tuple(self.reads.values()), {}
        return reads

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        try:
            return super().dispatch(func, types, args, kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException) as exc:
            if func is _VALUE_READ:
                # A value the fake tensor does not carry (a constant, such as an optimizer's
                # step count, answers from its value above).
                return self._read(args[0])
            location = user_location(sys._getframe(1))
            raise SimulationError(
                f"{func.overloadpacket} {_where(location)} makes a shape that depends on "
                f"tensor values, which a simulation cannot know: {_FIXES}"
            ) from exc

    def _read(self, tensor: torch.Tensor) -> bool | int | float:
        frame = sys._getframe(2)
        location, library = user_location(frame), library_location(frame)
        if library == location:  # no frame of the user's own: the library's line alone
            library = None
        if location is not None and (key := (location, library)) not in self.reads:
            found = ValueRead(*location, _source(location))
            if library is not None:
                found = replace(
                    found,
                    library_file=library[0],
                    library_line=library[1],
                    library_op=_source(library),
                )
            self.reads[key] = found
        if tensor.dtype is torch.bool:
            return False
        return 0.0 if tensor.dtype.is_floating_point or tensor.dtype.is_complex else 0


def is_cuda(device: Any) -> bool:
    """True for a `cuda` device, named as a torch.device or a string."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.split(":")[0] == "cuda"


def _host(value: Any, host: str) -> Any:
    return host if is_cuda(value) else value


class CudaAsHost(TorchFunctionMode):
    """`cuda` devices named in torch calls become `host` (the backend's own device)."""

    def __init__(self, host: str = "cpu") -> None:
        super().__init__()
        self.host = host

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda or func is torch.Tensor.pin_memory:
            return args[0].to(self.host)
        if func is torch.Tensor.to and args and len(args) > 1 and type(args[1]) is int:
            args = (args[0], self.host, *args[2:])  # `.to(0)` names CUDA device 0
        args = tuple(_host(a, self.host) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _host(kwargs["device"], self.host)
        return func(*args, **kwargs)


_observed = threading.local()
"""`dtypes`: the autocast dtypes the user's code entered inside `on_host` on this thread."""


def _autocast_init(original: Any, self: Any, device_type: str, *args: Any, **kwargs: Any) -> Any:
    if device_type != "cuda":
        result = original(self, device_type, *args, **kwargs)
    else:
        if not args and kwargs.get("dtype") is None:
            kwargs["dtype"] = torch.float16  # CUDA autocast's default (torch.get_autocast_dtype)
        self._memorymark_cast_cache = autocast_emulation.cast_cache()
        result = original(self, "cpu", *args, **kwargs)
    seen = getattr(_observed, "dtypes", None)
    if seen is not None and getattr(self, "_enabled", False):
        seen[str(self.fast_dtype).removeprefix("torch.")] = None
    return result


def _autocast_enter(original: Any, self: Any) -> Any:
    result = original(self)
    cache = getattr(self, "_memorymark_cast_cache", None)
    if cache is not None:
        cache.__enter__()  # weights cast once per region, as CUDA's cached_cast keeps them
    return result


def _autocast_exit(original: Any, self: Any, *exc: Any) -> Any:
    cache = getattr(self, "_memorymark_cast_cache", None)
    if cache is not None:
        cache.__exit__(None, None, None)
    return original(self, *exc)


def scaler_init(original: Any, self: Any, device: str = "cuda", *args: Any, **kwargs: Any) -> Any:
    """A CUDA GradScaler made as a CPU one: torch.amp.GradScaler disables itself when CUDA
    is missing, so it scales as on the GPU instead."""
    return original(self, "cpu" if is_cuda(device) else device, *args, **kwargs)


def _compiling(exc: BaseException) -> bool:
    """True for an error torch.compile raised (its errors live in torch._dynamo and
    torch._inductor: on fake tensors, "TorchRuntimeError: RuntimeError when making fake tensor
    call")."""
    if isinstance(exc, RuntimeError) and str(exc).startswith(_REFUSED_COMPILE):
        return True
    return type(exc).__module__.startswith(_COMPILER_MODULES)


def _nothing(original: Any, *args: Any, **kwargs: Any) -> None:
    return None


_flushes = threading.local()


@contextlib.contextmanager
def hearing_flushes(on_flush: Any) -> Iterator[None]:
    """In the block, a `torch.cuda.empty_cache()` the user's code calls in this thread calls
    `on_flush()` (the backend logs it where the step made it); outside, it does nothing."""
    previous = getattr(_flushes, "on_flush", None)
    _flushes.on_flush = on_flush
    try:
        yield
    finally:
        _flushes.on_flush = previous


def _flush(original: Any, *args: Any, **kwargs: Any) -> None:
    on_flush = getattr(_flushes, "on_flush", None)
    if on_flush is not None:
        on_flush()


_AUTOCAST = torch.amp.autocast_mode.autocast
GRAD_SCALER = torch.amp.GradScaler
"""`torch.cuda.amp.GradScaler` is a subclass: patching its `__init__` covers both."""
_PATCHES = (
    ScopedPatch(_AUTOCAST, "__init__", _autocast_init),
    ScopedPatch(_AUTOCAST, "__enter__", _autocast_enter),
    ScopedPatch(_AUTOCAST, "__exit__", _autocast_exit),
    ScopedPatch(GRAD_SCALER, "__init__", scaler_init),
    ScopedPatch(torch.cuda, "synchronize", _nothing),
    ScopedPatch(torch.cuda, "empty_cache", _flush),
)


@contextlib.contextmanager
def on_host(
    host: str = "cpu", autocast_seen: dict[str, None] | None = None, *, compiling: bool = False
) -> Iterator[None]:
    """User code in the block runs its `cuda` calls on `host`; a CUDA call that has no host
    equivalent (`torch.cuda.current_device()`, a CUDA stream) is a one-line SimulationError.
    `autocast_seen` collects the dtype of each autocast region the code enters. `compiling`:
    the step is compiled by MemoryMark's simulated backend (--compile), so compiling is let
    through; otherwise code the user compiled is refused in one line."""
    previous = getattr(_observed, "dtypes", None)
    _observed.dtypes = autocast_seen if autocast_seen is not None else previous
    with contextlib.ExitStack() as stack:
        stack.callback(setattr, _observed, "dtypes", previous)
        for patch in _PATCHES:
            stack.enter_context(patch.active())
        stack.enter_context(CudaAsHost(host))
        if "torch._dynamo" in sys.modules and not compiling:
            # Compiled code asks to compile at its first call on fake tensors, and would fail
            # once dynamo has traced it ("RuntimeError when making fake tensor call"): refuse
            # before tracing instead (process-wide, as torch's stance is; dynamo is never
            # imported unless something compiles).
            stack.enter_context(torch.compiler.set_stance("fail_on_recompile"))
        try:
            yield
        except Exception as exc:
            if _compiling(exc):
                where = _where(traceback_location(exc.__traceback__))
                raise compile_refusal(f"compiled code ran {where}") from exc
            text = str(exc)
            if not isinstance(exc, (RuntimeError, AssertionError)) or not any(
                sign.lower() in text.lower() for sign in _NO_CUDA
            ):
                raise
            location = traceback_location(exc.__traceback__)
            raise SimulationError(
                f"the step needs a CUDA GPU {_where(location)}, which this run does not have "
                f"({text.splitlines()[0] if text else type(exc).__name__}): use the device the "
                "batch is on, or skip it while sizing: `if not memorymark.simulating(): ...`"
            ) from exc
