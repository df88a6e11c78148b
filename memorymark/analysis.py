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

from memorymark.cuda_rules import versions
from memorymark.devices import open_backend
from memorymark.fixes import FitAnswer, what_would_fit
from memorymark.measurement import Measurement
from memorymark.plan import TrainingPlan, plan_for_target
from memorymark.report import Report
from memorymark.settings import Costs, Settings
from memorymark.sweep import STRATEGIES, sweep


class Analysis:
    """A sweep for one `Settings`: stream its measurements, then ask for the report."""

    def __init__(self, settings: Settings, *, cuda: ModuleType = torch.cuda) -> None:
        self.settings = settings
        self._cuda = cuda
        self.backend, self.gpu = open_backend(settings, cuda)
        self.measurements: list[Measurement] = []
        self.elapsed_seconds = 0.0
        self._fixes: FitAnswer | None = None
        self._plans: dict[int | None, tuple[TrainingPlan | None, tuple[Measurement, ...]]] = {}

    @property
    def backend_name(self) -> str:
        """cuda, mps, sim or cpu."""
        return self.backend.name

    def stream(self) -> Iterator[Measurement]:
        """Yield each measurement the moment it exists; the backend is released at the end."""
        s = self.settings
        policy = self.backend.policy
        strategy = STRATEGIES[s.strategy](
            step=s.step,
            max_batch=s.max_batch,
            capacity_bytes=policy.limit_bytes,
            run_capacity_bytes=policy.capacity_bytes,
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
            torch_version=torch.__version__,
            unverified_rules=versions.unverified_rules(),
        )
        if report.optimal is not None:
            plan, probes = self._plan(report.optimal.batch_size, report.global_batch)
            report = replace(report, plan=plan, plan_probes=probes)
        if fixes and self.measurements and report.optimal is None:
            if self._fixes is None:
                self._fixes = what_would_fit(self.settings)
            report = replace(
                report,
                fixes=self._fixes.fixes,
                batch_1_required_bytes=self._fixes.required_bytes,
            )
        return report

    def _plan(
        self, optimal_batch: int, target: int | None
    ) -> tuple[TrainingPlan | None, tuple[Measurement, ...]]:
        """The plan for `target` (once per target): divisors of it are checked with
        accumulation on a backend of their own, since the sweep's steps did not accumulate."""
        accumulating = self.settings.grad_accum
        if target is None:
            plan = TrainingPlan(
                micro_batch=optimal_batch, accumulation_steps=accumulating, target_batch=None
            )
            return plan, ()
        if target not in self._plans:
            probes: list[Measurement] = []
            # Any accumulation past one peaks alike: every gradient alive through the next
            # micro-batch, so two micro-batches stand for them all.
            backend, _ = open_backend(replace(self.settings, grad_accum=2), self._cuda)

            def fits_accumulating(micro_batch: int) -> bool:
                probes.append(backend.measure(micro_batch))
                return probes[-1].fits

            with backend.session():
                plan = plan_for_target(
                    target,
                    optimal_batch,
                    fits_accumulating,
                    accumulation_measured=accumulating > 1,
                )
            self._plans[target] = plan, tuple(probes)
        return self._plans[target]


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
