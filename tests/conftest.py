"""Shared fixtures: tiny models that run in milliseconds on CPU, and a backend whose memory is a
known function of batch size, for testing search strategies exactly."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from memorymark.measurement import Measurement
from memorymark.settings import Settings


@pytest.fixture
def tiny_bert() -> Settings:
    """A 2-layer BERT on a simulated A10."""
    return Settings(model="tiny-bert", seq_len=32, gpu="a10", backend="sim")


class FunctionBackend:
    """A backend whose step allocates `timeline(batch)`; it fits when the peak is in capacity."""

    name = "fake"
    measured = False

    def __init__(self, timeline: Callable[[int], tuple[int, ...]], capacity_bytes: int) -> None:
        self.timeline = timeline
        self.capacity_bytes = capacity_bytes
        self.tried: list[int] = []
        self.released = False

    def measure(self, batch_size: int) -> Measurement:
        self.tried.append(batch_size)
        timeline = self.timeline(batch_size)
        peak = max(timeline)
        return Measurement(
            batch_size=batch_size,
            fits=peak <= self.capacity_bytes,
            peak_bytes=peak,
            backend=self.name,
            measured=False,
            timeline=timeline,
        )

    def release(self) -> None:
        self.released = True


@pytest.fixture
def function_backend() -> type[FunctionBackend]:
    """The FunctionBackend class, to build with a timeline and a capacity."""
    return FunctionBackend
