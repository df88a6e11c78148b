"""End to end in a real browser: `streamlit run app.py`, headless Chromium, click Analyze, see it,
and the server process itself never maps libtorch (its workers do).

Uses Debian's /usr/bin/chromium through Playwright (a browser download is impossible here);
skipped only when that binary is missing. The tiny model comes from the URL's query string.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
def server_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the server writes stdout and stderr."""
    return tmp_path_factory.mktemp("streamlit") / "server.log"


@pytest.fixture(scope="module")
def app_server(server_log: Path) -> Iterator[tuple[str, int]]:
    """The server's URL and the pid of the `streamlit run` process itself (no shell between)."""
    port = free_port()
    log = server_log
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
               "--server.address", "127.0.0.1", "--server.port", str(port)]  # fmt: skip
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server, log)
        yield url, server.pid
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.fixture(scope="module")
def app_url(app_server: tuple[str, int]) -> str:
    return app_server[0]


def torch_lines(pid: int) -> list[str]:
    """The lines of /proc/<pid>/maps that map PyTorch's native libraries (libtorch_cpu.so...)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return [line for line in maps if "libtorch" in line or "torch/lib/" in line]


def maps_torch(pid: int) -> bool:
    """True when the process maps libtorch; False too when it has ended."""
    try:
        return bool(torch_lines(pid))
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (the forkserver, its workers, the resource tracker)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended while we looked
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        above = todo.pop()
        children = [child for child, parent in parents.items() if parent == above]
        found += children
        todo += children
    return found


@contextlib.contextmanager
def answered(url: str, query: str) -> Iterator[Any]:
    """A headless Chromium page of the app at `url?query`, once Analyze was clicked and the
    answer shows."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/?{query}", timeout=60_000)
            analyze = page.get_by_role("button", name="Analyze")
            analyze.wait_for(timeout=60_000)
            analyze.click()
            # The first sweep may wait for the worker pool's forkserver to warm up (it imports
            # torch and transformers and simulates a tiny model of each kind: 17-26 s measured
            # on a loaded 2-core machine).
            expect(page.get_by_text("Optimal batch size")).to_be_visible(timeout=120_000)
            yield page
        finally:
            browser.close()


def test_analyze_in_a_real_browser_draws_the_chart_and_the_answer(app_url: str) -> None:
    from playwright.sync_api import expect

    with answered(app_url, "model=tiny-bert&max_batch=64") as page:
        expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=30_000)
        expect(page.get_by_text("Every batch up to 64 fits")).to_be_visible()
        # expect() retries: right after the rerun, Streamlit may still show the live log.
        expect(page.locator("code").first).to_contain_text("batch   64 fits", timeout=30_000)
        expect(page.locator(".js-plotly-plot").nth(1)).to_be_visible()  # throughput chart
        expect(page.get_by_role("tab", name="Hugging Face")).to_be_visible()
        expect(page.get_by_text("per_device_train_batch_size=64,")).to_be_visible()


def test_the_server_process_never_maps_libtorch_during_an_analysis(
    app_server: tuple[str, int],
) -> None:
    from playwright.sync_api import expect

    url, pid = app_server
    assert b"streamlit\0run\0app.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    # Settings of their own, so the sweep runs even after the other test's.
    with answered(url, "model=tiny-bert&max_batch=32&current_batch=4") as page:
        expect(page.get_by_text("Every batch up to 32 fits")).to_be_visible()
        # The sidebar's parameter count, counted by a worker (the server has no torch).
        expect(page.get_by_text(re.compile(r"M parameters · "))).to_be_visible()
    assert torch_lines(pid) == []
    # The check sees torch where it is: the workers' forkserver has it loaded.
    assert any(maps_torch(child) for child in descendants(pid))


def test_the_server_log_stays_quiet_through_an_analysis(app_url: str, server_log: Path) -> None:
    # Workers once re-ran the page script bare (as multiprocessing's __main__) before each job,
    # logging about 36 "missing ScriptRunContext" lines per analysis; and the welcome block is
    # off (.streamlit/config.toml, [logger] hideWelcomeMessage).
    with answered(app_url, "model=tiny-bert&max_batch=16&current_batch=2"):
        pass
    log = server_log.read_text()
    assert "missing ScriptRunContext" not in log
    assert "streamlit run [FILE_NAME]" not in log  # st.* called in a bare worker
    assert "You can now view your Streamlit app" not in log


def test_a_url_in_a_link_is_no_link_in_the_apps_own_warning(app_url: str) -> None:
    # Reported: /?gpu=https://evil.example put a working link in "Ignored the link's settings":
    # Streamlit's GFM autolinks it even backslash-escaped. A code span (ui.literal) stops that.
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{app_url}/?gpu=https://evil.example", timeout=60_000)
            warning = page.locator('[data-testid="stAlert"]', has_text="Ignored the link")
            expect(warning).to_contain_text("unknown GPU 'https://evil.example'", timeout=60_000)
            assert warning.locator("a").count() == 0
        finally:
            browser.close()
