"""Prints what a hosted MemoryMark holds in memory: the server and every process it starts.

Starts `streamlit run` (of this checkout, with `--python` another environment's interpreter,
such as a fresh venv installed from hosted/requirements.txt) with `MEMORYMARK_HOSTED=true`,
opens it in headless Chromium, waits for the page, then clicks Analyze on `--query` (a
Llama-3.1-8B QLoRA analysis by default) and samples, every half second, the memory of the whole
process tree: the server, the forkserver, the sweep and question workers and the GPU probe.
Memory is PSS (proportional set size, /proc/<pid>/smaps_rollup): a page shared by forked
workers counts once in the sum, where RSS would count it in every process. Printed: the tree at
idle (page open, nothing running) and at its peak during the analysis, each process at that
peak, and the peak against `--limit-gib` (what the host gives; Community Cloud's documented
limit by default). Linux only (/proc).

    python benchmarks/hosted_memory.py [--python .venv/bin/python] [--root PATH]
        [--entrypoint app.py | hosted/streamlit_app.py] [--query QUERY] [--limit-gib 2.7]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
from pathlib import Path

import psutil
from app_load import CHROMIUM, CHROMIUM_ARGS, ROOT, analyze_in_page, serving

QLORA_8B = (
    "model=llama-3.1-8b&optimizer=paged-adamw-8bit&precision=bf16-mixed&grad_checkpointing=true"
    "&lora_rank=16&quantization=nf4&gpu=a10"
)
COMMUNITY_CLOUD_GIB = 2.7
"""Streamlit Community Cloud's memory per app, its upper figure ("Memory: 690MB minimum, 2.7GBs
maximum", its docs' limits as of February 2024); a free Hugging Face Space has 16 GB
(huggingface.co/docs/hub/spaces-gpus, "CPU Basic | 2 vCPU | 16 GB")."""


def pss_mib(process: psutil.Process) -> float:
    """The process's proportional set size in MiB (0 when it has gone)."""
    try:
        for line in Path(f"/proc/{process.pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree(pid: int) -> dict[str, float]:
    """PSS in MiB of the process `pid` and each descendant, by "pid role"."""
    root = psutil.Process(pid)
    shown = {}
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            shown[f"{p.pid} {_role(p, pid)}"] = pss_mib(p)
    return shown


def _role(p: psutil.Process, server_pid: int) -> str:
    """What the process is to the server: a job's process is forked by the forkserver, so it
    carries the forkserver's command line; its parent tells them apart."""
    if p.pid == server_pid:
        return "server"
    command = " ".join(p.cmdline())
    if "forkserver" in command:
        return "forkserver" if p.ppid() == server_pid else "job (forked: a sweep or question)"
    if "spawn_main" in command:
        return "job (spawned: the GPU probe)"
    return command[:40]


class Sampler:
    """Samples the tree's total PSS every half second until stopped; keeps the peak sample."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            sample = tree(self.pid)
            if sum(sample.values()) > sum(self.peak.values()):
                self.peak = sample
            time.sleep(0.5)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return self.peak


def main() -> None:
    """Serve the hosted app, open it, run one analysis; print idle and peak memory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--entrypoint", default="app.py", help="or hosted/streamlit_app.py")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to serve")
    parser.add_argument("--query", default=QLORA_8B)
    parser.add_argument("--limit-gib", type=float, default=COMMUNITY_CLOUD_GIB)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    hosted = {"MEMORYMARK_HOSTED": "true", "MEMORYMARK_MAX_TIME_LIMIT": "300"}
    root = args.root.resolve()
    served = serving(None, root, python=args.python, entrypoint=args.entrypoint, env=hosted)
    with served as (server, url), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url, timeout=180_000)
            page.get_by_role("button", name="Analyze").wait_for(timeout=180_000)
            time.sleep(5)  # the forkserver's warm-up ends
            idle = tree(server.pid)
            sampler = Sampler(server.pid)
            seconds = analyze_in_page(page, url, args.query)
            peak = sampler.stop()
        finally:
            browser.close()
    print(f"{os.cpu_count()} cores; {args.python}; {args.root}/{args.entrypoint}; "
          f"MEMORYMARK_HOSTED=true; answered in {seconds:.1f} s: {args.query}")  # fmt: skip
    print(f"idle: {sum(idle.values()):.0f} MiB PSS in {len(idle)} processes")
    total = sum(peak.values())
    print(f"peak during the analysis: {total:.0f} MiB PSS = {total / 1024:.2f} GiB "
          f"({total / 1024 / args.limit_gib:.0%} of a {args.limit_gib:g} GiB host)")  # fmt: skip
    for name, mib in sorted(peak.items(), key=lambda kv: -kv[1]):
        print(f"  {mib:7.0f} MiB  {name}")


if __name__ == "__main__":
    main()
