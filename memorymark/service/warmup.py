"""Imported once by the worker pool's forkserver: loads everything a sweep loads, before any job.

A fresh process spends seconds on its first simulated probe beyond importing torch: transformers
imports each model family's module on first use, torch's fake tensors import sympy, and
accelerate, peft and safetensors load lazily (over a thousand modules, measured here). Every
worker is forked from the forkserver, so running one tiny simulated forward pass per kind of
model (text encoder, decoder, image) and one optimizer step here makes every job start warm.

What it must never run is a backward pass. Autograd's engine decides once per process, at its
first backward, how many device threads to start (`Engine::start_device_threads` in
torch/csrc/autograd/engine.cpp: one per device of the busiest non-CPU backend), and a process
forked after that fails its own first backward ("Unable to handle autograd's threading in
combination with fork-based multiprocessing"). On torch 2.13's CPU build the engine saw no device
and started none; on a CUDA build with no GPU, `FakeTensorMode.__enter__` installs a no-op CUDA
device guard that reports devices (torch/_subclasses/fake_tensor.py, `_ensureCUDADeviceGuardSet`),
and a fake backward started 8 threads (2.14.1+cu130, measured here); on a machine with a GPU, the
real CUDA guard reports it. Leaving the decision to each worker is right on every build: a
worker that measures on a real GPU gets its device threads, a simulated one whatever its build
reports. A forward pass and an optimizer step start no thread (checked by
tests/test_worker_warmup.py on the torch the suite runs on). Any failure is ignored: a cold worker
is slower, not wrong. Must not be imported by the server process itself.
"""

from __future__ import annotations

import contextlib
import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

WARM_MODELS = ("tiny-bert", "tiny-gpt2", "tiny-resnet")
"""One catalog model per kind of input and head: text encoder, causal decoder, image."""


def warm_up() -> None:
    """One tiny simulated forward pass per kind of catalog model, and one AdamW step."""
    from memorymark.engine import Session
    from memorymark.settings import Settings

    for model in WARM_MODELS:
        with contextlib.suppress(Exception):
            settings = Settings(
                model=model, seq_len=16, image_size=32, gpu="a10", max_batch=8, forward_only=True
            )
            Session(settings).measure(2)
    with contextlib.suppress(Exception):
        _optimizer_step()


def _optimizer_step() -> None:
    """AdamW's first step on a fake parameter: imports and traces the optimizer's foreach path
    (a BERT-base prime spends most of its time there), with no backward."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        weight = torch.nn.Parameter(torch.zeros(4, 4))
        weight.grad = torch.zeros(4, 4)
        torch.optim.AdamW([weight]).step()


warm_up()
