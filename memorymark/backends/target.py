"""`memorymark.target_gpu`: a training's setup code, written for a GPU, run as on that GPU.

The public, torch-free front of `target_gpu.py` beside it, which answers the device
checks a script makes before training (transformers' bf16 and TF32 checks, a CUDA GradScaler)
for the GPU it is sized for. Importing it loads no torch.

Must not know how a step runs, how memory is counted, or which batch sizes are tried.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def target_gpu(gpu: str) -> Iterator[None]:
    """Set up a training written for a GPU on a machine without it: inside the block, the
    device checks a script makes before training answer as on `gpu` (a catalog name, as
    `Settings(gpu=...)` takes). transformers' `TrainingArguments(bf16=True)` (and `tf32=True`)
    passes where the GPU has bf16 (TF32), instead of raising "Your setup doesn't support
    bf16/gpu"; a `torch.amp.GradScaler("cuda")` is made enabled, as on the GPU, instead of
    disabling itself. Arguments made here are marked for `gpu`: the report says whom they
    were set up for, and sizing them for a GPU without the bf16 they were set up with is a
    one-line error. This thread only.

        >>> with memorymark.target_gpu("a10"):
        ...     args = TrainingArguments("out", bf16=True, per_device_train_batch_size=32)
        >>> trainer = Trainer(model=model, args=args, train_dataset=data)
        >>> hf.find_batch_size(trainer, gpu="a10")  # the report says: set up as on the A10
    """
    from memorymark.backends.target_gpu import as_on  # torch loads here, not on import
    from memorymark.gpus import find_gpu

    with as_on(find_gpu(gpu)):
        yield
