"""`--training path/to/file.py:function`: the user's own training code, loaded for the command.

The file is run as a module (its top level runs, as `python file.py` would run it, but not its
`if __name__ == "__main__":` block), then the function is called with no arguments and must
return a `memorymark.Training`. Every way that can fail is a one-line ValueError with a way
forward. A server that hosts the app never loads user code: with MEMORYMARK_HOSTED set, this
refuses. Must not know how the training is sized or shown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from memorymark.step.user_job import Training

if TYPE_CHECKING:
    from collections.abc import Iterator

    from memorymark.backends.target_gpu import SetUp
    from memorymark.gpus import GPU

HOSTED_ENV = "MEMORYMARK_HOSTED"
"""Set (true, 1, yes, on) on a server shared with strangers: no user code is ever loaded."""


def hosted() -> bool:
    """True when this process serves a hosted app (MEMORYMARK_HOSTED)."""
    return os.environ.get(HOSTED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def load_training(spec: str, gpu: GPU | None = None) -> Training:
    """The `memorymark.Training` that `spec` ("path/to/file.py:function") returns. With `gpu`
    (the GPU it is sized for, when this machine is not it), the file and the function run as
    on that GPU (`memorymark.target_gpu`), so a `TrainingArguments(bf16=True)` or a CUDA
    GradScaler made at import time is made as there; the Training then says so."""
    if hosted():
        raise ValueError(f"{HOSTED_ENV} is set: a hosted MemoryMark never runs user code")
    path_text, sep, function = spec.rpartition(":")
    if not sep or not path_text or not function.isidentifier():
        raise ValueError(
            f"--training takes path/to/file.py:function (got {spec!r}); the function returns "
            "a memorymark.Training"
        )
    path = Path(path_text).expanduser()
    if path.suffix != ".py" or not path.is_file():
        raise ValueError(f"--training: {path_text} is not a Python file here")
    with _as_on(gpu) as setup:
        module = _run_file(path)
        make = getattr(module, function, None)
        if not callable(make):
            raise ValueError(f"--training: {path} defines no function {function}()")
        try:
            training = make()
        except Exception as exc:
            raise ValueError(
                f"--training: {function}() in {path} failed: {type(exc).__name__}: {exc}"
            ) from exc
    if not isinstance(training, Training):
        raise ValueError(
            f"--training: {function}() must return memorymark.Training(model=, batch=, step=, "
            f"optimizer=); it returned {type(training).__name__}"
        )
    if setup is not None and setup.answered and training.set_up_for is None:
        training = dataclasses.replace(training, set_up_for=setup.gpu.name)
    return training


@contextlib.contextmanager
def _as_on(gpu: GPU | None) -> Iterator[SetUp | None]:
    if gpu is None:
        yield None
        return
    from memorymark.backends.target_gpu import as_on  # loads torch

    with as_on(gpu) as setup:
        yield setup


def _run_file(path: Path) -> object:
    name = f"memorymark_training_{abs(hash(path.resolve()))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"--training: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    # The file's own imports of its neighbours work as `python file.py` would make them.
    sys.path.insert(0, str(path.resolve().parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise ValueError(f"--training: {path} failed to run: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(str(path.resolve().parent))
    return module
