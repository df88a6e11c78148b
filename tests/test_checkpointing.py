"""Activation checkpointing's modes: what each keeps for backward (none > layers:2 >
selective-op > full on a tiny Llama), torchtitan's op policy and block count, and the flag
that names the mode (memorymark/step/checkpointing.py, the `checkpointing` setting)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from memorymark import Session, Settings
from memorymark.cli.parser import build_parser, settings_from_args
from memorymark.step import checkpointing
from memorymark.step.catalog import CatalogStep

ROOT = Path(__file__).resolve().parents[1]
MODES = ("none", "layers:2", "selective-op", "full")


@pytest.fixture(scope="module")
def tiny_llama_steps() -> dict[str, object]:
    """One simulated batch-8 step of tiny-llama (2 blocks) under each mode, traced in full."""
    out = {}
    for mode in MODES:
        s = Settings(model="tiny-llama", gpu="a10", backend="sim", seq_len=64,
                     checkpointing=mode, depth="trace")  # fmt: skip
        backend = Session(s).open_backend()
        with backend.session():
            out[mode] = backend.measure(8)
    return out


def test_each_mode_keeps_less_for_backward_than_the_one_before(tiny_llama_steps) -> None:
    activations = [tiny_llama_steps[m].breakdown.activations for m in MODES]
    peaks = [tiny_llama_steps[m].peak_bytes for m in MODES]
    # Figures from this test's own run (tiny-llama, seq 64, batch 8, simulated on an A10):
    # activations 5,150,752 / 2,910,736 / 2,128,416 / 670,208 bytes.
    assert activations[0] > activations[1] > activations[2] > activations[3] > 0, activations
    assert peaks[0] > peaks[1] > peaks[2] > peaks[3], peaks
    # Only what backward keeps changes: the weights and the optimizer state do not.
    states = {
        (m.breakdown.parameters, m.breakdown.optimizer_state) for m in tiny_llama_steps.values()
    }
    assert len(states) == 1


def test_layers_k_checkpoints_blocks_k_2k_as_torchtitan_counts_them() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=4, hidden_size=16, intermediate_size=32,
                         num_attention_heads=2, num_key_value_heads=1, vocab_size=64)  # fmt: skip

    def flags(mode: str) -> list[bool]:
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        checkpointing.enable(model, mode)
        return [layer.gradient_checkpointing for layer in model.model.layers]

    assert flags("layers:2") == [False, True, False, True]
    assert flags("layers:3") == [False, False, True, False]
    assert flags("full") == [True] * 4 and flags("layers:1") == [True] * 4
    assert flags("layers:9") == [False] * 4


def test_the_op_policy_keeps_matmuls_but_every_second_and_attention() -> None:
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    policy = checkpointing._selective_op_policy()
    forward, recompute = SimpleNamespace(is_recompute=False), SimpleNamespace(is_recompute=True)
    ops = [aten.mm.default, aten.addmm.default, aten.mm.default, aten.relu.default,
           aten._scaled_dot_product_flash_attention.default, aten.bmm.default]  # fmt: skip
    kept = [policy(forward, op) == CheckpointPolicy.MUST_SAVE for op in ops]
    # The 1st and 3rd matmul kept, the 2nd recomputed; attention kept; the rest recomputed.
    assert kept == [True, False, True, False, True, False]
    # The recompute counts on its own: its first matmul is kept again.
    assert policy(recompute, aten.mm.default) == CheckpointPolicy.MUST_SAVE
    # Each block's checkpoint starts its count afresh.
    assert checkpointing._selective_op_policy()(forward, aten.mm.default) == (
        CheckpointPolicy.MUST_SAVE
    )


def test_the_catalog_step_applies_the_mode_it_is_given() -> None:
    s = Settings(model="tiny-llama", seq_len=16, checkpointing="layers:2")
    model = CatalogStep(s).build_model()
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [False, True]


def test_timm_refuses_the_modes_it_has_no_switch_for() -> None:
    class TimmLike(torch.nn.Module):
        on = False

        def set_grad_checkpointing(self, enable: bool = True) -> None:
            self.on = enable

    model = TimmLike()
    with pytest.raises(ValueError, match=r"checkpoints every block .*use --checkpointing full"):
        checkpointing.enable(model, "selective-op")
    checkpointing.enable(model, "full")
    assert model.on
    resnet = Settings(model="tiny-resnet", image_size=32, checkpointing="full")
    with pytest.raises(ValueError, match="does not support gradient checkpointing"):
        CatalogStep(resnet).build_model()


@pytest.mark.parametrize(
    ("argv", "mode"),
    [
        ([], "none"),
        (["--grad-checkpointing"], "full"),
        (["--checkpointing", "full"], "full"),
        (["--checkpointing", "selective-op"], "selective-op"),
        (["--checkpointing", "layers:2"], "layers:2"),
        (["--checkpointing", "off"], "none"),
    ],
)
def test_the_flag_names_the_mode(argv: list[str], mode: str) -> None:
    args = build_parser().parse_args(["analyze", "tiny-llama", *argv])
    assert settings_from_args(args).workload.checkpointing == mode


def test_the_old_on_off_setting_still_reads_as_full() -> None:
    assert Settings(grad_checkpointing=True).workload.checkpointing == "full"
    assert Settings.from_dict({"grad_checkpointing": True}).workload.checkpointing == "full"
    old_link = Settings.from_query({"grad_checkpointing": "true"})
    assert old_link.workload.checkpointing == "full" and old_link.workload.grad_checkpointing
    assert "grad_checkpointing" not in old_link.to_dict()  # written under its new name only
    on = Settings(checkpointing="selective-op")
    assert on.replace(grad_checkpointing=False).workload.checkpointing == "none"
    with pytest.raises(ValueError, match="grad_checkpointing must be a bool"):
        Settings.from_dict({"grad_checkpointing": "yes"})


@pytest.mark.parametrize("bad", ["layers:0", "layers:x", "selective", "layers:", "on"])
def test_a_bad_mode_is_one_line_with_the_way_forward(bad: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "memorymark", "analyze", "tiny-llama", "--checkpointing", bad],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "memorymark: error: checkpointing must be none, full, selective-op or layers:K with K a "
        "whole number of at least 1 (layers:2 checkpoints every second block) "
        f"(got {bad!r})"
    ]


def test_the_ways_out_offer_full_checkpointing_from_any_other_mode() -> None:
    from memorymark import gpus
    from memorymark.analyses.changes import settings_changes

    a10 = gpus.find_gpu("A10")

    def offered(mode: str) -> dict[str, str]:
        s = Settings(model="tiny-llama", checkpointing=mode)
        return {label: c.workload.checkpointing for label, c in settings_changes(s, a10)}

    assert offered("none")["gradient checkpointing"] == "full"
    assert offered("selective-op")["full checkpointing (instead of selective-op)"] == "full"
    assert offered("layers:2")["full checkpointing (instead of layers:2)"] == "full"
    assert not any(label.startswith(("gradient", "full")) for label in offered("full"))
    # The recipes that combine changes checkpoint in full, as before.
    assert offered("selective-op")["QLoRA: NF4 + LoRA + checkpointing"] == "full"
