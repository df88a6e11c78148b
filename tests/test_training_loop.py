"""The loop people run (issue 8): accumulation, clipping, the optimizer's implementation."""

import pytest

from memorymark.backends.sim import SimBackend
from memorymark.fit import FitPolicy
from memorymark.settings import Settings
from memorymark.step.catalog import CatalogStep

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)

BIG = 8 * 2**30


def measure(settings, batch=16):
    m = SimBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG)).measure(batch)
    assert m.fits
    return m


def _trainable_bytes(settings):
    model = CatalogStep(settings).build_model()
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def test_accumulation_keeps_every_gradient_alive_through_the_next_micro_batch():
    s = Settings(model="tiny-bert", seq_len=32)
    one = measure(s)
    two = measure(s.replace(grad_accum=2))
    grads = _trainable_bytes(s)
    # The second micro-batch's forward and backward run with all gradients already allocated.
    assert two.peak_bytes - one.peak_bytes >= 0.9 * grads
    assert two.breakdown.gradients == grads


def test_the_peak_is_the_same_for_any_accumulation_past_one():
    s = Settings(model="tiny-gpt2", seq_len=32)
    assert (
        measure(s.replace(grad_accum=2)).peak_bytes == measure(s.replace(grad_accum=5)).peak_bytes
    )


def test_clipping_adds_only_small_temporaries_on_a_full_step():
    s = Settings(model="tiny-bert", seq_len=32)
    plain = measure(s)
    clipped = measure(s.replace(max_grad_norm=1.0))
    assert clipped.peak_bytes >= plain.peak_bytes
    assert clipped.peak_bytes - plain.peak_bytes < 0.05 * _trainable_bytes(s)


def test_clipping_under_a_grad_scaler_unscales_once():
    s = Settings(
        model="tiny-bert", seq_len=32, precision="16-mixed", max_grad_norm=1.0, grad_accum=2
    )
    assert measure(s).fits


def test_forloop_optimizer_keeps_the_same_state_and_runs_other_kernels():
    s = Settings(model="tiny-bert", seq_len=8)
    foreach = measure(s, 1)
    forloop = measure(s.replace(optimizer="adamw-forloop"), 1)
    assert forloop.breakdown is not None and foreach.breakdown is not None
    assert forloop.breakdown.optimizer_state == foreach.breakdown.optimizer_state
    # Per-tensor kernels allocate other temporaries than the foreach ones over every tensor.
    assert forloop.peak_bytes != foreach.peak_bytes


@pytest.mark.parametrize(
    ("hf_name", "ours"), [("adamw_torch", "adamw"), ("adamw_torch_fused", "adamw-fused")]
)
def test_hf_trainer_optimizer_names_are_accepted(hf_name, ours):
    s = Settings(optimizer=hf_name)
    assert s.workload.optimizer == ours
    assert Settings.from_query(s.to_query()) == s


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"grad_accum": 0}, "grad_accum must be at least 1"),
        ({"max_grad_norm": 0.0}, "max_grad_norm must be a positive number"),
        ({"max_grad_norm": float("nan")}, "max_grad_norm must be a positive number"),
    ],
)
def test_bad_loop_settings_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Settings(**kwargs)
