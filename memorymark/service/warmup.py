"""Imported once by the worker pool's forkserver: loads everything a sweep loads, before any job.

A fresh process spends seconds on its first simulated probe beyond importing torch: transformers
imports each model family's module on first use, torch's fake tensors import sympy, and
accelerate, peft and safetensors load lazily (over a thousand modules, measured here). Every
worker is forked from the forkserver, so running one tiny simulated sweep per kind of model
(text encoder, decoder, image) here once makes every job start warm. Fake tensors allocate
nothing and start no threads (checked: the process's thread count is the same before and after),
so forking afterwards is as safe as forking after `import torch`. Any failure is ignored: a cold
worker is slower, not wrong. Must not be imported by the server process itself.
"""

from __future__ import annotations

import contextlib
import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def warm_up() -> None:
    """One tiny simulated sweep per kind of catalog model."""
    from memorymark.engine import Session
    from memorymark.settings import Settings

    for model in ("tiny-bert", "tiny-gpt2", "tiny-resnet"):
        with contextlib.suppress(Exception):
            settings = Settings(model=model, seq_len=16, image_size=32, gpu="a10", max_batch=8)
            Session(settings).analyze(fixes=False, plan=False)


warm_up()
