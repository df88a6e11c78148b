"""The user's setup code run on this machine as on the GPU it is sized for: `as_on(gpu)`.

A script written for a GPU asks the machine about it before any step runs: transformers'
`TrainingArguments(bf16=True)` checks that the GPU has bf16 (and `tf32=True` that it has TF32)
and raises on a CPU-only machine; `torch.amp.GradScaler("cuda")` made with no CUDA disables
itself. Inside `as_on(gpu)` those questions get the target GPU's answers: the bf16 and TF32
checks answer from its compute capability (memorymark/gpus/record.py), a CUDA GradScaler is
made enabled, as on the GPU (the simulation runs it as a CPU one), and each TrainingArguments
made there is marked with the GPU's name, so the answer can say whom it was set up for. Nothing
else changes: the arguments still say `device` is this machine's, so nothing touches CUDA.

Must not know how a step runs, how memory is counted, or which batch sizes are tried.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import Any

from memorymark.backends import user_code
from memorymark.cuda_rules.scoped_patch import ScopedPatch
from memorymark.gpus import GPU
from memorymark.gpus.record import BF16_MIN_CAPABILITY, TF32_MIN_CAPABILITY

TARGET_ATTRIBUTE = "_memorymark_target_gpu"
"""Set on a TrainingArguments made inside `as_on`: the name of the GPU it was set up for."""


class SetUp:
    """What `as_on` answered for the GPU while the block ran."""

    def __init__(self, gpu: GPU) -> None:
        self.gpu = gpu
        self.answered: list[str] = []
        """Each question the setup asked that got the GPU's answer, once, in order."""

    def answer(self, question: str) -> None:
        """Note that `question` got the GPU's answer."""
        if question not in self.answered:
            self.answered.append(question)


@contextlib.contextmanager
def as_on(gpu: GPU) -> Iterator[SetUp]:
    """Run the block's setup code as on `gpu` (this thread only; see the module docstring)."""
    setup = SetUp(gpu)
    capability = tuple(gpu.compute_capability)
    patches = [ScopedPatch(user_code.GRAD_SCALER, "__init__", _scaler_init(setup))]
    if importlib.util.find_spec("transformers") is not None:
        from transformers import training_args

        patches += [
            ScopedPatch(
                training_args,
                "is_torch_bf16_gpu_available",
                _answer(setup, "bf16", capability >= BF16_MIN_CAPABILITY),
            ),
            ScopedPatch(
                training_args,
                "is_torch_tf32_available",
                _answer(setup, "tf32", capability >= TF32_MIN_CAPABILITY),
            ),
            ScopedPatch(training_args.TrainingArguments, "__post_init__", _mark(gpu.name)),
        ]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch.active())
        yield setup


def _answer(setup: SetUp, what: str, supported: bool) -> Any:
    # transformers 5.24 training_args.py `_validate_args` asks `is_torch_bf16_gpu_available()`
    # for bf16 / bf16_full_eval, and `__post_init__` asks `is_torch_tf32_available()` for tf32.
    def answer(original: Any) -> bool:
        setup.answer(f"the TrainingArguments' {what} check")
        return supported

    return answer


def _mark(name: str) -> Any:
    def post_init(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        # Not a dataclass field: `to_dict()` and the saved arguments leave it out.
        object.__setattr__(self, TARGET_ATTRIBUTE, name)
        return result

    return post_init


def _scaler_init(setup: SetUp) -> Any:
    def init(original: Any, self: Any, device: str = "cuda", *args: Any, **kwargs: Any) -> Any:
        if user_code.is_cuda(device):
            setup.answer("a CUDA GradScaler")
        return user_code.scaler_init(original, self, device, *args, **kwargs)

    return init


def target_of(arguments: Any) -> str | None:
    """The GPU name `as_on` marked `arguments` (a TrainingArguments) with, or None."""
    return getattr(arguments, TARGET_ATTRIBUTE, None)
