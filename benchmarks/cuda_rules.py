"""Prints how much the CUDA rules move the simulated peak: CPU's kernels against CUDA's.

For BERT-base at seq 128 and 512, GPT-2 at seq 1024 and ResNet-50 at 224 px, each in train mode at
batch 16 with AdamW, in fp32 and bf16-mixed: the simulated peak with the CUDA rules off (what the
same step allocates with CPU's kernels: math attention, dropout masks in the input dtype, CPU's
autocast lists) and on (the fused attention kernel CUDA picks for the GPU, bool dropout masks,
CUDA's autocast lists), with the attention kernel CUDA picked. Both columns use the foreach
optimizer. Fake tensors: nothing is allocated, a step takes a second or two.

    python benchmarks/cuda_rules.py [--gpu A10] [--batch 16]
"""

from __future__ import annotations

import argparse
import collections
import time
from dataclasses import replace

from memorymark import Session, Settings
from memorymark.cuda_rules import sdpa
from memorymark.gpus import find_gpu
from memorymark.units import GIB

CASES = (
    ("BERT-base seq 128", Settings(model="bert", seq_len=128)),
    ("BERT-base seq 512", Settings(model="bert", seq_len=512)),
    ("GPT-2 seq 1024", Settings(model="gpt2", seq_len=1024)),
    ("ResNet-50 224px", Settings(model="resnet", image_size=224)),
)
PRECISIONS = ("32-true", "bf16-mixed")


def kernels_chosen() -> collections.Counter[str]:
    """Counts, for the rest of this script, the attention backend each patched SDPA call picks."""
    chosen: collections.Counter[str] = collections.Counter()
    select = sdpa.select_backend

    def counting(call: sdpa.SdpaCall, capability: tuple[int, int]) -> str:
        backend = select(call, capability)
        chosen[backend] += 1
        return backend

    sdpa.select_backend = counting
    return chosen


def peak_gib(settings: Settings, batch: int, *, cuda_rules: bool) -> tuple[float, float]:
    """(peak, activations at the peak) of one simulated step, in GiB."""
    # The named GPU's kernels, with room for any step, so every step reports its breakdown.
    gpu = replace(find_gpu(settings.hardware.gpu), total_bytes=2**50)
    backend = Session(settings.replace(backend="sim"), gpu=gpu).open_backend()
    backend.cuda_rules = cuda_rules  # off: CPU's kernels, for the comparison
    with backend.session():
        m = backend.measure(batch)
    return m.peak_bytes / GIB, m.breakdown.activations / GIB


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="A10", help="catalog GPU simulated (default A10)")
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    gpu = find_gpu(args.gpu)
    print(f"Simulated {gpu.name} (sm{gpu.compute_capability[0]}{gpu.compute_capability[1]}), "
          f"train mode, AdamW (foreach), batch {args.batch}; GiB = 2^30 bytes")  # fmt: skip
    head = f"{'workload':<18} {'precision':<10} {'CPU rules':>10} {'CUDA rules':>10} {'ratio':>6}"
    print(f"{head} {'act. CPU':>9} {'act. CUDA':>9}  attention kernel (CUDA)  seconds")
    chosen = kernels_chosen()
    for label, base in CASES:
        for precision in PRECISIONS:
            settings = Settings(**{**base.to_dict(), "precision": precision, "gpu": args.gpu})
            start = time.perf_counter()
            cpu_peak, cpu_act = peak_gib(settings, args.batch, cuda_rules=False)
            chosen.clear()
            cuda_peak, cuda_act = peak_gib(settings, args.batch, cuda_rules=True)
            seconds = time.perf_counter() - start
            kernel = ", ".join(f"{k} x{n}" for k, n in chosen.items()) or "-"
            print(
                f"{label:<18} {precision:<10} {cpu_peak:>10.2f} {cuda_peak:>10.2f} "
                f"{cuda_peak / cpu_peak:>6.2f} {cpu_act:>9.2f} {cuda_act:>9.2f}  "
                f"{kernel:<23} {seconds:>7.1f}"
            )


if __name__ == "__main__":
    main()
