"""Each training setting moves memory the way it must (issue 5), on tiny models."""

import pytest

from memorymark.backends.sim import SimBackend
from memorymark.fit import FitPolicy
from memorymark.settings import Settings
from memorymark.step.catalog import CatalogStep

BIG = 8 * 2**30


def measure(settings, batch=16):
    m = SimBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG)).measure(batch)
    assert m.fits
    return m


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-gpt2"])
def test_checkpointing_lowers_the_peak_and_the_activations_kept(model):
    plain = Settings(model=model, seq_len=64)
    without = measure(plain, 32)
    with_ckpt = measure(plain.replace(grad_checkpointing=True), 32)
    assert with_ckpt.peak_bytes < without.peak_bytes
    # What the forward keeps for backward: the activations alive when backward starts.
    assert with_ckpt.breakdown.activations < without.breakdown.activations


def test_checkpointing_a_model_without_support_is_a_clear_error():
    settings = Settings(model="tiny-resnet", image_size=32, grad_checkpointing=True)
    with pytest.raises(ValueError, match="does not support gradient checkpointing"):
        SimBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG)).measure(2)


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-gpt2"])
def test_lora_removes_nearly_all_gradient_and_optimizer_state(model):
    full = measure(Settings(model=model, seq_len=32)).breakdown
    lora = measure(Settings(model=model, seq_len=32, lora_rank=4)).breakdown
    assert lora.optimizer_state < 0.05 * full.optimizer_state
    assert lora.parameters > full.parameters  # the adapters add a little
    model = CatalogStep(Settings(model=model, seq_len=32, lora_rank=4)).build_model()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert trainable < 0.05 * total  # frozen base weights get no gradient


def test_unknown_lora_targets_are_one_line():
    settings = Settings(model="tiny-bert", seq_len=32, lora_rank=4, lora_targets="nope")
    with pytest.raises(ValueError, match="LoRA: ") as info:
        SimBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG)).measure(2)
    assert "\n" not in str(info.value)


def _param_bytes(settings):
    model = CatalogStep(settings).build_model()
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_optimizer_state_per_optimizer():
    s = Settings(model="tiny-bert", seq_len=32)
    params = _param_bytes(s)
    n_tensors = len(list(CatalogStep(s).build_model().parameters()))
    state = {
        name: measure(s.replace(optimizer=name)).breakdown.optimizer_state
        for name in ("adamw", "adamw-fused", "sgd", "adafactor", "none")
    }
    assert state["adamw"] == state["adamw-fused"] == 2 * params + 4 * n_tensors
    assert state["sgd"] == params
    assert 0 < state["adafactor"] < 0.1 * params  # factored second moments only
    assert state["none"] == 0
