"""The main page under AppTest: settings, Analyze, live sweep, results, cancel, cache, errors."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
from app_helpers import (
    TIMEOUT,
    app,
    chart,
    metrics,
    run_until,
    shown,
    trace,
)
from streamlit.testing.v1 import AppTest

import memorymark.models
from memorymark import gpus
from memorymark.ui import sidebar, sweep_runner, views
from memorymark.units import GIB

pytestmark = pytest.mark.usefixtures("fresh_caches")


def test_analyze_shows_metrics_chart_verdict_and_downloads(fake) -> None:
    at = app(model="tiny-bert")
    assert not at.exception
    assert "click **Analyze**" in at.info[0].value
    at.button(key="analyze").click().run()
    assert not at.exception
    shown = metrics(at)
    assert shown["Optimal batch size"] == "192"
    assert shown["Memory at batch 16 (simulated)"] == "2.60 GiB"
    assert shown["Memory at the optimal batch (simulated)"] == "20.20 GiB"
    # samples/s 1000*b/(b+16): 923.08 at 192 over 500 at 16; the batch ratio is secondary.
    assert shown["Speedup (estimated throughput)"] == "1.85x"
    speedup = next(m for m in at.metric if m.label.startswith("Speedup"))
    assert speedup.proto.delta == "batch ratio 12.0x"
    assert shown["Annual savings (estimated)"] == "$79"  # 0.86 $/h * 2 h * 100 * (1 - 1/1.846)
    assert at.success[0].value.startswith("Batch 16 uses 12% of this A10's usable memory")
    spec = chart(at, "sweep_chart")
    assert trace(spec, "fits")["x"] == [8, 16, 192]
    assert trace(spec, "OOM")["x"] == [200]
    assert "simulated" in spec["layout"]["title"]["text"]
    assert [b.label for b in at.get("download_button")] == [
        "Download JSON report", "Download probes CSV", "Download Markdown report"]  # fmt: skip
    # The fake's batch 200 runs out below the capacity (21.06 of 21.68 GiB): the log says it
    # ran out there, never a bare "needs 21.1 GiB of 21.7" that reads as a fit.
    assert "batch  200 OOM, ran out of memory: fragmented, though it needs 21.06 GiB" in (
        at.code[0].value
    )
    assert at.query_params["model"] == "tiny-bert"


def test_a_cost_slider_reprices_without_a_second_sweep(fake) -> None:
    at = app(model="tiny-bert")
    at.button(key="analyze").click().run()
    at.slider(key="mm_usd_per_hour").set_value(2.0).run()
    assert metrics(at)["Annual savings (estimated)"] == "$183"  # 2 * 2 * 100 * (1 - 1/1.846)
    assert at.query_params["usd_per_hour"] == "2.0"
    assert len(fake.created) == 1


def test_returning_to_an_analysed_configuration_is_instant(fake) -> None:
    at = app(model="tiny-bert")
    at.button(key="analyze").click().run()
    at.selectbox(key="mm_model").set_value("tiny-gpt2").run()
    assert not at.metric and "Analyze" in at.info[0].value
    at.selectbox(key="mm_model").set_value("tiny-bert").run()
    assert metrics(at)["Optimal batch size"] == "192"
    at.button(key="analyze").click().run()
    assert len(fake.created) == 1
    # Served from the cache, and the log says so rather than passing its timing off as new.
    assert "cached: optimal batch 192" in at.code[0].value


def test_while_a_sweep_runs_analyze_is_disabled_and_cancel_stops_it(fake) -> None:
    fake.gate = threading.Event()
    at = app(sync=False, model="tiny-bert")
    at.button(key="analyze").click().run()
    run_until(at, lambda at: "1 probe" in at.get("progress")[0].proto.text)
    assert at.button(key="analyze").disabled and not at.button(key="cancel").disabled
    assert trace(chart(at, "sweep_chart"), "fits")["x"] == [8]
    at.button(key="cancel").click().run()
    fake.gate.set()
    run_until(at, lambda at: bool(at.warning))
    assert "Sweep cancelled" in at.warning[0].value
    assert len(fake.created) == 1 and not at.exception
    assert not at.get("progress")  # a full bar would read as success
    assert any(c.value.startswith("Cancelled after 1 probe,") for c in at.caption)


def test_after_the_last_probe_the_bar_says_what_the_report_checks(fake) -> None:
    fake.stages = ("checking the plan for a global batch of 512",)
    fake.report_gate = threading.Event()
    at = app(sync=False, model="tiny-bert")
    at.button(key="analyze").click().run()
    try:
        run_until(at, lambda at: "Last probe done" in at.get("progress")[0].proto.text)
        bar = at.get("progress")[0].proto
        assert bar.text.startswith(
            "Last probe done; checking the plan for a global batch of 512 (4 probes, "
        )
        assert bar.value < 100  # not done yet
    finally:
        fake.report_gate.set()
    run_until(at, lambda at: bool(at.metric))
    assert metrics(at)["Optimal batch size"] == "192"


def _double_click() -> None:
    import streamlit as st

    from memorymark.settings import Settings  # AppTest runs this function's source alone
    from memorymark.ui import sweep_runner

    settings = Settings(model="tiny-bert", gpu="A10")
    first = sweep_runner.start_sweep(settings)
    second = sweep_runner.start_sweep(settings.with_protocol("inference-style"))
    st.write(f"same job: {first is second}, running: {first.running}")
    first.cancel()


def test_a_second_click_while_a_sweep_runs_starts_nothing(fake) -> None:
    fake.gate = threading.Event()
    at = AppTest.from_function(_double_click, default_timeout=TIMEOUT).run()
    fake.gate.set()
    assert at.markdown[0].value == "same job: True, running: True"
    at.session_state[sweep_runner.JOB_KEY].future.result(10)
    assert len(fake.created) == 1


def test_a_real_device_sweep_waits_for_the_lock_with_a_message(fake, fresh_caches) -> None:
    fresh_caches.acquire()  # another session is measuring on the GPU
    at = app(sync=False, model="tiny-bert", backend="cpu")
    at.button(key="analyze").click().run()
    run_until(at, lambda at: any("Waiting for the GPU" in i.value for i in at.info))
    fresh_caches.release()
    run_until(at, lambda at: bool(at.metric))
    assert metrics(at)["Optimal batch size"] == "192"


def test_an_engine_error_is_an_st_error_with_a_next_step(fake) -> None:
    fake.error = ValueError("unknown GPU 'B300'; known: T4, A10")
    at = app(model="tiny-bert")
    at.button(key="analyze").click().run()
    assert not at.exception
    assert "unknown GPU 'B300'" in shown(at.error[0].value)
    assert "Next step: pick another GPU" in at.error[0].value


def test_no_batch_that_fits_is_an_error_with_a_next_step(fake) -> None:
    fake.base_bytes = 30 * GIB  # the weights alone exceed the A10
    at = app(model="tiny-bert")
    at.button(key="analyze").click().run()
    assert not at.exception
    assert at.error[0].value.startswith("No batch size trains on this A10")
    assert "Next step: pick a GPU with more memory" in at.error[0].value
    assert metrics(at)["Optimal batch size"] == "none"


def test_the_gpu_in_this_machine_is_the_default_and_labelled_measured(monkeypatch) -> None:
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
    assert "seq_len 9999 exceeds bert's 512 positions" in shown(at.sidebar.warning[0].value)
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
    at = app(model="timm:resnet18")
    assert not at.exception
    assert at.text_input(key="mm_model_spec").value == "timm:resnet18"
    assert at.query_params["model"] == "timm:resnet18"
    at.text_input(key="mm_model_spec").set_value("nonsense:x").run()
    assert "unknown model source 'nonsense'" in shown(at.error[0].value)
    assert not at.button  # no Analyze until the settings can run


def test_a_link_cannot_make_the_app_read_a_server_path() -> None:
    config = Path(memorymark.models.CONFIG_DIR, "tiny-bert.json")
    at = app(model=f"file:{config}")
    assert not at.exception
    assert any("only from its uploads" in w.value for w in at.warning)
    assert at.text_input(key="mm_model_spec").value == ""  # the defaults, not the path


def test_the_real_engine_on_a_tiny_model_finds_an_oom_boundary() -> None:
    at = app(model="tiny-gpt2", gpu_memory_gib="1")
    at.button(key="analyze").click().run()
    assert not at.exception
    optimal = int(metrics(at)["Optimal batch size"])
    spec = chart(at, "sweep_chart")
    assert optimal in trace(spec, "fits")["x"]
    assert trace(spec, "OOM")["x"] and min(trace(spec, "OOM")["x"]) > optimal
    assert trace(spec, f"optimal (batch {optimal})")["x"] == [optimal]
    names = [t["name"] for t in spec["data"]]
    usable = gpus.custom_gpu(1.0).usable_gib
    assert {f"usable ({usable:.2f} GiB)", "GPU total (1.00 GiB)", "fit"} <= set(names)
    speed = chart(at, "throughput_chart")  # the engine's roofline estimate, per fitting probe
    line = trace(speed, "samples/s (estimated)")
    assert optimal in line["x"] and all(y > 0 for y in line["y"])
    assert "estimated from FLOPs and bytes" in speed["layout"]["title"]["text"]
    assert f"per_device_train_batch_size={optimal}," in at.code[1].value


def test_the_real_engine_through_the_worker_thread_and_fragment() -> None:
    at = app(sync=False, model="tiny-bert", max_batch="64")
    at.button(key="analyze").click().run()
    run_until(at, lambda at: bool(at.metric))
    assert not at.exception
    assert metrics(at)["Optimal batch size"] == "64"
    # (on a torch past the rules' verified releases, a note on them comes first)
    assert any(i.value.startswith("Every batch up to 64 fits") for i in at.info)


def test_another_model_starts_from_its_own_task() -> None:
    at = app(model="tiny-bert")
    assert at.session_state["mm_task"] == "sequence-classification"
    at.selectbox(key="mm_model").set_value("tiny-gpt2").run()
    # GPT-2 also trains sequence classification, but BERT's choice is not GPT-2's: causal-lm.
    assert at.session_state["mm_task"] == "causal-lm"
    assert "task" not in at.query_params


def test_a_linked_task_is_kept() -> None:
    at = app(model="tiny-gpt2", task="sequence-classification")
    assert at.session_state["mm_task"] == "sequence-classification"
    at.run()
    assert at.session_state["mm_task"] == "sequence-classification"


def test_the_live_log_shows_the_command_that_runs_these_settings(fake) -> None:
    at = app(model="tiny-bert", seq_len="64", precision="bf16-mixed", grad_accum="2")
    at.button(key="analyze").click().run()
    first = at.code[0].value.splitlines()[0]
    assert first.startswith(
        "$ memorymark analyze tiny-bert --seq-len 64 --precision bf16-mixed --grad-accum 2"
    )


def test_a_result_is_shown_when_the_settings_changed_during_its_sweep(fake) -> None:
    fake.gate = threading.Event()
    at = app(sync=False, model="tiny-bert")
    at.button(key="analyze").click().run()
    run_until(at, lambda at: "1 probe" in at.get("progress")[0].proto.text)
    at.number_input(key="mm_seq_len").set_value(64).run()  # a change while it runs
    fake.gate.set()
    run_until(at, lambda at: bool(at.metric))
    assert metrics(at)["Optimal batch size"] == "192"
    assert any("settings before your change" in i.value for i in at.info)


def test_cancel_shows_at_once_and_keeps_the_log(fake) -> None:
    fake.gate = threading.Event()  # the probe in flight never ends by itself
    at = app(sync=False, model="tiny-bert")
    at.button(key="analyze").click().run()
    run_until(at, lambda at: "1 probe" in at.get("progress")[0].proto.text)
    at.button(key="cancel").click().run()
    # Same run: no waiting for the probe in flight (a worker process is killed).
    assert "Sweep cancelled" in at.warning[0].value
    assert "batch    8 fits" in at.code[0].value  # the log of what was measured stays
    assert not at.button(key="analyze").disabled
    fake.gate.set()


def test_a_new_target_batch_replans_from_the_cached_sweep(fake) -> None:
    at = app(model="tiny-bert")
    at.button(key="analyze").click().run()
    assert metrics(at)["Optimal batch size"] == "192" and len(fake.created) == 1
    at.number_input(key="mm_target_batch").set_value(512).run()
    assert not at.exception
    assert len(fake.created) == 1  # no second sweep: only the plan for 512
    assert "re-planned from the cached sweep" in at.code[0].value
    job = at.session_state[sweep_runner.JOB_KEY]
    assert job.report.plan.target_batch == 512
    assert [m.batch_size for m in job.report.measurements] == [8, 16, 192, 200]  # the cached
    assert metrics(at)["Optimal batch size"] == "192"


@pytest.mark.parametrize(
    ("page", "title"),
    [("../app.py", "MemoryMark"), ("../pages/4_Longest_sequence.py", "Longest sequence"),
     ("../pages/5_Scale_out.py", "Scale out")],
)  # fmt: skip
def test_the_title_shows_before_the_sidebar_waits_for_a_worker(monkeypatch, page, title) -> None:
    # After a server start the sidebar's first question (this machine's GPUs) waits for a
    # worker to load torch (about half a minute on 2 cores): the page says what it is first.
    def still_starting() -> None:
        raise TimeoutError("the worker is still loading torch")

    monkeypatch.setattr(sweep_runner, "local_gpus", still_starting)
    at = AppTest.from_file(page, default_timeout=TIMEOUT)
    at.query_params.update(model="tiny-bert")
    at = at.run()
    assert at.exception  # the wait never ends here
    assert at.title[0].value == title


@pytest.mark.usefixtures("fresh_caches")
def test_a_rerun_with_nothing_new_draws_the_charts_it_built(fake, monkeypatch) -> None:
    """A running sweep's panel redraws every half second, mostly with no new probe: the
    figures are built again only when what they show changed."""
    built = []
    real = views._figures
    monkeypatch.setattr(views, "_figures", lambda *a: built.append(a) or real(*a))
    at = app(model="tiny-bert")
    at.button(key="analyze").click().run()
    assert not at.exception and len(built) == 1
    at.run()  # nothing new: the same figures
    assert len(built) == 1 and chart(at, "sweep_chart")["data"]
    at.number_input(key="mm_current_batch").set_value(8).run()
    at.button(key="analyze").click().run()  # another analysis: its own charts
    assert not at.exception and len(built) == 2


def _places(at) -> dict[str, tuple[int, ...]]:
    """Where the sweep panel's parts sit in the page's element tree (indexes from the top)."""
    places = {}

    def walk(node, path: tuple[int, ...]) -> None:
        for index, child in getattr(node, "children", {}).items():
            kind, here = getattr(child, "type", None), (*path, index)
            if kind == "caption" and str(child.value) == "Live log":
                places.setdefault("log caption", here)
            elif kind == "code":
                places.setdefault("log", here)
            elif kind == "progress":
                places.setdefault("bar", here)
            elif kind != "horizontal_block":  # not into the charts' columns
                walk(child, here)

    walk(at.main, ())
    return places


def test_the_finished_panel_takes_the_live_panels_place(fake) -> None:
    # Reported: a stale, greyed second "Live log" stayed while the results rendered: the
    # finished panel was drawn one place above the live one, which stayed until overwritten.
    fake.gate = threading.Event()
    at = app(sync=False, model="tiny-bert")
    at.button(key="analyze").click().run()
    run_until(at, lambda at: "1 probe" in at.get("progress")[0].proto.text)
    live = _places(at)
    fake.gate.set()
    run_until(at, lambda at: bool(at.metric))
    done = _places(at)
    assert set(live) == {"bar", "log caption", "log"}
    assert done == live
    assert at.get("progress")[0].proto.text.startswith("Done (4 probes, ")
    assert sum(c.value == "Live log" for c in at.caption) == 1


def test_the_bar_says_what_a_sweep_waits_for_before_its_first_probe(fresh_caches) -> None:
    # Reported: "Starting (0 probes)" for about 15 s said nothing of what it waited for.
    from memorymark.settings import Settings

    job = sweep_runner.SweepJob(settings=Settings(), future=None, channel=None)
    job.state = "starting"
    sweep_runner._A_SWEEP_STARTED.clear()
    assert views.progress_words(job).startswith("Starting a worker: the first analysis after")
    assert "load PyTorch and the model code" in views.progress_words(job)
    sweep_runner._A_SWEEP_STARTED.set()
    assert views.progress_words(job) == "Starting a worker"
    job.state = "running"
    assert views.progress_words(job) == "Building the model and tracing its first training step"
    job.measurements.append(object())
    assert views.progress_words(job) == "Sweeping"


def test_the_pipeline_widgets_set_the_layout() -> None:
    at = app(model="tiny-llama", dist="fsdp", gpus="4")
    assert not at.exception and not at.error
    at.number_input(key="mm_pp").set_value(2).run()
    at.selectbox(key="mm_pp_schedule").set_value("interleaved-1f1b").run()
    assert not at.exception
    # Interleaving holds two stages a GPU at least: the widget starts there.
    assert at.number_input(key="mm_virtual_stages").value == 2
    # tiny-llama's 2 layers cannot make 2 x 2 stages: the sidebar says so in one line.
    assert "4 pipeline stages over 2 layers" in at.error[0].value
    at.selectbox(key="mm_pp_schedule").set_value("gpipe").run()
    at.number_input(key="mm_microbatches").set_value(4).run()
    assert not at.exception and not at.error
    assert at.query_params["pp"] == "2"
    assert at.query_params["pp_schedule"] == "gpipe"
    assert at.query_params["microbatches"] == "4"
    at.selectbox(key="mm_dist").set_value("none").run()
    assert not at.exception and not at.error
    assert "pp" not in at.query_params
