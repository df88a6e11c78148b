"""Per-rank model states: MemoryMark's simulation of FSDP2 beside DeepSpeed's estimator formulas.

Prints, for a few catalog models on 8 GPUs, the bytes per GPU that DeepSpeed's
`estimate_zero3_model_states_mem_needs` and `estimate_zero2_model_states_mem_needs` give with no
offload (deepspeedai/DeepSpeed deepspeed/runtime/zero/stage3.py and stage_1_and_2.py, read at
007cca6a and 02aa38c3: ZeRO-3 = 4 x largest layer + 18 x params / GPUs; ZeRO-2 = 2 x params + 18 x
params / GPUs), and what MemoryMark simulates for rank 0 before its first step (parameter shards
and AdamW state after priming), plus the fp32 gradient shards the step adds, and the peak of one
step at batch 1 (simulated). Not a test: run it and read it. Writes nothing.

    PYTHONPATH=. python benchmarks/deepspeed_formulas.py [--gpus 8] [--seq-len 2048] [MODEL ...]
"""

from __future__ import annotations

import argparse
import time

import torch

from memorymark import Session, Settings, models
from memorymark.units import GIB


def params_and_largest_layer(key: str) -> tuple[int, int]:
    """DeepSpeed's `model_to_params`: unique parameters, and the largest module's own ones."""
    entry = models.find_model(key)
    with torch.device("meta"):
        model = models.build_model(entry, entry.default_task)
    total = sum({id(p): p.numel() for p in model.parameters()}.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["llama-3.2-1b", "llama-3.1-8b"])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    args = parser.parse_args()
    n = args.gpus
    print(f"GiB per GPU on {n} GPUs (H100 80GB), bf16-mixed, AdamW, seq {args.seq_len}")
    print("model | DS ZeRO-3 | DS ZeRO-2 | MM fsdp states (+grads) | MM fsdp peak, batch 1 | s")
    for key in args.models:
        total, largest = params_and_largest_layer(key)
        zero3 = 4 * largest + 18 * total / n
        zero2 = 2 * total + 18 * total / n
        settings = Settings(model=key, gpu="h100", precision="bf16-mixed", seq_len=args.seq_len,
                            dist="fsdp", gpus=str(n), backend="sim")  # fmt: skip
        start = time.perf_counter()
        session = Session(settings)
        held = session.resident_bytes()
        states = held["parameters"] + held["optimizer_state"]
        grads = held["parameters"]  # fp32 gradient shards, the size of the parameter shards
        peak = session.measure(1)
        seconds = time.perf_counter() - start
        print(
            f"{key} | {zero3 / GIB:.2f} | {zero2 / GIB:.2f} | {states / GIB:.2f} "
            f"(+{grads / GIB:.2f} = {(states + grads) / GIB:.2f}) | "
            f"{peak.peak_bytes / GIB:.2f} (reserved {(peak.required_bytes or 0) / GIB:.2f}) | "
            f"{seconds:.0f}"
        )


if __name__ == "__main__":
    main()
