"""What the app's AppTest files share: a fake engine Session with a known answer, and small readers.

Not a test module: `test_app_main.py` and `test_app_results.py` import it (pytest puts tests/ on
the path).
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable, Iterator

from streamlit.testing.v1 import AppTest

from memorymark import gpus
from memorymark.measurement import Breakdown, DepthReplay, Measurement
from memorymark.report import Report
from memorymark.search.plan import TrainingPlan, plan_for_target
from memorymark.settings import Costs, Settings
from memorymark.ui import sweep_runner
from memorymark.units import GIB
from memorymark.ways_out import Fix

APP = "../app.py"  # AppTest resolves paths against the test file
TIMEOUT = 60  # the first run imports torch and transformers
A10 = gpus.find_gpu("A10")


def rate(batch: int) -> float:
    """Estimated samples/s of the fake: grows with batch size and levels off."""
    return 1000 * batch / (batch + 16)


# How long a gated probe waits at most: far longer than any test's own deadline, so a loaded CI
# machine never opens a gate by timeout (a sweep that ends early leaves no progress bar to
# watch). The `gate` and `fake` fixtures open every gate at teardown, so nothing waits this out.
GATE_SECONDS = 120.0


class FakeWaysOut:
    """The engine's WaysOutSearch over known fixes: one stage each, labelled as the fix; when
    `gate` is set, every stage after the first waits for it (a test watches the search)."""

    def __init__(self, fixes: tuple[Fix, ...], gate: threading.Event | None = None) -> None:
        self.fixes, self.gate, self.done = fixes, gate, []

    @property
    def not_finished(self) -> tuple[str, ...]:
        return tuple(f.label for f in self.fixes if f.label not in self.done)

    def stages(self) -> Iterator[tuple[str, Fix | None]]:
        for i, fix in enumerate(self.fixes):
            if i and self.gate is not None:
                self.gate.wait(GATE_SECONDS)
            self.done.append(fix.label)
            yield fix.label, fix


class FakeSession:
    """The engine's Session with a known answer: peak = 1 GiB + 0.1 GiB per sample on an A10.

    Probes 8, 16, 192 (fits) and 200 (runs out of memory: the fake's boundary is
    `first_oom`, whatever its bytes), each fitting one with an estimated `rate(batch)`; every
    probe, the OOM too, says what it needs (peak + 64 MiB reserved). When `gate` is set, every
    probe after the first waits for it, so a test can watch a sweep mid-flight.
    `fixes(settings)` fills the report's fixes when nothing fits; gradient checkpointing brings
    the base down to 1 GiB.
    """

    created: list[Settings] = []
    gate: threading.Event | None = None
    error: Exception | None = None
    base_bytes = GIB
    first_oom = 200
    batches: tuple[int, ...] = (8, 16, 192, 200)
    rate: Callable[[int], float] = staticmethod(rate)
    fixes: Callable[[Settings], tuple[Fix, ...]] = staticmethod(lambda settings: ())

    stopped_by: str | None = None
    depth_replay: DepthReplay | None = None
    """What the report says of the sweep's depth, as a simulated backend tells the engine."""
    stages: tuple[str, ...] = ()
    report_gate: threading.Event | None = None
    fixes_gate: threading.Event | None = None
    """When set, each way out after the first waits for it (`FakeWaysOut`)."""
    fixes_stop: tuple[str, tuple[str, ...]] | None = None
    """(stopped_by, not finished) of a search for ways out a limit stopped, for the report."""

    def __init__(self, settings: Settings) -> None:
        if type(self).error is not None:
            raise type(self).error
        self.settings, self.gpu, self.measurements = settings, A10, []
        self.backend_name = (
            "sim" if settings.hardware.backend == "auto" else settings.hardware.backend
        )
        self.runs_for_real = self.backend_name != "sim"
        self.depth_replay = type(self).depth_replay

    def _probe(self, batch: int) -> Measurement:
        base = GIB if self.settings.workload.grad_checkpointing else type(self).base_bytes
        peak = base + batch * GIB // 10
        fits = batch < type(self).first_oom and peak <= A10.usable_bytes
        parts = Breakdown(parameters=GIB // 4, optimizer_state=GIB // 2,
                          activations=peak - 3 * GIB // 4)  # fmt: skip
        return Measurement(
            batch_size=batch, fits=fits, peak_bytes=peak, backend="sim", measured=False,
            predicted_allocated_bytes=peak + 512 if fits else None,
            predicted_reserved_bytes=peak + 64 * 2**20,
            required_bytes=peak + 64 * 2**20,
            samples_per_second=type(self).rate(batch) if fits else None,
            throughput_source="estimated" if fits else None,
            breakdown=parts if fits else None, error=None if fits else "simulated OOM",
        )  # fmt: skip

    def stream(self) -> Iterator[Measurement]:
        type(self).created.append(self.settings)  # one sweep per Analyze
        for i, batch in enumerate(type(self).batches):
            if i and type(self).gate is not None:
                type(self).gate.wait(GATE_SECONDS)
            self.measurements.append(self._probe(batch))
            yield self.measurements[-1]

    def resume(
        self,
        measurements: tuple[Measurement, ...],
        elapsed_seconds: float,
        depth_replay: DepthReplay | None = None,
    ) -> None:
        self.measurements = list(measurements)
        self.depth_replay = depth_replay  # what the sweep resumed said, as the engine keeps it

    @property
    def needs_ways_out(self) -> bool:
        return self.stopped_by is None and not any(m.fits for m in self.measurements)

    def ways_out(self) -> FakeWaysOut:
        if not hasattr(self, "_ways_out"):
            self._ways_out = FakeWaysOut(type(self).fixes(self.settings), type(self).fixes_gate)
        return self._ways_out

    def report(self, costs: Costs | None = None, *, on_stage=None) -> Report:
        for text in type(self).stages:  # what the engine says after the last probe
            on_stage(text)
        if type(self).report_gate is not None:
            type(self).report_gate.wait(GATE_SECONDS)
        report = Report(settings=self.settings, costs=costs or Costs(), gpu=A10, backend="sim",
                        measurements=tuple(self.measurements), elapsed_seconds=0.5,
                        depth_replay=self.depth_replay)  # fmt: skip
        if report.optimal is not None:
            # As the engine does; the fake's micro-batches fit with accumulation too.
            target = report.global_batch
            plan = (
                TrainingPlan(micro_batch=report.optimal.batch_size, accumulation_steps=1,
                             target_batch=None)
                if target is None
                else plan_for_target(target, report.optimal.batch_size, lambda micro: True)
            )  # fmt: skip
            report = dataclasses.replace(report, plan=plan)
        if report.optimal is None:
            # As the engine does: batch 1 as configured, simulated with no limit (base + 1 GiB).
            report = dataclasses.replace(
                report,
                fixes=type(self).fixes(self.settings),
                batch_1_required_bytes=type(self).base_bytes + GIB,
            )
            if type(self).fixes_stop is not None:
                stopped_by, left = type(self).fixes_stop
                report = dataclasses.replace(
                    report, fixes_stopped_by=stopped_by, fixes_not_finished=left
                )
        return report


def app(sync: bool = True, **query: str) -> AppTest:
    """The main page, run once with `query` as its link (sweeps inline unless `sync` is off)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(query)
    if sync:
        at.session_state[sweep_runner.SYNC_KEY] = True
    return at.run()


def run_until(at: AppTest, done: Callable[[AppTest], bool], timeout: float = 30) -> AppTest:
    """Rerun the script (as the page's fragment would) until `done`, or fail."""
    deadline = time.monotonic() + timeout
    while not done(at):
        assert time.monotonic() < deadline, "the sweep did not finish in time"
        time.sleep(0.1)
        at.run()
    return at


def metrics(at: AppTest) -> dict[str, str]:
    """Each metric card's label -> value."""
    return {m.label: m.value for m in at.metric}


def chart(at: AppTest, key: str) -> dict:
    """The figure JSON of the Plotly chart drawn with `key`."""
    found = [c for c in at.get("plotly_chart") if c.proto.id.endswith(f"-{key}")]
    assert found, f"no chart {key!r}"
    return json.loads(found[0].proto.spec)


def trace(spec: dict, name: str) -> dict:
    """The trace called `name` in a figure's JSON."""
    return next(t for t in spec["data"] if t.get("name") == name)


def shown(markdown: str) -> str:
    """What a message's markdown shows: its code spans (user text, `ui.literal`) unwrapped and
    its backslash escapes resolved."""
    unwrapped = re.sub(r"(`+) (.*?) \1(?!`)", r"\2", markdown)
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", unwrapped)
