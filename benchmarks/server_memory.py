"""Prints the Streamlit server process's own memory after one analysis, and whether it maps torch.

Starts `streamlit run app.py` (of this checkout, or of `--root`: another checkout, such as a git
worktree of an older commit) on a free localhost port, opens it in headless Chromium, clicks
Analyze on a tiny model and waits for the answer (app_load.py's helpers), then reads the server's
resident memory (VmRSS) and /proc/<pid>/maps (any libtorch mapping), and stops it. The pid is
the `streamlit` process itself: the workers that run the sweep are its children and are not
counted. Linux only (/proc).

    python benchmarks/server_memory.py [--root PATH] [--query "model=tiny-bert&max_batch=64"]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from app_load import CHROMIUM, CHROMIUM_ARGS, ROOT, analyze_in_page, rss_mib, serving

TORCH_LIBRARY_MARKS = ("libtorch", "torch/lib/")
"""A mapped file path with one of these is PyTorch's native library (libtorch_cpu.so, ...)."""


def torch_mappings(pid: int) -> list[str]:
    """The distinct files of PyTorch's native libraries the process maps."""
    paths = {
        line.split()[-1]
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
        if any(mark in line for mark in TORCH_LIBRARY_MARKS)
    }
    return sorted(paths)


def main() -> None:
    """Run one analysis on a fresh server and print its RSS and torch mappings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to serve")
    parser.add_argument("--query", default="model=tiny-bert&max_batch=64")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with serving(None, args.root.resolve()) as (server, url):
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                seconds = analyze_in_page(browser.new_page(), url, args.query)
            finally:
                browser.close()
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes().replace(b"\0", b" ")
        assert b"streamlit run" in cmdline, cmdline  # the server, not a worker
        mapped = torch_mappings(server.pid)
        print(f"checkout {args.root.resolve()}; {os.cpu_count()} cores; analysis {args.query} "
              f"answered in {seconds:.1f} s")  # fmt: skip
        names = ", ".join(Path(m).name for m in mapped)
        print(f"server pid {server.pid}: RSS {rss_mib(server.pid):.0f} MiB; libtorch mapped: "
              f"{f'yes ({names})' if mapped else 'no'}")  # fmt: skip


if __name__ == "__main__":
    main()
