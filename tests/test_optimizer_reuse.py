"""The simulation runs the optimizer phase once (for AdamW, not even once: priming's first step
already ran its update) and splices its record into later probes; every figure a probe reports
is the one running it again would give."""

from dataclasses import fields

import pytest

from memorymark import gpus
from memorymark.backends import resolve
from memorymark.backends.device import CpuBackend
from memorymark.backends.sim import SimBackend
from memorymark.fit import FitPolicy
from memorymark.settings import Settings
from memorymark.step.catalog import CatalogStep

BATCHES = (4, 2, 16, 3)  # up, down, and an odd one: the record must not depend on the order

CASES = {
    "bert-adamw": Settings(model="tiny-bert", seq_len=32),
    "bert-forloop": Settings(model="tiny-bert", seq_len=32, optimizer="adamw-forloop"),
    "bert-fused-bf16mixed": Settings(
        model="tiny-bert", seq_len=32, optimizer="adamw-fused", precision="bf16-mixed"
    ),
    "llama-lora-bf16true": Settings(
        model="tiny-llama", seq_len=32, lora_rank=4, precision="bf16-true"
    ),
    "bert-16mixed-clip-accum": Settings(
        model="tiny-bert", seq_len=32, precision="16-mixed", max_grad_norm=1.0, grad_accum=2
    ),
    "bert-adafactor": Settings(model="tiny-bert", seq_len=32, optimizer="adafactor"),
    "gpt2-clip": Settings(model="tiny-gpt2", seq_len=32, max_grad_norm=1.0),
    "gpt2-lora": Settings(model="tiny-gpt2", seq_len=32, lora_rank=4),
    "gpt2-sgd-bf16true": Settings(
        model="tiny-gpt2", seq_len=32, optimizer="sgd", precision="bf16-true"
    ),
    "gpt2-checkpointing": Settings(model="tiny-gpt2", seq_len=32, grad_checkpointing=True),
    "resnet-adamw": Settings(model="tiny-resnet", image_size=32),
    "resnet-16mixed": Settings(model="tiny-resnet", image_size=32, precision="16-mixed"),
    "resnet-adafactor-clip": Settings(
        model="tiny-resnet", image_size=32, optimizer="adafactor", max_grad_norm=0.5
    ),
    "bert-none": Settings(model="tiny-bert", seq_len=32, optimizer="none"),
}


def _probes(settings, reuse):
    """Each probe's Measurement, the tracker's event log after it, and how many times the
    optimizer phase really ran."""
    backend = resolve.resolve(settings, gpu=gpus.find_gpu("a10")).open_backend()  # a roofline
    backend.reuse_optimizer_step = reuse
    ran = []
    run_optimizer = backend._run_optimizer
    backend._run_optimizer = lambda phase: run_optimizer(lambda: (ran.append(1), phase()))
    measurements, logs = [], []
    with backend.session():
        for batch in BATCHES:
            measurements.append(backend.measure(batch))
            logs.append((backend._tracker.events_first_seq, list(backend._tracker.events)))
    return measurements, logs, len(ran)


@pytest.mark.parametrize("settings", CASES.values(), ids=CASES.keys())
def test_a_spliced_optimizer_phase_gives_every_figure_running_it_gives(settings):
    full, full_logs, full_runs = _probes(settings, reuse=False)
    spliced, spliced_logs, spliced_runs = _probes(settings, reuse=True)
    for ran, reused in zip(full, spliced, strict=True):
        # Every field, the timeline (which equality skips) and the estimated throughput too.
        for f in fields(ran):
            assert getattr(reused, f.name) == getattr(ran, f.name), f.name
        assert ran.step_flops is None or ran.step_flops > 0
    assert full_runs == (0 if settings.workload.optimizer == "none" else len(BATCHES))
    if settings.workload.precision == "32-true":
        # The allocator replay reads this log. (Under autocast its cast cache frees its copies
        # in hash order, so there the order of frees between two operators varies run to run.)
        assert spliced_logs == full_logs
    # AdamW's first step (priming) makes its state, then runs the update every later step
    # runs: that update is the record, so no probe runs the phase; not with a GradScaler or
    # clipping around it. Adafactor replaces its RMS every step: the first probe frees what
    # priming left, so the record that repeats is the second probe's.
    state_first = (
        settings.workload.optimizer in ("adamw", "adamw-forloop", "adamw-fused")
        and settings.workload.max_grad_norm is None
        and settings.workload.precision != "16-mixed"
    )
    expected = {"none": 0, "adafactor": 2}.get(settings.workload.optimizer, 0 if state_first else 1)
    assert spliced_runs == expected


def test_the_switch_and_the_environment_turn_reuse_off(monkeypatch):
    step = CatalogStep(CASES["bert-adamw"])
    assert SimBackend(step, policy=FitPolicy(capacity_bytes=2**33)).reuse_optimizer_step
    assert not SimBackend(
        step, policy=FitPolicy(capacity_bytes=2**33), reuse_optimizer_step=False
    ).reuse_optimizer_step
    monkeypatch.setenv("MEMORYMARK_REUSE_OPTIMIZER_STEP", "0")
    assert not SimBackend(step, policy=FitPolicy(capacity_bytes=2**33)).reuse_optimizer_step


def test_real_tensors_run_the_optimizer_at_every_probe():
    backend = CpuBackend(CatalogStep(CASES["bert-adamw"]), policy=FitPolicy(capacity_bytes=2**33))
    ran = []
    run_optimizer = backend._run_optimizer
    backend._run_optimizer = lambda phase: run_optimizer(lambda: (ran.append(1), phase()))
    with backend.session():
        backend.measure(2)
        backend.measure(3)
    assert len(ran) == 2
