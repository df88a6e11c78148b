"""FlashAttention-2, Liger's kernels and chunked cross-entropy as the simulation runs them, and the
logits line of the breakdown: tiny Llama and Qwen3-MoE configs, fake tensors, CPU only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from config_samples import TINY_LLAMA

from memorymark import Session, Settings
from memorymark.analyses import fixes
from memorymark.cli import parser
from memorymark.cuda_rules import flash_attn2
from memorymark.reporting import snippets
from memorymark.search.plan import TrainingPlan
from memorymark.step import fused_loss, liger

# Config files from tmp_path: the app limits them to its upload folder once it is imported.
pytestmark = pytest.mark.usefixtures("any_config_path")

TINY_QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 512,
}


@pytest.fixture
def tiny_llama(tmp_path: Path) -> str:
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return f"file:{path}"


def _measure(model: str, batch: int = 1, **kw: object) -> object:
    settings = Settings(model=model, precision="bf16-true", gpu="a100-80gb", backend="sim", **kw)  # type: ignore[arg-type]
    return Session(settings).measure(batch)


# -- FlashAttention-2 ------------------------------------------------------------------------------
def test_flash_attention_2_saves_output_and_fp32_logsumexp_and_no_score_matrix() -> None:
    q = torch.zeros(2, 64, 4, 16, dtype=torch.bfloat16, requires_grad=True)
    k = torch.zeros(2, 64, 2, 16, dtype=torch.bfloat16, requires_grad=True)  # GQA: 2 kv heads
    v = torch.zeros(2, 64, 2, 16, dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn2._FlashAttnFunc.apply(q, k, v)
    saved = out.grad_fn.saved_tensors
    shapes = [(tuple(t.shape), t.dtype) for t in saved]
    assert shapes == [
        ((2, 64, 4, 16), torch.bfloat16),  # q
        ((2, 64, 2, 16), torch.bfloat16),  # k, not repeated to the query heads
        ((2, 64, 2, 16), torch.bfloat16),  # v
        ((2, 64, 4, 16), torch.bfloat16),  # out
        ((2, 4, 64), torch.float32),  # softmax_lse
        ((2,), torch.int64),  # rng_state
    ]
    out.sum().backward()
    assert k.grad is not None and k.grad.shape == k.shape and q.grad.shape == q.shape


def test_flash_attention_2_runs_in_a_simulated_step_and_keeps_no_score_matrix(
    tiny_llama: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    original = flash_attn2.flash_attention_forward
    monkeypatch.setattr(
        flash_attn2,
        "flash_attention_forward",
        lambda *a, **k: calls.append(1) or original(*a, **k),
    )
    flash = _measure(tiny_llama, seq_len=1024, attention="flash_attention_2")
    eager = _measure(tiny_llama, seq_len=1024, attention="eager")
    assert len(calls) == TINY_LLAMA["num_hidden_layers"]
    # Eager keeps each layer's 4 x 1024 x 1024 attention probabilities (bf16): 8 MiB a layer.
    assert eager.breakdown.activations - flash.breakdown.activations > 2 * 8 * 2**20


def test_flash_attention_2_is_refused_where_it_cannot_run(tiny_llama: str) -> None:
    with pytest.raises(ValueError, match="fp16 or bf16"):
        Settings(model=tiny_llama, attention="flash_attention_2")
    with pytest.raises(ValueError, match="CUDA kernels only"):
        Settings(
            model=tiny_llama, attention="flash_attention_2", precision="bf16-true", backend="cpu"
        )
    t4 = Settings(model=tiny_llama, attention="flash_attention_2", precision="16-mixed", gpu="t4")
    with pytest.raises(ValueError, match="Ampere or newer"):
        Session(replace_backend(t4))


def test_the_cli_refuses_flash_attention_2_on_a_t4_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["measure", "llama-3.2-1b", "--batch-size", "1", "--attention", "flash_attention_2"]
    assert parser.main([*argv, "--precision", "16-mixed", "--gpu", "t4", "--backend", "sim"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Ampere or newer" in err


def replace_backend(settings: Settings) -> Settings:

    return settings.replace(backend="sim")


# -- Liger and the chunked loss --------------------------------------------------------------------
def test_liger_chunk_size_is_the_one_its_source_works_through() -> None:
    # fused_linear_cross_entropy.py: "BT = 4096*4, V = 32000, H = 4096 ==> inc_factor = 8,
    # chunk_size = 2048"
    assert fused_loss.liger_chunk_size(4096 * 4, 32000, 4096) == 2048
    assert fused_loss.liger_chunk_size(100, 128256, 4096) == 4  # next power of 2 of ceil(100/32)


def test_chunked_loss_is_transformers_loss(tiny_llama: str) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(2, 12, 8)
    head = torch.nn.Linear(8, 50, bias=False)
    labels = torch.randint(0, 50, (2, 12))
    logits = head(hidden)
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 50).float(), labels[:, 1:].reshape(-1))
    assert torch.allclose(fused_loss.chunked_loss(hidden, head, labels, 4), expected, atol=1e-6)


def test_fused_losses_shrink_the_logits_line(tiny_llama: str) -> None:
    seq, vocab = 2048, TINY_LLAMA["vocab_size"]
    plain = _measure(tiny_llama, seq_len=seq, lora_rank=8)
    chunked = _measure(tiny_llama, seq_len=seq, lora_rank=8, loss_chunks=8)
    fused = _measure(tiny_llama, seq_len=seq, lora_rank=8, kernels="liger")
    # transformers: at the peak (in the loss's backward) its fp32 log-probabilities are alive.
    assert plain.breakdown.logits >= seq * vocab * 4
    # torchtune: no whole fp32 copy at once, but every chunk's log-probabilities are kept, so
    # its peak moves to the end of forward, where they are.
    assert chunked.peak_bytes < plain.peak_bytes
    assert chunked.breakdown.logits >= seq * vocab * 4 and chunked.breakdown.temporary == 0
    # Liger: one chunk of logits at a time, and the hidden states' gradient.
    assert fused.breakdown.logits < seq * vocab * 2 // 4
    assert fused.peak_bytes < chunked.peak_bytes


def test_liger_patches_norms_mlps_and_rope(tiny_llama: str) -> None:
    from memorymark.step.catalog import CatalogStep

    with torch.device("meta"):
        model = CatalogStep(
            Settings(model=tiny_llama, precision="bf16-true", backend="sim")
        ).build_model()
    # Two norms and one MLP per layer, plus the final norm.
    assert liger.patch_modules(model) == 3 * TINY_LLAMA["num_hidden_layers"] + 1
    assert [p.name for p in liger.rope_patches(model)] == ["apply_rotary_pos_emb"]


def test_liger_needs_a_causal_lm_and_no_second_chunking(tiny_llama: str) -> None:
    with pytest.raises(ValueError, match="causal LMs"):
        Settings(model="tiny-bert", kernels="liger")
    with pytest.raises(ValueError, match="drop loss_chunks"):
        Settings(model=tiny_llama, kernels="liger", loss_chunks=4)
    with pytest.raises(ValueError, match="kernels must be one of"):
        Settings(model=tiny_llama, kernels="unsloth")


def test_logits_get_their_own_line_for_causal_lms_only() -> None:
    lm = Session(Settings(model="tiny-gpt2", seq_len=64, gpu="a10", backend="sim")).measure(2)
    classifier = Session(Settings(model="tiny-bert", seq_len=64, gpu="a10", backend="sim"))
    assert lm.breakdown.logits >= 2 * 64 * 1000 * 4  # the fp32 logits, at least
    assert classifier.measure(2).breakdown.logits == 0


def test_the_nothing_fits_advice_offers_the_fused_loss(tiny_llama: str) -> None:
    variants = dict(fixes.settings_changes(Settings(model=tiny_llama, backend="cpu"), _gpu("a10")))
    fused = variants["Liger kernels (fused cross-entropy, no full logits)"]
    assert (fused.workload.kernels, fused.hardware.backend) == ("liger", "sim")
    assert "Liger" not in " ".join(
        dict(fixes.settings_changes(Settings(model="tiny-bert"), _gpu("a10")))
    )


def _gpu(name: str) -> object:
    from memorymark import gpus

    return gpus.find_gpu(name)


def test_snippets_carry_liger_and_the_attention(tiny_llama: str) -> None:
    settings = Settings(
        model="llama-3.2-1b", precision="bf16-true", kernels="liger", attention="flash_attention_2"
    )
    plan = TrainingPlan(micro_batch=1, accumulation_steps=1, target_batch=None)
    hf = snippets.snippet("hf", settings, plan)
    assert "use_liger_kernel=True" in hf and "_apply_liger_kernel_to_instance" not in hf
    assert 'attn_implementation="flash_attention_2"' in hf
    torch_code = snippets.snippet("torch", settings, plan)
    assert "_apply_liger_kernel_to_instance(model=model)" in torch_code
    chunked = Settings(model="llama-3.2-1b", loss_chunks=8)
    assert "num_output_chunks=8" in snippets.snippet("torch", chunked, plan)


# -- mixture of experts ----------------------------------------------------------------------------
def test_a_mixture_of_experts_trains_with_every_expert_resident(tmp_path: Path) -> None:
    path = tmp_path / "moe.json"
    path.write_text(json.dumps(TINY_QWEN3_MOE))
    m = _measure(f"file:{path}", batch=2, seq_len=64)
    experts = 2 * 8 * 3 * 64 * 32 * 2  # layers x experts x (gate, up, down) x bf16 bytes
    assert m.error is None and m.breakdown.parameters > experts
