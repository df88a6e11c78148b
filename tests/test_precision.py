"""The precision setting changes the step as Lightning's precision plugins do (issue 5)."""

from dataclasses import replace

import pytest
import torch

from memorymark.backends.device import CpuBackend
from memorymark.backends.sim import SimBackend
from memorymark.fit import FitPolicy
from memorymark.settings import Settings
from memorymark.step.catalog import CatalogStep

BIG = 8 * 2**30
TINY_BERT = Settings(model="tiny-bert", seq_len=32)


def breakdown(settings, batch=4, **kwargs):
    m = SimBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG), **kwargs).measure(
        batch
    )
    assert m.fits
    return m.breakdown


def _integer_buffer_bytes(settings):
    # position and token-type ids: integer buffers, which no precision converts
    model = CatalogStep(settings).build_model()
    return sum(b.numel() * b.element_size() for b in model.buffers() if not b.is_floating_point())


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_bf16_true_halves_weights_and_optimizer_state_exactly(optimizer):
    fp32 = TINY_BERT.replace(optimizer=optimizer)
    full, half = breakdown(fp32), breakdown(fp32.replace(precision="bf16-true"))
    ints = _integer_buffer_bytes(fp32)
    assert half.parameters - ints == (full.parameters - ints) / 2
    # AdamW's per-tensor step counter is an fp32 scalar whatever the weights' dtype.
    n_tensors = len(list(CatalogStep(fp32).build_model().parameters()))
    counters = 4 * n_tensors if optimizer == "adamw" else 0
    assert half.optimizer_state - counters == (full.optimizer_state - counters) / 2


def test_bf16_true_converts_every_floating_parameter_and_buffer_and_image_inputs():
    settings = Settings(model="tiny-resnet", image_size=32, precision="bf16-true")
    model = CatalogStep(settings).build_model()
    floating = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    assert {t.dtype for t in floating} == {torch.bfloat16}
    assert CatalogStep(settings).make_batch(2, "cpu")["pixel_values"].dtype == torch.bfloat16
    assert SimBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG)).measure(2).fits


@pytest.mark.parametrize(
    "settings",
    [
        TINY_BERT,
        Settings(model="tiny-gpt2", seq_len=32),
        Settings(model="tiny-resnet", image_size=32),
    ],
    ids=lambda s: s.workload.model,
)
def test_bf16_mixed_keeps_fp32_weights_and_lowers_activations(settings):
    full = breakdown(settings)
    mixed = breakdown(replace(settings, precision="bf16-mixed"))
    assert mixed.parameters == full.parameters
    assert mixed.optimizer_state == full.optimizer_state
    assert mixed.activations < full.activations


def test_16_mixed_keeps_a_grad_scaler_whose_state_counts():
    bf16 = breakdown(TINY_BERT.replace(precision="bf16-mixed"))
    fp16 = breakdown(TINY_BERT.replace(precision="16-mixed"))
    # GradScaler's scale (fp32) and growth tracker (int32), kept with the optimizer state.
    assert fp16.optimizer_state == bf16.optimizer_state + 4 + 4


def test_16_mixed_steps_through_a_real_grad_scaler_on_real_tensors():
    settings = TINY_BERT.replace(precision="16-mixed")
    cpu = CpuBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG)).measure(2)
    sim = SimBackend(
        CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG), cuda_rules=False
    ).measure(2)
    assert cpu.fits and sim.peak_bytes == cpu.peak_bytes


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "bf16-true"])
@pytest.mark.parametrize("model", ["tiny-bert", "tiny-gpt2"])
def test_simulation_with_cpu_rules_equals_real_cpu_execution(model, precision):
    settings = Settings(model=model, seq_len=32, precision=precision)
    sim = SimBackend(
        CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG), cuda_rules=False
    ).measure(4)
    cpu = CpuBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG)).measure(4)
    assert sim.peak_bytes == cpu.peak_bytes and sim.breakdown == cpu.breakdown


def test_mixed_precision_with_checkpointing_recomputes_under_the_same_rules():
    settings = Settings(model="tiny-gpt2", seq_len=64, precision="bf16-mixed")
    plain = breakdown(settings, batch=8)
    ckpt = breakdown(settings.replace(grad_checkpointing=True), batch=8)
    assert ckpt.activations < plain.activations


def test_attention_setting_picks_the_implementation():
    sdpa = CatalogStep(TINY_BERT).build_model()
    eager = CatalogStep(TINY_BERT.replace(attention="eager")).build_model()
    assert (sdpa.config._attn_implementation, eager.config._attn_implementation) == (
        "sdpa",
        "eager",
    )
    # Eager attention keeps each layer's attention matrix; CUDA's fused kernel does not.
    settings = TINY_BERT.replace(seq_len=128)
    assert breakdown(settings.replace(attention="eager")).activations > (
        breakdown(settings).activations
    )
