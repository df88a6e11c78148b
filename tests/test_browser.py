"""End to end in a real browser: `streamlit run app.py`, headless Chromium, click Analyze, see it.

Uses Debian's /usr/bin/chromium through Playwright (a browser download is impossible here);
skipped only when that binary is missing. The tiny model comes from the URL's query string.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
START_TIMEOUT_S = 60

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is not installed"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert server.poll() is None, f"streamlit exited: {log.read_text()}"
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    pytest.fail(f"streamlit did not answer on {url} within {START_TIMEOUT_S} s")


@pytest.fixture(scope="module")
def app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
               "--server.address", "127.0.0.1", "--server.port", str(port)]  # fmt: skip
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server, log)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def test_analyze_in_a_real_browser_draws_the_chart_and_the_answer(app_url: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{app_url}/?model=tiny-bert&max_batch=64", timeout=60_000)
            analyze = page.get_by_role("button", name="Analyze")
            analyze.wait_for(timeout=60_000)
            analyze.click()
            # The first sweep may wait for the worker pool's forkserver to warm up (it imports
            # torch and transformers and simulates a tiny model of each kind: 17-26 s measured
            # on a loaded 2-core machine).
            expect(page.get_by_text("Optimal batch size")).to_be_visible(timeout=120_000)
            expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=30_000)
            expect(page.get_by_text("Every batch up to 64 fits")).to_be_visible()
            # expect() retries: right after the rerun, Streamlit may still show the live log.
            expect(page.locator("code").first).to_contain_text("batch   64 fits", timeout=30_000)
            expect(page.locator(".js-plotly-plot").nth(1)).to_be_visible()  # throughput chart
            expect(page.get_by_role("tab", name="Hugging Face")).to_be_visible()
            expect(page.get_by_text("per_device_train_batch_size=64,")).to_be_visible()
        finally:
            browser.close()
