"""Prints every figure simulated probes report, for diffing two checkouts' outputs line by line.

A change that only makes the simulation cheaper must leave every figure as it was, bit for bit.
Run this once on each checkout and diff the two outputs; any line that differs is a regression:

    PYTHONPATH=. python benchmarks/identical_results.py > after.txt
    (cd ../main && PYTHONPATH=. python benchmarks/identical_results.py > before.txt)
    diff before.txt after.txt

For each setting it runs a whole fast sweep (the batch sizes the search picks depend on every
figure before them) and prints each probe's Measurement, every field, floats as `repr` (exact),
the timeline as its length, sum and a hash; then it probes fixed batch sizes on one backend, up
and down, with the optimizer phase spliced and run every time, and prints the tracker's event
log (what the allocator replay reads) as a hash too (sorted under autocast, see `AUTOCAST`).
`--quick` keeps the tiny models only.
"""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import fields

from memorymark import Session, Settings
from memorymark.measurement import Measurement

FIXED_BATCHES = (4, 2, 16, 3)
AUTOCAST = ("bf16-mixed", "16-mixed")
"""Under autocast the cast cache frees its copies in hash order, so the order of frees within
one operator varies from run to run on any checkout: there the event log is compared sorted."""


def digest(values: object) -> str:
    """A short hash of `values`' repr: equal lists of ints give equal hashes."""
    return hashlib.sha256(repr(values).encode()).hexdigest()[:16]


def measurement_line(m: Measurement) -> str:
    """Every field of `m`, exact, on one line."""
    parts = []
    for f in fields(m):
        value = getattr(m, f.name)
        if f.name == "timeline":
            value = f"len={len(value)} sum={sum(value)} hash={digest(value)}"
        else:
            value = repr(value)
        parts.append(f"{f.name}={value}")
    return " ".join(parts)


def settings_cases(quick: bool) -> dict[str, Settings]:
    """The settings compared: every optimizer family, precision, and step variant."""
    a10 = {"gpu": "A10", "backend": "sim"}
    # 1 GiB: a GPU small enough that each tiny model's sweep searches a boundary.
    small = {"gpu_memory_gib": 1.0, "backend": "sim"}
    tiny = {
        "tiny-bert-adamw": Settings(model="tiny-bert", seq_len=128, **small),
        "tiny-bert-bf16mixed-sgd": Settings(
            model="tiny-bert", seq_len=128, precision="bf16-mixed", optimizer="sgd", **small
        ),
        "tiny-bert-16mixed-clip-accum2": Settings(
            model="tiny-bert",
            seq_len=128,
            precision="16-mixed",
            max_grad_norm=1.0,
            grad_accum=2,
            **small,
        ),
        "tiny-bert-adafactor": Settings(
            model="tiny-bert", seq_len=128, optimizer="adafactor", **small
        ),
        "tiny-gpt2-adamw8bit": Settings(
            model="tiny-gpt2", seq_len=32, optimizer="adamw-8bit", **small
        ),
        "tiny-gpt2-paged8bit": Settings(
            model="tiny-gpt2", seq_len=32, optimizer="paged-adamw-8bit", **small
        ),
        "tiny-gpt2-lion8bit": Settings(
            model="tiny-gpt2", seq_len=32, optimizer="lion-8bit", **small
        ),
        "tiny-gpt2-checkpointing": Settings(
            model="tiny-gpt2", seq_len=32, grad_checkpointing=True, **small
        ),
        "tiny-gpt2-lora": Settings(model="tiny-gpt2", seq_len=32, lora_rank=4, **small),
        "tiny-gpt2-bf16true-forloop": Settings(
            model="tiny-gpt2",
            seq_len=32,
            precision="bf16-true",
            optimizer="adamw-forloop",
            **small,
        ),
        "tiny-gpt2-forward-only": Settings(
            model="tiny-gpt2", seq_len=32, forward_only=True, **small
        ),
        "tiny-gpt2-fsdp-2gpus": Settings(
            model="tiny-gpt2", seq_len=32, dist="fsdp", gpus="2", max_batch=64, **a10
        ),
        "tiny-gpt2-ddp-2gpus-bf16mixed": Settings(
            model="tiny-gpt2",
            seq_len=32,
            dist="ddp",
            gpus="2",
            precision="bf16-mixed",
            max_batch=64,
            **a10,
        ),
        "tiny-llama-qlora-nf4": Settings(
            model="tiny-llama",
            seq_len=16,
            precision="bf16-mixed",
            lora_rank=4,
            quantization="nf4",
            **small,
        ),
        "tiny-llama-liger": Settings(model="tiny-llama", seq_len=16, kernels="liger", **small),
        "tiny-resnet-adamw-fused": Settings(
            model="tiny-resnet", image_size=96, optimizer="adamw-fused", **small
        ),
    }
    if quick:
        return tiny
    full = {
        "bert": Settings(model="bert", **a10),
        "bert-bf16mixed": Settings(model="bert", precision="bf16-mixed", **a10),
        "gpt2": Settings(model="gpt2", **a10),
        "gpt2-sgd-accum2": Settings(model="gpt2", optimizer="sgd", grad_accum=2, **a10),
        "resnet": Settings(model="resnet", **a10),
        "resnet-adamw8bit-clip": Settings(
            model="resnet", optimizer="adamw-8bit", max_grad_norm=1.0, **a10
        ),
    }
    return full | tiny


def report(name: str, settings: Settings) -> None:
    """Print one setting's sweep, then its fixed probes with and without the splice."""
    session = Session(settings)
    answer = session.analyze()
    print(f"== {name} sweep: optimal={answer.optimal and answer.optimal.batch_size}")
    for m in session.measurements:
        print(f"  {measurement_line(m)}")
    if settings.hardware.dist != "none":
        return  # a sharded step is measured by its sweep; fixed probes add nothing there
    for reuse in (True, False):
        backend = session.open_backend(settings.replace(current_batch=1))
        backend.reuse_optimizer_step = reuse
        with backend.session():
            for batch in FIXED_BATCHES:
                m = backend.measure(batch)
                tracker = backend._tracker
                events = (tracker.events_first_seq, tracker.events) if tracker else None
                if events is not None and settings.workload.precision in AUTOCAST:
                    events = sorted(events[1])
                print(f"  fixed reuse={reuse} events={digest(events)} {measurement_line(m)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny models only")
    parser.add_argument("--only", nargs="*", help="names of the cases to run")
    args = parser.parse_args()
    for name, settings in settings_cases(args.quick).items():
        if not args.only or name in args.only:
            report(name, settings)


if __name__ == "__main__":
    main()
