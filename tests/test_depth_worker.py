"""The depth worker: the depths it traces in a second process are the depths this process
would trace, byte for byte, and a worker that dies hands its depths back
(memorymark/backends/depth_worker.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from memorymark import Session, Settings
from memorymark.accounting.depth import difference
from memorymark.backends import depth_replay, depth_worker
from memorymark.backends.depth_worker import RemoteShallower
from memorymark.models import CONFIG_DIR
from memorymark.models.depth import LayerPlan

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.usefixtures("any_config_path"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a worker needs a second core"),
]

COMPARED = ("peak_bytes", "required_bytes", "demand_bytes", "predicted_reserved_bytes",
            "loop_reserved_bytes", "breakdown", "timeline", "step_flops", "fits",
            "runs")  # fmt: skip


@pytest.fixture
def worker_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker allowed, started afresh for the test and stopped after it; any depth
    replayed (a full trace to compare with stays quick)."""
    monkeypatch.setenv(depth_worker.ENV_SWITCH, "1")
    monkeypatch.setattr(depth_worker, "_WORKER", None)
    monkeypatch.setattr(depth_replay, "_STRUCTURES", {})
    monkeypatch.setattr(LayerPlan, "worth_replaying", lambda self: self.layers > self.depths()[-1])
    yield
    if depth_worker._WORKER is not None:
        depth_worker._WORKER.stop()


def _model(tmp_path: Path) -> str:
    data = json.loads((CONFIG_DIR / "tiny-llama.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")} | {"num_hidden_layers": 8}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return f"file:{path}"


def _steps(model: str, batches: tuple[int, ...], **settings: object) -> list[tuple]:
    s = Settings(model=model, gpu="a10", backend="sim", seq_len=32, **settings)
    backend = Session(s).open_backend()
    backend.keep_records()
    with backend.session():
        steps = [(backend.measure(b), backend.last_record) for b in batches]
        remote = [v for v in backend._depth._variants.values() if isinstance(v, RemoteShallower)]
        steps.append((backend.depth_replay, len(remote)))
    return steps


@pytest.mark.usefixtures("worker_on")
@pytest.mark.parametrize("dist", ["none", "fsdp"])
def test_depths_traced_in_the_worker_are_the_ones_traced_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dist: str
) -> None:
    model = _model(tmp_path)
    spread = {"dist": dist, "gpus": "4"} if dist == "fsdp" else {}
    with_worker = _steps(model, (2, 4, 3), precision="bf16-mixed", **spread)
    *steps, (summary, remote) = with_worker
    assert remote == 2 and summary.fallback is None  # of 2, 3, 4 and 5 blocks: 3 and 5 there
    monkeypatch.setenv(depth_worker.ENV_SWITCH, "0")
    monkeypatch.setattr(depth_replay, "_STRUCTURES", {})
    *here, (summary_here, none) = _steps(model, (2, 4, 3), precision="bf16-mixed", **spread)
    assert none == 0 and summary_here.traced_steps == summary.traced_steps
    for (m, record), (m_here, record_here) in zip(steps, here, strict=True):
        assert difference(record, record_here) is None
        for name in COMPARED:
            assert getattr(m, name) == getattr(m_here, name), name


@pytest.mark.usefixtures("worker_on")
def test_a_worker_that_dies_hands_its_depths_back(tmp_path: Path) -> None:
    model = _model(tmp_path)
    s = Settings(model=model, gpu="a10", backend="sim", seq_len=32)
    backend = Session(s).open_backend()
    with backend.session():
        first = backend.measure(2)
        depth_worker._WORKER._process.kill()  # the worker's depths (3 and 5) are lost with it
        depth_worker._WORKER._process.join()
        second = backend.measure(4)
        variants = backend._depth._variants.values()
        assert not any(isinstance(v, RemoteShallower) for v in variants)
        assert backend.depth_replay.fallback is None
    traced = Session(s.replace(depth="trace")).open_backend()
    with traced.session():
        assert traced.measure(2).required_bytes == first.required_bytes
        assert traced.measure(4).required_bytes == second.required_bytes
    assert depth_worker.worker() is None  # not started again in this process


def test_the_switch_keeps_every_depth_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(depth_worker, "_WORKER", None)
    monkeypatch.setenv(depth_worker.ENV_SWITCH, "0")
    assert depth_worker.worker() is None and depth_worker._WORKER is None


def test_a_hosted_server_keeps_every_depth_in_its_job_unless_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(depth_worker.ENV_SWITCH)
    monkeypatch.setenv("MEMORYMARK_HOSTED", "true")
    assert not depth_worker.switched_on()
    monkeypatch.setenv(depth_worker.ENV_SWITCH, "1")
    assert depth_worker.switched_on()
    monkeypatch.delenv("MEMORYMARK_HOSTED")
    monkeypatch.delenv(depth_worker.ENV_SWITCH)
    assert depth_worker.switched_on()
