"""The main page under AppTest: settings, Analyze, live sweep, results, cancel, cache, errors."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import memorymark.models
from memorymark import gpus
from memorymark.measurement import Breakdown, Measurement
from memorymark.report import GIB, Report
from memorymark.settings import Costs, Settings
from memorymark.ui import sidebar, sweep_runner

APP = "../app.py"  # AppTest resolves paths against this file
TIMEOUT = 60  # the first run imports torch and transformers
A10 = gpus.find_gpu("A10")


class FakeAnalysis:
    """The engine's Analysis with a known answer: peak = 1 GiB + 0.1 GiB per sample on an A10.

    Probes 8, 16, 192 (19.2+1 GiB fits in 20.92 usable) and 200 (21 GiB does not). When `gate`
    is set, every probe after the first waits for it, so a test can watch a sweep mid-flight.
    """

    created: list[Settings] = []
    gate: threading.Event | None = None
    error: Exception | None = None
    base_bytes = GIB

    def __init__(self, settings: Settings) -> None:
        if type(self).error is not None:
            raise type(self).error
        type(self).created.append(settings)
        self.settings, self.gpu, self.measurements = settings, A10, []

    def stream(self) -> Iterator[Measurement]:
        for i, batch in enumerate((8, 16, 192, 200)):
            if i and type(self).gate is not None:
                type(self).gate.wait(10)
            peak = type(self).base_bytes + batch * GIB // 10
            fits = peak <= A10.usable_bytes
            parts = Breakdown(parameters=GIB // 4, optimizer_state=GIB // 2,
                              activations=peak - 3 * GIB // 4)  # fmt: skip
            self.measurements.append(Measurement(
                batch_size=batch, fits=fits, peak_bytes=peak, backend="sim", measured=False,
                breakdown=parts if fits else None, error=None if fits else "simulated OOM",
            ))  # fmt: skip
            yield self.measurements[-1]

    def report(self, costs: Costs | None = None) -> Report:
        return Report(settings=self.settings, costs=costs or Costs(), gpu=A10, backend="sim",
                      measurements=tuple(self.measurements), elapsed_seconds=0.5)  # fmt: skip


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch: pytest.MonkeyPatch) -> threading.Lock:
    """Each test gets its own result cache and device lock (they are process-wide in the app)."""
    cache, lock = sweep_runner.ResultCache(), threading.Lock()
    monkeypatch.setattr(sweep_runner, "result_cache", lambda: cache)
    monkeypatch.setattr(sweep_runner, "device_lock", lambda: lock)
    return lock


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeAnalysis]:
    class Fake(FakeAnalysis):
        created: list[Settings] = []

    monkeypatch.setattr(sweep_runner, "Analysis", Fake)
    return Fake


def app(sync: bool = True, **query: str) -> AppTest:
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
    return {m.label: m.value for m in at.metric}


def chart(at: AppTest, index: int = 0) -> dict:
    return json.loads(at.get("plotly_chart")[index].proto.spec)


def trace(spec: dict, name: str) -> dict:
    return next(t for t in spec["data"] if t.get("name") == name)


def test_analyze_shows_metrics_chart_verdict_and_downloads(fake) -> None:  # noqa: ANN001
    at = app(model="tiny-bert")
    assert not at.exception
    assert "click **Analyze**" in at.info[0].value
    at.button(key="analyze").click().run()
    assert not at.exception
    shown = metrics(at)
    assert shown["Optimal batch size"] == "192"
    assert shown["Memory at batch 16 (simulated)"] == "2.60 GiB"
    assert shown["Memory at the optimal batch (simulated)"] == "20.20 GiB"
    assert shown["Speedup (est. from batch ratio)"] == "12.0x"
    assert shown["Annual savings (estimated)"] == "$158"  # 0.86 $/h * 2 h * 100 * (1 - 1/12)
    assert at.success[0].value.startswith("Batch 16 uses 12% of this A10's usable memory")
    spec = chart(at)
    assert trace(spec, "fits")["x"] == [8, 16, 192]
    assert trace(spec, "OOM")["x"] == [200]
    assert "simulated" in spec["layout"]["title"]["text"]
    assert [b.label for b in at.get("download_button")] == [
        "Download JSON report", "Download probes CSV"]  # fmt: skip
    assert "batch  200 OOM  simulated OOM" in at.code[0].value
    assert at.query_params["model"] == "tiny-bert"


def test_a_cost_slider_reprices_without_a_second_sweep(fake) -> None:  # noqa: ANN001
    at = app(model="tiny-bert")
    at.button(key="analyze").click().run()
    at.slider(key="mm_usd_per_hour").set_value(2.0).run()
    assert metrics(at)["Annual savings (estimated)"] == "$367"  # 2 * 2 * 100 * 11/12
    assert at.query_params["usd_per_hour"] == "2.0"
    assert len(fake.created) == 1


def test_returning_to_an_analysed_configuration_is_instant(fake) -> None:  # noqa: ANN001
    at = app(model="tiny-bert")
    at.button(key="analyze").click().run()
    at.selectbox(key="mm_model").set_value("tiny-gpt2").run()
    assert not at.metric and "Analyze" in at.info[0].value
    at.selectbox(key="mm_model").set_value("tiny-bert").run()
    assert metrics(at)["Optimal batch size"] == "192"
    at.button(key="analyze").click().run()
    assert len(fake.created) == 1


def test_while_a_sweep_runs_analyze_is_disabled_and_cancel_stops_it(fake) -> None:  # noqa: ANN001
    fake.gate = threading.Event()
    at = app(sync=False, model="tiny-bert")
    at.button(key="analyze").click().run()
    run_until(at, lambda at: "1 probes" in at.get("progress")[0].proto.text)
    assert at.button(key="analyze").disabled and not at.button(key="cancel").disabled
    assert trace(chart(at), "fits")["x"] == [8]
    at.button(key="cancel").click().run()
    fake.gate.set()
    run_until(at, lambda at: bool(at.warning))
    assert "Sweep cancelled" in at.warning[0].value
    assert len(fake.created) == 1 and not at.exception


def _double_click() -> None:
    import streamlit as st

    from memorymark.settings import Settings
    from memorymark.ui import sweep_runner

    settings = Settings(model="tiny-bert", gpu="A10")
    first = sweep_runner.start_sweep(settings)
    second = sweep_runner.start_sweep(settings.with_protocol("inference-style"))
    st.write(f"same job: {first is second}, running: {first.running}")
    first.cancel()


def test_a_second_click_while_a_sweep_runs_starts_nothing(fake) -> None:  # noqa: ANN001
    fake.gate = threading.Event()
    at = AppTest.from_function(_double_click, default_timeout=TIMEOUT).run()
    fake.gate.set()
    assert at.markdown[0].value == "same job: True, running: True"
    at.session_state[sweep_runner.JOB_KEY].thread.join(10)
    assert len(fake.created) == 1


def test_a_real_device_sweep_waits_for_the_lock_with_a_message(fake, fresh_caches) -> None:  # noqa: ANN001
    fresh_caches.acquire()  # another session is measuring on the GPU
    at = app(sync=False, model="tiny-bert", backend="cpu")
    at.button(key="analyze").click().run()
    run_until(at, lambda at: any("Waiting for the GPU" in i.value for i in at.info))
    fresh_caches.release()
    run_until(at, lambda at: bool(at.metric))
    assert metrics(at)["Optimal batch size"] == "192"


def test_an_engine_error_is_an_st_error_with_a_next_step(fake) -> None:  # noqa: ANN001
    fake.error = ValueError("unknown GPU 'B300'; known: T4, A10")
    at = app(model="tiny-bert")
    at.button(key="analyze").click().run()
    assert not at.exception
    assert "unknown GPU 'B300'" in at.error[0].value
    assert "Next step: pick another GPU" in at.error[0].value


def test_no_batch_that_fits_is_an_error_with_a_next_step(fake) -> None:  # noqa: ANN001
    fake.base_bytes = 30 * GIB  # the weights alone exceed the A10
    at = app(model="tiny-bert")
    at.button(key="analyze").click().run()
    assert not at.exception
    assert at.error[0].value.startswith("No batch size trains on this A10")
    assert "Next step: pick a GPU with more memory" in at.error[0].value
    assert metrics(at)["Optimal batch size"] == "none"


def test_the_gpu_in_this_machine_is_the_default_and_labelled_measured(monkeypatch) -> None:  # noqa: ANN001
    h100 = dataclasses.replace(gpus.find_gpu("H100"), measured=True)
    monkeypatch.setattr(sidebar, "detected_gpu", lambda: h100)
    at = app()
    choice = at.selectbox(key="mm_gpu_choice")
    assert choice.value == sidebar.LOCAL
    assert choice.options[0] == "H100 80GB: this machine (measured)"
    assert choice.options[1] == "T4, 15 GiB (simulated)"
    assert "H100 80GB, 79 GiB (measured)" in choice.options  # the same card from the catalog
    assert "gpu" not in at.query_params


def test_a_bad_link_falls_back_to_defaults_with_a_warning() -> None:
    at = app(model="bert", seq_len="9999")
    assert not at.exception
    assert "seq_len 9999 exceeds bert's 512 positions" in at.sidebar.warning[0].value
    assert at.number_input(key="mm_seq_len").value == 128


def test_the_link_opens_the_same_configuration() -> None:
    at = app(model="tiny-resnet", image_size="32", gpu="T4", optimizer="sgd", current_batch="8")
    assert not at.exception
    assert at.selectbox(key="mm_model").value == "tiny-resnet"
    assert at.selectbox(key="mm_gpu_choice").value == "T4"
    assert at.number_input(key="mm_image_size").value == 32
    assert at.selectbox(key="mm_optimizer").value == "sgd"
    assert at.query_params["current_batch"] == "8"


def test_a_model_outside_the_catalog_comes_from_the_text_box_and_the_link() -> None:
    config = Path(memorymark.models.CONFIG_DIR, "tiny-bert.json")
    at = app(model=f"file:{config}")
    assert not at.exception
    assert at.text_input(key="mm_model_spec").value == f"file:{config}"
    assert at.query_params["model"] == f"file:{config}"
    at.text_input(key="mm_model_spec").set_value("nonsense:x").run()
    assert "unknown model source 'nonsense'" in at.error[0].value
    assert not at.button  # no Analyze until the settings can run


def test_the_real_engine_on_a_tiny_model_finds_an_oom_boundary() -> None:
    at = app(model="tiny-gpt2", gpu_memory_gib="1")
    at.button(key="analyze").click().run()
    assert not at.exception
    optimal = int(metrics(at)["Optimal batch size"])
    spec = chart(at)
    assert optimal in trace(spec, "fits")["x"]
    assert trace(spec, "OOM")["x"] and min(trace(spec, "OOM")["x"]) > optimal
    assert trace(spec, f"optimal (batch {optimal})")["x"] == [optimal]
    names = [t["name"] for t in spec["data"]]
    assert {"usable (0.56 GiB)", "GPU total (1.00 GiB)", "fit"} <= set(names)


def test_the_real_engine_through_the_worker_thread_and_fragment() -> None:
    at = app(sync=False, model="tiny-bert", max_batch="64")
    at.button(key="analyze").click().run()
    run_until(at, lambda at: bool(at.metric))
    assert not at.exception
    assert metrics(at)["Optimal batch size"] == "64"
    assert at.info[0].value.startswith("Every batch up to 64 fits")
