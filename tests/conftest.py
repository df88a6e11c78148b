"""Shared fixtures: tiny models that run in milliseconds on CPU, and a backend whose memory is a
known function of batch size, for testing search strategies exactly."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memorymark.measurement import Measurement
from memorymark.settings import Settings


@pytest.fixture(autouse=True)
def no_depth_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every depth traced in the test's own process, where its monkeypatches apply (a worker
    process runs the code unpatched); tests/test_depth_worker.py turns the worker on."""
    monkeypatch.setenv("MEMORYMARK_DEPTH_WORKER", "0")


@pytest.fixture(autouse=True)
def history_db(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test saves its analyses to a database of its own, never the user's history."""
    path = tmp_path_factory.mktemp("history") / "history.sqlite3"
    monkeypatch.setenv("MEMORYMARK_DB", str(path))
    monkeypatch.delenv("MEMORYMARK_HISTORY", raising=False)
    return path


@pytest.fixture
def tiny_bert() -> Settings:
    """A 2-layer BERT on a simulated A10."""
    return Settings(model="tiny-bert", seq_len=32, gpu="a10", backend="sim")


class FunctionBackend:
    """A backend whose step allocates `timeline(batch)`: it fits when the peak is within
    `limit_bytes` (the capacity less the margin) and runs when it is within `capacity_bytes`.
    `required` replaces the peak as what the device holds (reserved > live); `demand`, what
    it would reserve with nothing limiting it, when more than that (a step that runs only
    after a cache flush): the fit verdict then reads it, as the simulation's does."""

    name = "fake"
    measured = False

    def __init__(
        self,
        timeline: Callable[[int], tuple[int, ...]],
        limit_bytes: int,
        capacity_bytes: int | None = None,
        required: Callable[[int], int] | None = None,
        demand: Callable[[int], int] | None = None,
    ) -> None:
        self.timeline = timeline
        self.required = required
        """What the device holds at a batch, when not the timeline's peak (reserved > live)."""
        self.demand = demand
        self.limit_bytes = limit_bytes
        self.capacity_bytes = capacity_bytes or limit_bytes
        self.tried: list[int] = []
        self.released = False

    def measure(self, batch_size: int) -> Measurement:
        self.tried.append(batch_size)
        timeline = self.timeline(batch_size)
        peak = max(timeline)
        required = self.required(batch_size) if self.required else peak
        demand = self.demand(batch_size) if self.demand else None
        runs = required <= self.capacity_bytes
        return Measurement(
            batch_size=batch_size,
            fits=runs and max(required, demand or 0) <= self.limit_bytes,
            runs=runs,
            peak_bytes=peak,
            required_bytes=required if runs or demand is None else demand,
            demand_bytes=demand,
            backend=self.name,
            measured=False,
            timeline=timeline,
        )

    def release(self) -> None:
        self.released = True


@pytest.fixture
def function_backend() -> type[FunctionBackend]:
    """The FunctionBackend class, to build with a timeline and a capacity."""
    return FunctionBackend


@pytest.fixture
def any_config_path() -> Iterator[None]:
    """Config files from anywhere: the app limits them to its upload folder once imported,
    and the config tests read tmp_path."""
    from memorymark.models import sources

    before = sources._config_root
    sources.restrict_config_files(None)
    yield
    sources.restrict_config_files(before)


# The app tests' fixtures: imported lazily so engine-only test runs never load Streamlit.
class DeviceLock:
    """The workers' per-device file lock, held by the test as if another session measured."""

    def __init__(self, path: Path) -> None:
        self.path, self._file = path, None

    def acquire(self) -> None:
        import fcntl

        self._file = open(self.path, "a+b")
        fcntl.flock(self._file, fcntl.LOCK_EX)

    def release(self) -> None:
        assert self._file is not None
        self._file.close()  # closing drops the lock
        self._file = None


@pytest.fixture
def fresh_caches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> DeviceLock:
    """An app test's own result cache, device lock file and server (process-wide in the app):
    the server allows the cpu backend, and sweeps run on threads of the test process."""
    from memorymark.service import jobs
    from memorymark.service.executors import thread_service
    from memorymark.service.server_config import ServerConfig
    from memorymark.ui import sweep_runner

    cache, service = sweep_runner.ResultCache(), thread_service()
    monkeypatch.setattr(sweep_runner, "result_cache", lambda: cache)
    monkeypatch.setattr(sweep_runner, "sweep_service", lambda: service)
    server = ServerConfig(allow_cpu_backend=True)
    monkeypatch.setattr(sweep_runner, "server_config", lambda: server)
    monkeypatch.setattr(jobs, "lock_path", lambda backend: tmp_path / f"{backend}.lock")
    return DeviceLock(tmp_path / "cpu.lock")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[type]:
    """Make the main page's sweeps run a fresh FakeSession subclass (class state per test), on
    threads of the test process (a worker process would not see the patch)."""
    from app_helpers import FakeSession

    from memorymark.service import jobs
    from memorymark.service.executors import thread_service
    from memorymark.ui import sweep_runner

    class Fake(FakeSession):
        created: list[Settings] = []

    monkeypatch.setattr(jobs, "Session", Fake)
    service = thread_service()
    monkeypatch.setattr(sweep_runner, "sweep_service", lambda: service)
    yield Fake
    if Fake.gate is not None:
        Fake.gate.set()  # a test that failed mid-sweep leaves no thread waiting


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event a fake probe waits on (up to GATE_SECONDS); opened at teardown whatever happens."""
    event = threading.Event()
    yield event
    event.set()
