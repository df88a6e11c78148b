"""Real-GPU checks: skipped here (no CUDA), run by anyone with a GPU (`pytest -m gpu`)."""

import pytest
import torch

from memorymark.engine import Session
from memorymark.settings import Settings

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_a_measured_step_reports_the_device_peak_and_time():
    m = Session(Settings(model="tiny-bert", seq_len=32, backend="cuda")).measure(8)
    assert m.fits and m.measured
    assert m.reserved_bytes >= m.peak_bytes > 0
    assert m.step_seconds > 0 and m.samples_per_second > 0


def test_simulation_predicts_the_measured_allocated_peak_within_ten_percent():
    session = Session(Settings(model="bert", backend="cuda"))
    real = session.measure(16)
    sim = Session(Settings(model="bert", backend="sim"), gpu=session.gpu).measure(16)
    assert sim.cuda_allocated_bytes == pytest.approx(real.peak_bytes, rel=0.10)


def test_an_oom_probe_leaves_the_next_probe_at_the_same_baseline():
    settings = Settings(model="bert", backend="cuda", max_batch=65536)
    backend = Session(settings).open_backend()
    before = backend.measure(8)
    huge = backend.measure(65536)
    after = backend.measure(8)
    backend.release()
    assert before.fits and after.fits and not huge.fits
    assert after.peak_bytes == before.peak_bytes
