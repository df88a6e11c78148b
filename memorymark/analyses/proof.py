"""The backward-pass proof: why a forward-only (or inference-style) number crashes training.

For one model and batch size, four steps side by side: forward only (no_grad, eval),
forward+backward (eval, logits.mean(), no optimizer: the prototype's protocol and what simpler
tools measure), the full step with the optimizer in eval mode, and the full step in train mode
(what training really runs). This module holds the protocols and the verdict; `Session.proof`
(memorymark/engine.py) measures them. No torch, no engine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memorymark.measurement import memory_source
from memorymark.settings import Settings

# The ratio forward+backward / forward-only that a correct backward measurement shows for typical
# models (the prototype's check): activations saved for backward plus gradients roughly double
# to triple the forward's peak. Below 1.2x the backward pass was almost certainly not measured.
PASS_RANGE = (2.0, 3.0)
FAIL_BELOW = 1.2

PROTOCOLS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (
        "forward_only",
        "Forward only (no_grad, eval)",
        {"forward_only": True, "mode": "eval", "loss": "logits-mean", "optimizer": "none"},
    ),
    (
        "forward_backward",
        "Forward + backward (eval, no optimizer)",
        {"forward_only": False, "mode": "eval", "loss": "logits-mean", "optimizer": "none"},
    ),
    (
        "full_step_eval",
        "Full step with optimizer (eval mode)",
        {"forward_only": False, "mode": "eval", "loss": "task"},
    ),
    (
        "full_step",
        "Full step with optimizer (train mode)",
        {"forward_only": False, "mode": "train", "loss": "task"},
    ),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolResult:
    """One protocol's peak at the chosen batch, and the max batch it would recommend."""

    key: str
    label: str
    peak_bytes: int
    fits: bool
    max_batch: int | None = None
    measured: bool = False
    """True when taken on the GPU itself; False when simulated."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BackwardProof:
    """Peaks of the four protocols at one batch size, with the prototype's verdict."""

    batch_size: int
    results: tuple[ProtocolResult, ...]

    @property
    def memory_source(self) -> str:
        """'measured' or 'simulated', as every figure of the proof was obtained."""
        return memory_source(all(r.measured for r in self.results))

    def peak(self, key: str) -> int:
        """The peak bytes of one protocol."""
        return next(r.peak_bytes for r in self.results if r.key == key)

    @property
    def ratio(self) -> float:
        """forward+backward peak / forward-only peak."""
        return round(self.peak("forward_backward") / self.peak("forward_only"), 3)

    @property
    def verdict(self) -> str:
        """PASS when the ratio is 2.0-3.0x, FAIL below 1.2x, WARN otherwise."""
        if PASS_RANGE[0] <= self.ratio <= PASS_RANGE[1]:
            return "PASS"
        return "FAIL" if self.ratio < FAIL_BELOW else "WARN"

    def to_dict(self) -> dict[str, Any]:
        """The `validate-backward --json` object."""
        return {
            "batch_size": self.batch_size,
            "forward_only_bytes": self.peak("forward_only"),
            "forward_backward_bytes": self.peak("forward_backward"),
            "full_step_eval_bytes": self.peak("full_step_eval"),
            "full_step_bytes": self.peak("full_step"),
            "ratio": self.ratio,
            "verdict": self.verdict,
            "memory_source": self.memory_source,
            "max_batch": {r.key: r.max_batch for r in self.results},
        }


def protocol_settings(settings: Settings, key: str) -> Settings:
    """`settings` changed to run one of the four protocols."""
    overrides = next(o for k, _, o in PROTOCOLS if k == key)
    optimizer = settings.optimizer if settings.optimizer != "none" else "adamw"
    return replace(settings, **{"optimizer": optimizer, **overrides})
