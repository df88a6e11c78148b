"""Prints what several users cost the app, each figure measured in this one run.

1. Three users at once: three browser sessions (headless Chromium through Playwright: one
   browser, three pages, each its own Streamlit session) open `streamlit run app.py`, click
   Analyze within a second of each other and wait for the answer ("Optimal batch size"); against
   the same three analyses as three `python -m memorymark analyze ... --json` processes started
   together. Printed: each wall time (first click or start to the last answer) and app / CLI.
2. Server memory: one session runs `--sweeps` analyses one after another (a different current
   batch each, so none is served from the cache); the streamlit process's RSS (its own, not the
   workers') after each. Printed: RSS before, after the first and after the last, and last / first.

The server is warmed first (one tiny analysis), as a running server is. Each user's analysis is
`MODEL` on `GPU` with current batch 8, 16 and 32.

    python benchmarks/app_load.py [--model bert-large] [--gpu A10] [--workers N] [--sweeps 20]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
ANSWER_TIMEOUT_MS = 900_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(
    workers: int | None,
    root: Path = ROOT,
    *,
    python: str = sys.executable,
    entrypoint: str = "app.py",
    env: dict[str, str] | None = None,
) -> Iterator[tuple[subprocess.Popen, str]]:
    """`streamlit run app.py` (or `entrypoint`) of the checkout at `root`, by `python`, on a free
    localhost port with `env` added, once healthy, stopped on leaving; the process is the server
    itself (its workers are its children)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(root), "MEMORYMARK_MAX_TIME_LIMIT": "900", **(env or {})}
    if workers:
        env["MEMORYMARK_WORKERS"] = str(workers)
    command = [python, "-m", "streamlit", "run", entrypoint, "--server.headless", "true",
               "--server.address", "127.0.0.1", "--server.port", str(port)]  # fmt: skip
    server = subprocess.Popen(
        command, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            time.sleep(0.25)
    else:
        server.kill()
        raise SystemExit("streamlit did not start")
    try:
        yield server, url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def analyze_in_page(page, url: str, query: str) -> float:
    """Open the app with `query`, click Analyze, wait for the answer; seconds from the click."""
    from playwright.sync_api import expect

    page.goto(f"{url}/?{query}", timeout=120_000)
    analyze = page.get_by_role("button", name="Analyze")
    analyze.wait_for(timeout=120_000)
    began = time.perf_counter()
    analyze.click()
    expect(page.get_by_text("Optimal batch size")).to_be_visible(timeout=ANSWER_TIMEOUT_MS)
    return time.perf_counter() - began


def three_users(url: str, queries: list[str]) -> float:
    """Three sessions (three pages of one browser) click Analyze within a second; wall seconds
    from the first click to the last answer seen."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            pages = [browser.new_page(viewport={"width": 1400, "height": 1000}) for _ in queries]
            for page, query in zip(pages, queries, strict=True):
                page.goto(f"{url}/?{query}", timeout=120_000)
                page.get_by_role("button", name="Analyze").wait_for(timeout=120_000)
            began = time.perf_counter()
            for page in pages:
                page.get_by_role("button", name="Analyze").click()
            for page in pages:  # the last one seen is the wall time's end, whichever it is
                answer = page.get_by_text("Optimal batch size")
                expect(answer).to_be_visible(timeout=ANSWER_TIMEOUT_MS)
            return time.perf_counter() - began
        finally:
            browser.close()


def three_clis(model: str, gpu: str, batches: list[int]) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "memorymark",
                "analyze",
                model,
                "--gpu",
                gpu,
                "--current-batch",
                str(b),
                "--json",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for b in batches
    ]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a CLI run failed: exit statuses {codes}")
    return time.perf_counter() - began


def rss_mib(pid: int) -> float:
    """The process's resident memory, in MiB."""
    return psutil.Process(pid).memory_info().rss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-large")
    parser.add_argument("--gpu", default="A10")
    parser.add_argument("--workers", type=int, help="MEMORYMARK_WORKERS (default: one per core)")
    parser.add_argument("--sweeps", type=int, default=20, help="RSS sweeps (0: none)")
    parser.add_argument("--rss-model", default="tiny-bert", help="model of the RSS sweeps")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    batches = [8, 16, 32]
    queries = [f"model={args.model}&gpu={args.gpu}&current_batch={b}" for b in batches]
    with serving(args.workers) as (server, url):
        with sync_playwright() as p:  # warm the server: one tiny analysis
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page()
            warm = analyze_in_page(page, url, "model=tiny-bert&max_batch=64")
            browser.close()
        print(f"cpu cores {os.cpu_count()}, workers {args.workers or 'default (one per core)'}")
        print(f"warm-up analysis (tiny-bert) in the app: {warm:.1f} s")
        app_s = three_users(url, queries)
        cli_s = three_clis(args.model, args.gpu, batches)
        print(f"three users at once, {args.model} on {args.gpu}: app {app_s:.1f} s, "
              f"three CLI processes {cli_s:.1f} s, app / CLI = {app_s / cli_s:.2f}")  # fmt: skip
        if args.sweeps < 1:
            return
        before = rss_mib(server.pid)
        rss = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page()
            for i in range(args.sweeps):
                query = f"model={args.rss_model}&gpu={args.gpu}&current_batch={i + 1}&max_batch=64"
                analyze_in_page(page, url, query)
                rss.append(rss_mib(server.pid))
            browser.close()
        print(f"server RSS over {args.sweeps} sequential {args.rss_model} sweeps: before "
              f"{before:.0f} MiB, after the first {rss[0]:.0f} MiB, after the last {rss[-1]:.0f} "
              f"MiB (last / first = {rss[-1] / rss[0]:.2f}); each: "
              + " ".join(f"{r:.0f}" for r in rss))  # fmt: skip


if __name__ == "__main__":
    main()
