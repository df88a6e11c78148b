"""One analysis from start to finish: open the backend, stream the sweep, build the report.

This is the engine's front door: the CLI and the app are two consumers of `Analysis.stream()`.
It owns timing and bookkeeping of one run, and nothing about how memory is measured or searched.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import replace
from types import ModuleType

import torch

from memorymark.devices import open_backend
from memorymark.fixes import FitAnswer, what_would_fit
from memorymark.measurement import Measurement
from memorymark.report import Report
from memorymark.settings import Costs, Settings
from memorymark.sweep import STRATEGIES, sweep


class Analysis:
    """A sweep for one `Settings`: stream its measurements, then ask for the report."""

    def __init__(self, settings: Settings, *, cuda: ModuleType = torch.cuda) -> None:
        self.settings = settings
        self.backend, self.gpu = open_backend(settings, cuda)
        self.measurements: list[Measurement] = []
        self.elapsed_seconds = 0.0
        self._fixes: FitAnswer | None = None

    @property
    def backend_name(self) -> str:
        """cuda, mps, sim or cpu."""
        return self.backend.name

    def stream(self) -> Iterator[Measurement]:
        """Yield each measurement the moment it exists; the backend is released at the end."""
        s = self.settings
        strategy = STRATEGIES[s.strategy](
            step=s.step, max_batch=s.max_batch, capacity_bytes=self.backend.capacity_bytes
        )
        start = time.perf_counter()
        with contextlib.closing(sweep(self.backend, strategy, also=(s.current_batch,))) as probes:
            for measurement in probes:
                self.measurements.append(measurement)
                self.elapsed_seconds = time.perf_counter() - start
                yield measurement

    def report(self, costs: Costs | None = None, *, fixes: bool = True) -> Report:
        """The report over every measurement taken so far.

        When nothing fits and `fixes` is on, each way out is simulated at batch 1 (a few more
        steps, computed once per analysis) so the report says what would make the model train.
        """
        report = Report(
            settings=self.settings,
            costs=costs or Costs(),
            gpu=self.gpu,
            backend=self.backend_name,
            measurements=tuple(self.measurements),
            elapsed_seconds=self.elapsed_seconds,
        )
        if fixes and self.measurements and report.optimal is None:
            if self._fixes is None:
                self._fixes = what_would_fit(self.settings)
            report = replace(
                report,
                fixes=self._fixes.fixes,
                batch_1_required_bytes=self._fixes.required_bytes,
            )
        return report


def analyze(settings: Settings, costs: Costs | None = None) -> Report:
    """Run the whole sweep and return its report (for scripts that need no live progress)."""
    analysis = Analysis(settings)
    for _ in analysis.stream():
        pass
    return analysis.report(costs)


def measure(settings: Settings, batch_size: int) -> Measurement:
    """One measurement at `batch_size` on the backend `settings` choose."""
    backend, _ = open_backend(settings)
    with backend.session():
        return backend.measure(batch_size)
