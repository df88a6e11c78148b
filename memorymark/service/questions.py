"""Small questions only torch can answer, answered in a worker so the server process loads no torch.

Owns what the worker runs for each: the GPUs of the machine the sweeps run on (`local_gpus`, the
plain `LocalGPUs` record, the same `GPU` a `Session` there would use), a model's parameter
count (`parameter_count`, on the meta device), and whether this worker can run a backward at
all (`autograd_runs`, the worker pool's ready check). Loading torch only to ask these would cost the
server process about half a GiB for its whole life (libtorch mapped; measured with
benchmarks/server_memory.py). Must not know Streamlit, which executor runs them, or what the
answers are used for; imports torch only inside the worker.
"""

from __future__ import annotations

from memorymark import models
from memorymark.backends.selection import LocalGPUs


def local_gpus() -> LocalGPUs:
    """This process's view of the machine's GPUs (it imports torch: run it in a worker)."""
    from memorymark.backends import resolve

    return LocalGPUs(cuda_gpu=resolve.local_gpu(), mps_gpu=resolve.apple_gpu())


def parameter_count(model: str, task: str) -> int:
    """Parameters of `model` (a catalog key or a spec) trained for `task`, counted on the meta
    device (it imports torch: run it in a worker)."""
    return models.parameter_count(models.find_model(model), task)


def autograd_runs() -> None:
    """Run one backward on a one-element CPU tensor: in a process forked after its parent started
    autograd's device threads it raises the engine's fork error (the worker pool's
    `FORKED_AUTOGRAD`), before a sweep would report it as its first probe's failure."""
    import torch

    weight = torch.ones(1, requires_grad=True)
    weight.sum().backward()
