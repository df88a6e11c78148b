"""The front door (issue 9): one Session resolves the GPU, backend and fit policy once; its
docstring examples run as written."""

import doctest

import pytest

import memorymark
from memorymark import Session, Settings, engine
from memorymark.cuda_rules import versions
from memorymark.environment import torch_version


def test_the_docstring_examples_run():
    for module in (engine, memorymark):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0


def test_a_session_resolves_once_and_answers_for_its_gpu():
    session = Session(Settings(model="tiny-bert", seq_len=32, gpu="h100"))
    assert (session.backend_name, session.gpu.name) == ("sim", "H100 80GB")
    assert not session.runs_for_real
    assert session.memory_source == "simulated"
    assert session.policy.capacity_bytes == session.gpu.usable_bytes
    m = session.measure(4)
    assert m.fits and m.backend == "sim"
    # Every measurement of the session is judged by the same policy.
    assert m.required_bytes <= session.policy.limit_bytes


def test_a_session_can_judge_against_another_gpu():
    t4 = memorymark.gpus.find_gpu("t4")
    session = Session(Settings(model="tiny-bert", seq_len=32, gpu="h100"), gpu=t4)
    assert session.gpu is t4 and session.policy.capacity_bytes == t4.usable_bytes


def test_report_carries_the_plan_and_the_torch_that_ran():
    session = Session(Settings(model="tiny-bert", seq_len=32, max_batch=64, target_batch=96))
    report = session.analyze()
    assert report.plan is not None and report.plan.effective_batch == 96
    assert report.torch_version == torch_version()
    assert report.unverified_rules == versions.unverified_rules()  # () on the rules' releases


def test_bad_settings_fail_before_anything_is_built():
    with pytest.raises(ValueError, match="no bf16 support"):
        Session(Settings(model="tiny-bert", gpu="v100 16gb", precision="bf16-true"))


def test_the_report_carries_what_the_backend_says_of_its_depth(monkeypatch):
    """Issue 31: the simulated backend says how it had its full-depth steps (`depth_replay`);
    the session keeps it after the sweep, however the sweep ends, and the report says it."""
    from memorymark.backends.sim import SimBackend
    from memorymark.measurement import DepthReplay

    said = DepthReplay(layers=2, traced_depths=(), traced_steps=0, replayed_steps=0,
                       fallback="a 2-block model has no fewer blocks to trace")  # fmt: skip
    monkeypatch.setattr(SimBackend, "depth_replay", said, raising=False)
    settings = Settings(model="tiny-bert", seq_len=32, gpu="a10", max_batch=16, depth="trace")
    session = Session(settings)
    assert session.depth_replay is None  # nothing swept yet
    report = session.analyze(fixes=False, plan=False)
    assert session.depth_replay == report.depth_replay == said
    assert report.depth_note == (
        "The full model traced (2 blocks, simulated): a 2-block model has no fewer blocks to trace."
    )
    stopped = Session(settings)
    probes = stopped.stream()
    next(probes)
    probes.close()  # a consumer that stops early (the app's Cancel) still knows it
    assert stopped.depth_replay == said
