"""The compiled step on the CPU: Inductor's real CPU code against the simulated compiled step.

The `cpu` backend's tracker counts the storages PyTorch's dispatcher creates, which misses the
buffers Inductor's generated code allocates itself (`empty_strided_cpu` goes to the allocator
directly): on a compiled step it reads low. So the real figure here is the profiler's, which
sees every CPU allocation (`torch.profiler.profile(profile_memory=True)`, its `[memory]`
events): the highest running sum over the step, plus the weights and optimizer state alive
before it. On an eager step that sum equals the tracker's peak to within bytes, which the
first row checks.

Dropout is off by default (a copy of the model's config with every `*pdrop`/`*dropout` at 0):
the simulation replays CUDA's dropout, whose mask is one byte an element, and the CPU's
kernel keeps a mask of the input's dtype, so with dropout on the eager rows differ by that
alone (tiny-gpt2 at batch 8, seq 128: 25,561,720 simulated against 27,626,168 real).

    PYTHONPATH=. python benchmarks/compiled_cpu.py [--model tiny-gpt2] [--batch 8]
        [--seq-len 128] [--keep-dropout]

Prints, per row, the real peak (profiler), the tracker's view of the same real step, the
simulated peak, and simulated / real.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from memorymark import Session, Settings
from memorymark.measurement import Measurement
from memorymark.models import catalog

DROPOUT_KEYS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob",
                "attention_probs_dropout_prob", "attention_dropout", "dropout")  # fmt: skip
"""The config keys transformers' catalog models read their dropout probabilities from."""


def without_dropout(model: str, folder: Path) -> str:
    """A `file:` model: the catalog `model`'s config with every dropout probability 0."""
    config = catalog.config_of(catalog.find_model(model))
    if config is None:
        raise SystemExit(f"{model} is not built from a config: pass --keep-dropout")
    config.update(dict.fromkeys(DROPOUT_KEYS, 0.0))
    path = folder / f"{model}-no-dropout.json"
    path.write_text(json.dumps(config))
    return f"file:{path}"


def real_peak(settings: Settings, batch: int) -> tuple[int, Measurement]:
    """(bytes the CPU held at the step's peak by the profiler, the tracker's measurement)."""
    with Session(settings).open_backend().session() as backend:
        backend.measure(batch)  # compile, and make the optimizer state, before the step timed
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            measured = backend.measure(batch)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    assert measured.breakdown is not None
    before = measured.breakdown.parameters + measured.breakdown.optimizer_state
    return before + peak, measured


def main() -> None:
    """Print the eager and compiled rows for the model asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-gpt2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    # Eager attention runs the same kernels on the CPU as the simulation replays for a GPU;
    # SDPA would take the CPU's math kernel for real and a fused CUDA kernel simulated.
    parser.add_argument("--attention", default="eager")
    parser.add_argument("--keep-dropout", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    folder = Path(tempfile.mkdtemp())
    model = args.model if args.keep_dropout else without_dropout(args.model, folder)
    dropout = "dropout on" if args.keep_dropout else "dropout off"
    print(f"{args.model} ({dropout}, {args.attention} attention), batch {args.batch}, seq "
          f"{args.seq_len}, fp32, AdamW, torch {torch.__version__}")  # fmt: skip
    header = ("step", "real (profiler)", "real (tracker)", "simulated", "sim/real")
    print("{:10} {:>16} {:>15} {:>12} {:>9}".format(*header))
    for compiled in (False, True):
        base = Settings(
            model=model, seq_len=args.seq_len, compile=compiled, attention=args.attention
        )
        real, tracked = real_peak(base.replace(backend="cpu"), args.batch)
        simulated = Session(base.replace(backend="sim")).measure(args.batch).peak_bytes
        name = "compiled" if compiled else "eager"
        print(
            f"{name:10} {real:16,} {tracked.peak_bytes:15,} {simulated:12,} {simulated / real:9.3f}"
        )


if __name__ == "__main__":
    main()
