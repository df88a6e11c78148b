"""The backward-pass proof's verdict: PASS wherever backward was measured, however large the
ratio; WARN and FAIL only where backward added too little."""

from __future__ import annotations

import pytest

from memorymark.analyses.proof import BackwardProof, ProtocolResult
from memorymark.engine import Session
from memorymark.settings import Settings


def proof_with_ratio(ratio: float) -> BackwardProof:
    peaks = {"forward_only": 1000, "forward_backward": round(1000 * ratio)}
    peaks |= {"full_step_eval": 2 * peaks["forward_backward"], "full_step": 3000 * ratio}
    results = tuple(
        ProtocolResult(key=k, label=k, peak_bytes=int(v), fits=True) for k, v in peaks.items()
    )
    return BackwardProof(batch_size=16, results=results)


@pytest.mark.parametrize(
    ("ratio", "verdict"),
    [
        (7.57, "PASS"),  # BERT-base at batch 64: activations dominate, as the proof shows
        (3.33, "PASS"),  # BERT-base at batch 16, the page's default view
        (1.93, "PASS"),  # BERT-base at batch 4: weights + gradients, the forward's transients
        (1.43, "WARN"),  # bf16-mixed BERT-base at batch 1
        (1.1, "FAIL"),  # backward not measured
    ],
)
def test_verdict_by_ratio(ratio: float, verdict: str) -> None:
    proof = proof_with_ratio(ratio)
    assert proof.verdict == verdict
    assert proof.to_dict()["verdict_note"] == proof.verdict_note


def test_the_default_model_at_the_default_batch_passes() -> None:
    # What the proof page shows first: BERT-base at the sidebar's current batch (16), simulated.
    settings = Settings()
    proof = Session(settings).prove_backward(settings.search.current_batch)
    assert proof.ratio == pytest.approx(3.33, abs=0.02)
    assert proof.verdict == "PASS"
    assert "backward measured" in proof.verdict_note


def test_a_weak_gap_still_warns() -> None:
    # bf16-mixed at batch 1: autocast's bf16 copies raise the forward-only peak and there are
    # few activations, so backward adds far less than a gradient per weight would.
    proof = Session(Settings(precision="bf16-mixed")).prove_backward(1)
    assert proof.ratio == pytest.approx(1.43, abs=0.02)
    assert proof.verdict == "WARN"
    assert "try a larger batch" in proof.verdict_note


@pytest.mark.parametrize("ratio", [1.2, 1.79, 1.8, 1.85, 2.5])
def test_the_words_name_the_threshold_the_verdict_uses(ratio: float) -> None:
    # Reported: the page said "2x or more expected" and passed 1.8x.
    proof = proof_with_ratio(ratio)
    assert "1.8x or more expected" in proof.verdict_note
    assert "2x or more" not in proof.verdict_note and "2x expected" not in proof.verdict_note
    assert (proof.verdict == "PASS") == (ratio >= 1.8)
