"""Prints whether a fragmentation window is real: a sweep's verdicts beside a fresh process's.

Lightning's demo Transformer (`lightning.pytorch.demos.transformer`, WikiText-2's 33,278-word
vocabulary, 35 tokens, SGD) on an A10, simulated. Its model builds state lazily in its first
forward (the positional-encoding table, the attention mask it caches), which a user's fresh
process builds inside step 1. For each batch, the loop's reserved bytes per step:

- "sweep": traced after a probe at batch 16, as a sweep's later probes are (and as the
  symbolic search's replays, fitted through such probes, are);
- "fresh": traced as the first probe of a new backend, as the user's process runs it.

When a backend kept its model between probes, "sweep" missed that state: at 1128 it read
16.94 GiB at every step where "fresh" needs a fourth 4.9 GiB segment at step 2 (21.83 GiB, past
the A10's 21.68 usable), a window of batches that seemed to fit above 1104-1120. Each simulated
probe of user code now starts from a fresh model, so the two columns agree.

    python benchmarks/fit_window.py [--gpu a10] [--batches 1096 1104 1128 1416]
"""

from __future__ import annotations

import argparse

import torch
from lightning.pytorch.demos.transformer import Transformer

import memorymark as mm
from memorymark.accounting import allocator
from memorymark.units import gib

VOCAB, TOKENS = 33278, 35  # the demo's WikiText2 defaults (vocab_size, block_size)


def training() -> mm.Training:
    """The demo's LightningTransformer step, written as a Training."""

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randint(0, VOCAB, (n, TOKENS)), torch.randint(0, VOCAB, (n, TOKENS))

    def step(model, batch, optimizer) -> None:
        inputs, target = batch
        loss = torch.nn.functional.nll_loss(model(inputs, target), target.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return mm.Training(
        model=lambda: Transformer(vocab_size=VOCAB),
        batch=batch,
        step=step,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        name="LightningTransformer",
    )


def loop_reserved(session: mm.Session, batch: int, before: int | None) -> list[float]:
    """GiB reserved at each step of the loop replayed from the step traced at `batch`, in a
    backend that first traced `before` (None: `batch` is its first probe)."""
    backend = session.open_backend()
    records = backend.keep_records()
    try:
        if before is not None:
            backend.measure(before)
        backend.measure(batch)
        records.keep(batch)
    finally:
        backend.release()
    record = records.records[batch]
    step = (record.events_first_seq, record.events)
    replayed = allocator.replay(record.baseline_events, step, None, steps=3)
    return [round(gib(b), 2) for b in replayed.reserved_per_step]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="a10")
    parser.add_argument("--batches", type=int, nargs="+", default=[1096, 1104, 1128, 1416])
    args = parser.parse_args()
    session = mm.Session(mm.Settings(gpu=args.gpu, strategy="linear"), training=training())
    policy = session.policy
    print(
        f"{args.gpu}: usable {gib(policy.capacity_bytes):.2f} GiB, limit with the margin "
        f"{gib(policy.limit_bytes):.2f} GiB; GiB reserved at steps 1-3 of the loop"
    )
    for batch in args.batches:
        sweep, fresh = loop_reserved(session, batch, 16), loop_reserved(session, batch, None)
        print(f"batch {batch:>5}  sweep {sweep}  fresh {fresh}")


if __name__ == "__main__":
    main()
