"""The app's server asks workers what only torch knows. A worker reports the machine's GPUs once,
and the engine's own decision (memorymark/backends/selection.py) turns a `Settings` into the same
`GPU` record a `Session` in the worker uses, NCCL's buffers included; a model's parameter count
is counted by a worker too, and the sidebar does not wait long for it."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from types import SimpleNamespace

import pytest
from app_helpers import app

from memorymark import gpus, models
from memorymark.backends import resolve, selection
from memorymark.backends.selection import LocalGPUs
from memorymark.distributed import topology
from memorymark.engine import Session
from memorymark.service import questions
from memorymark.service.executors import local_service, thread_service
from memorymark.settings import Settings
from memorymark.ui import model_inputs, page_runs, sidebar, sweep_runner

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)

A10_TOTAL_BYTES = 23609475072  # torch.cuda.get_device_properties(0).total_memory on an A10


class FakeCuda(SimpleNamespace):
    """torch.cuda as a machine with one A10 answers the questions that resolve a GPU."""

    def is_available(self) -> bool:
        return True

    def get_device_properties(self, index: int) -> SimpleNamespace:
        return SimpleNamespace(name="NVIDIA A10", total_memory=A10_TOTAL_BYTES, major=8, minor=6)


SETTINGS = [
    Settings(model="tiny-bert"),
    Settings(model="tiny-bert", gpu="a10"),
    Settings(model="tiny-bert", gpu="h100"),
    Settings(model="tiny-bert", gpu_memory_gib=40),
    Settings(model="tiny-bert", backend="sim"),
    Settings(model="tiny-bert", backend="sim", gpu="a10"),
    Settings(model="tiny-bert", gpu="h100", dist="ddp", gpus="8"),
    Settings(model="tiny-bert", gpu="h100", dist="hsdp", gpus="16"),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: s.to_command_line())
def test_the_server_names_the_gpu_a_session_uses_on_a_gpu_machine(settings, monkeypatch):
    reported = LocalGPUs(cuda_gpu=resolve.local_gpu(FakeCuda()))
    monkeypatch.setattr(sweep_runner, "local_gpus", lambda: reported)
    assert page_runs.gpu_for(settings) == Session(settings, cuda=FakeCuda()).gpu


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: s.to_command_line())
def test_the_server_names_the_gpu_a_session_uses_with_no_gpu(settings, monkeypatch):
    monkeypatch.setattr(sweep_runner, "local_gpus", lambda: LocalGPUs())
    assert page_runs.gpu_for(settings) == Session(settings).gpu


def test_the_local_gpu_asked_for_by_name_keeps_the_devices_own_memory():
    here = LocalGPUs(cuda_gpu=resolve.local_gpu(FakeCuda()))
    gpu = selection.answering_gpu(Settings(gpu="a10"), here)
    assert (gpu.name, gpu.total_bytes, gpu.measured) == ("A10", A10_TOTAL_BYTES, True)
    assert selection.answering_gpu(Settings(gpu="a10", backend="sim"), here) == gpus.find_gpu("A10")
    assert selection.answering_gpu(Settings(), LocalGPUs()) == gpus.find_gpu(
        gpus.DEFAULT_SIMULATED_GPU
    )


def test_many_gpus_take_nccls_buffers_out_of_each_rank():
    h100 = gpus.find_gpu("H100")
    ranked = selection.answering_gpu(Settings(gpu="h100", dist="ddp", gpus="8"), LocalGPUs())
    assert ranked.nccl_bytes == topology.nccl_bytes("ddp", 8, 1) > 0
    assert ranked.usable_bytes == h100.usable_bytes - ranked.nccl_bytes


def test_a_real_backend_with_no_such_device_is_refused():
    with pytest.raises(ValueError, match="PyTorch sees no CUDA GPU"):
        selection.answering_gpu(Settings(backend="cuda"), LocalGPUs())
    apple = gpus.custom_gpu(24, name="Apple GPU (MPS)")
    assert selection.answering_gpu(Settings(), LocalGPUs(mps_gpu=apple)) == apple
    assert selection.backend_name(Settings(gpu="t4"), LocalGPUs(mps_gpu=apple)) == "sim"


def test_gpu_for_reads_no_model(monkeypatch):
    monkeypatch.setattr(sweep_runner, "local_gpus", lambda: LocalGPUs())
    unreadable = Settings(model="file:/nonexistent/config.json", gpu="a10")
    assert page_runs.gpu_for(unreadable) == gpus.find_gpu("A10")


def test_a_service_asks_its_worker():
    assert thread_service(inline=True).local_gpus() == questions.local_gpus()
    assert questions.local_gpus() == LocalGPUs(resolve.local_gpu(), resolve.apple_gpu())


def test_a_local_service_asks_a_process_of_its_own():
    service = local_service(1, preload=False)
    try:
        assert service.local_gpus() == questions.local_gpus()  # None here: no GPU on this machine
    finally:
        service.shutdown()


@pytest.fixture
def fresh_probe():
    """The probe's answer is cached once per server process: asked again around the test."""
    sweep_runner.local_gpus.clear()
    yield
    sweep_runner.local_gpus.clear()


@pytest.mark.usefixtures("fresh_caches", "fresh_probe")
def test_the_sidebar_offers_the_gpu_the_worker_reported(monkeypatch):
    h100 = dataclasses.replace(gpus.find_gpu("H100"), measured=True)
    monkeypatch.setattr(questions, "local_gpus", lambda: LocalGPUs(cuda_gpu=h100))
    at = app()
    assert not at.exception
    choice = at.selectbox(key="mm_gpu_choice")
    assert choice.value == sidebar.LOCAL
    assert choice.options[0] == "H100 80GB: this machine (measured)"
    assert sidebar.detected_gpu() == h100


@pytest.fixture
def fresh_counts():
    """Parameter counts are kept once per server process: forgotten around the test."""
    model_inputs._parameter_counts.clear()
    yield
    model_inputs._parameter_counts.clear()


class CountingService:
    """A service whose parameter counts are futures the test settles."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []
        self.futures: list[cf.Future] = []

    def parameter_count(self, model: str, task: str) -> cf.Future:
        self.asked.append((model, task))
        self.futures.append(cf.Future())
        return self.futures[-1]


@pytest.mark.usefixtures("fresh_counts")
def test_the_sidebar_asks_a_worker_once_and_does_not_wait_for_a_slow_count(monkeypatch):
    service = CountingService()
    monkeypatch.setattr(sweep_runner, "page_service", lambda: service)
    monkeypatch.setattr(model_inputs, "COUNT_WAIT_SECONDS", 0.01)
    assert model_inputs.parameter_count("tiny-bert", "sequence-classification") is None
    service.futures[0].set_result(4_386)
    assert model_inputs.parameter_count("tiny-bert", "sequence-classification") == 4_386
    assert service.asked == [("tiny-bert", "sequence-classification")]


@pytest.mark.usefixtures("fresh_counts")
def test_the_count_is_the_engines_own():
    task = models.find_model("tiny-bert").default_task
    expected = models.parameter_count(models.find_model("tiny-bert"), task)
    assert questions.parameter_count("tiny-bert", task) == expected
    assert model_inputs.parameter_count("tiny-bert", task) == expected  # inline: no server
