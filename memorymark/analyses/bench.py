"""The one door every analysis comes in through: `Bench`, what it may ask of the engine.

An analysis runs many steps of settings it derives (another GPU, a change that might fit,
another GPU count), and never builds a backend, a step or a model itself: the `Session`
hands it a `Bench` (memorymark/engine.py), and a test hands it a fake one. Must not know
torch, how a step is built, measured or counted, or how anything is shown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from memorymark.backends.base import Backend
    from memorymark.gpus import GPU
    from memorymark.measurement import Measurement
    from memorymark.report import Report
    from memorymark.settings import Settings


class Bench(Protocol):
    """Steps of any settings on any GPU, resolved as a `Session` resolves its own."""

    def backend(self, settings: Settings, gpu: GPU) -> Backend:
        """A fresh backend for the step `settings` describe, answering for `gpu` (a whole
        GPU, as one rank of the settings sees it) and judged by the fit policy there. It builds
        nothing until it measures: a replay on it never builds the model."""
        ...

    def measure(self, settings: Settings, gpu: GPU, batch_size: int = 1) -> Measurement:
        """One step of `settings` at `batch_size` on `gpu`, on a backend of its own."""
        ...

    def simulated_gpu(self, settings: Settings) -> GPU:
        """The whole GPU a simulation of `settings` answers for: the custom size, else the
        GPU they name, else this machine's, else the default."""
        ...

    def counted_states(self, settings: Settings) -> tuple[int, int]:
        """(bytes of the model's states: a lower bound on any step's peak, the model's
        parameter count), counted without a step (memorymark/backends/states.py)."""
        ...

    def analyze(self, settings: Settings, *, answer_only: bool = False) -> Report:
        """A whole sweep of `settings`, answered with no ways out and no plan; `answer_only`
        for a table's row, which reads the answer alone: the current batch is not stepped past
        the search."""
        ...
