"""Prints what simulating a big model's training step costs here: wall seconds and process RSS.

Fake tensors allocate nothing, so a 70B model's step should take seconds and little memory.
Each model runs in a fresh process, so its RSS is its own. Target on a 2-core machine:
Llama-3.1-8B <= 30 s and Llama-3.1-70B <= 120 s (bf16-true, AdamW, batch 1, seq 2048),
each with process RSS <= 3 GB.

    python benchmarks/big_models.py [--models llama-3.1-8b llama-3.1-70b] [--seq-len 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CHILD = """
import json, resource, sys, time
from memorymark import Session, Settings
start = time.perf_counter()
# The largest custom GPU, so the step fits and its breakdown is reported.
settings = Settings(model=sys.argv[1], seq_len=int(sys.argv[2]), precision=sys.argv[3],
                    optimizer="adamw", backend="sim", gpu_memory_gib=2048.0)
m = Session(settings).measure(1)
print(json.dumps({"seconds": time.perf_counter() - start, "peak_gib": m.peak_bytes / 2**30,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "breakdown": m.breakdown.to_dict()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama-3.1-8b", "llama-3.1-70b"])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--precision", default="bf16-true")
    args = parser.parse_args()
    print(
        f"one simulated step, batch 1, seq {args.seq_len}, {args.precision}, AdamW "
        "(build + optimizer state + step, in a fresh process)"
    )
    for model in args.models:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, model, str(args.seq_len), args.precision],
            capture_output=True,
            text=True,
            check=True,
            env={"TRANSFORMERS_VERBOSITY": "error", **os.environ},
        )
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        b = r["breakdown"]
        print(
            f"  {model:<14} {r['seconds']:6.1f} s   RSS {r['rss_mib']:6.0f} MiB   simulated peak "
            f"{r['peak_gib']:8.1f} GiB (params {b['parameters'] / 2**30:.1f}, optimizer "
            f"{b['optimizer_state'] / 2**30:.1f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
