"""hf: with the hub unreachable: one line within seconds, never a minute of retries."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cli(tmp_path, endpoint, **env):
    """`memorymark measure hf:org/model` against `endpoint`, with an empty hub cache."""
    full_env = {
        **os.environ,
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "0",
        "PYTHONPATH": str(ROOT),
        **env,
    }
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "memorymark", "measure", "hf:org/model", "--batch-size", "1"],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
    )
    return done, time.perf_counter() - started


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again once this returns: connections are refused


def test_a_refused_connection_fails_in_one_line_without_retries(tmp_path):
    done, seconds = run_cli(tmp_path, f"http://127.0.0.1:{closed_port()}")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "memorymark: error: could not fetch org/model's config.json from the Hugging Face hub "
        "(ConnectError); download it where the hub is reachable and pass --config-file PATH"
    ]
    assert seconds < 10  # the import is most of it; huggingface_hub alone retried for 25-47 s


@pytest.fixture
def silent_server():
    """A port that accepts connections and never answers (a hub behind a black hole)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_hub_that_never_answers_times_out_once(tmp_path, silent_server):
    # HF_HUB_ETAG_TIMEOUT is huggingface_hub's own setting, honoured; telemetry off skips the
    # library's one-off agent-registry request (3 s more against a silent host).
    done, seconds = run_cli(
        tmp_path, silent_server, HF_HUB_ETAG_TIMEOUT="1", HF_HUB_DISABLE_TELEMETRY="1"
    )
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1
    assert "(ReadTimeout); download it where the hub is reachable" in done.stderr
    assert seconds < 10
