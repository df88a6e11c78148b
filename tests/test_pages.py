"""The Compare GPUs and Backward-pass proof pages under AppTest, on the real engine (tiny model)."""

from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

import memorymark.analyses.compare
from memorymark import gpus
from memorymark.ui import sweep_runner

COMPARE = "../pages/1_Compare_GPUs.py"  # AppTest resolves paths against this file
PROOF = "../pages/2_Backward_pass_proof.py"
TIMEOUT = 60


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own result cache (process-wide in the app); with no server runtime
    the pages' engine calls run inline, in the test process."""
    cache = sweep_runner.ResultCache()
    monkeypatch.setattr(sweep_runner, "result_cache", lambda: cache)


def page(path: str, **query: str) -> AppTest:
    at = AppTest.from_file(path, default_timeout=TIMEOUT)
    at.query_params.update(query)
    return at.run()


def click(at: AppTest, label: str) -> AppTest:
    return next(b for b in at.button if b.label == label).click().run()


def chart(at: AppTest) -> dict:
    return json.loads(at.get("plotly_chart")[0].proto.spec)


def test_compare_shows_every_catalog_gpu_from_one_set_of_probes() -> None:
    at = page(COMPARE, model="tiny-gpt2", max_batch="64", hours_per_run="4")
    assert not at.exception
    at = click(at, "Compare every GPU")
    assert not at.exception
    spec = chart(at)
    assert spec["data"][0]["x"] == gpus.gpu_names()
    assert spec["data"][0]["y"] == [64] * len(gpus.CATALOG)  # a tiny model fits up to the cap
    table = at.dataframe[0].value
    assert list(table["GPU"]) == gpus.gpu_names()
    a10 = table[table["GPU"] == "A10"].iloc[0]
    # The user's 4 h are at their current batch (16) on the chosen A10; at its max batch (64)
    # the same GPU is faster, as Analyze's speedup says.
    speed = a10["Speed (est.)"]
    assert speed > 1.0
    # The table rounds the speed to 2 decimals and the hours from the unrounded speed: 0.005 of
    # speed near 1 moves 4 h by 0.02 h, and the hours' own rounding adds 0.005.
    assert a10["h/run (est.)"] == pytest.approx(4.0 / speed, abs=0.03)
    assert a10["$/run (est.)"] == pytest.approx(0.86 * 4.0 / speed, abs=0.03)
    assert a10["TFLOP/s"] == 31.2  # fp32 at the plain FP32 rate, PyTorch's default
    assert "allow_tf32 = False" in at.info[0].value  # why an A100 can rank below an A10
    caption = at.main.caption[-1].value
    assert f"probes for {len(gpus.CATALOG)} GPUs" in caption
    assert "estimated as Analyze estimates speedup" in caption


def test_compare_rescales_hours_without_running_the_probes_again(monkeypatch) -> None:
    calls = []
    real = memorymark.analyses.compare.compare_gpus

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(memorymark.analyses.compare, "compare_gpus", counting)
    at = click(page(COMPARE, model="tiny-bert", max_batch="32"), "Compare every GPU")
    at.slider(key="mm_hours_per_run").set_value(10.0).run()
    table = at.dataframe[0].value
    a10 = table[table["GPU"] == "A10"].iloc[0]
    speed = a10["Speed (est.)"]
    assert a10["h/run (est.)"] == pytest.approx(10.0 / speed, abs=0.02)
    assert len(calls) == 1


def test_a_compare_failure_is_an_st_error_with_a_next_step(monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("could not build the model")

    monkeypatch.setattr(memorymark.analyses.compare, "compare_gpus", broken)
    at = click(page(COMPARE, model="tiny-bert"), "Compare every GPU")
    assert not at.exception
    assert "could not build the model" in at.error[0].value and "Next step" in at.error[0].value


def test_proof_shows_four_protocols_with_ratios_and_max_batches() -> None:
    at = page(PROOF, model="tiny-bert", max_batch="64", current_batch="8")
    assert not at.exception
    assert "batch 8" in at.info[0].value
    at = click(at, "Run the proof")
    assert not at.exception
    assert at.status[0].label == "All 4 measured"  # the status box listed each as it landed
    landed = [m.value for m in at.status[0].markdown]
    assert len(landed) == 4 and landed[0].startswith("**Forward only (no_grad, eval)**: ")
    assert all("at batch 8 (simulated); max batch" in line for line in landed)
    bars = chart(at)["data"][0]
    assert len(bars["x"]) == 4 and bars["x"][0].startswith("Forward only")
    assert all("max batch" in text for text in bars["text"])
    assert bars["y"][3] > bars["y"][1] > bars["y"][0]  # training > inference-style > forward
    ratio = at.metric[0].value
    assert ratio.endswith("x") and float(ratio[:-1]) > 1.2
    # The verdict is on the card itself, not in a tooltip; a PASS needs no warning beside it.
    assert at.metric[0].proto.delta.split(":")[0] == "PASS"
    assert not at.warning
    rows = at.dataframe[0].value
    assert list(rows["x forward-only"])[0] == 1.0
    assert "simulated" in chart(at)["layout"]["title"]["text"]


def test_proof_warns_when_backward_adds_less_than_a_gradient_per_weight() -> None:
    # bf16-mixed at batch 1: autocast's bf16 copies raise the forward-only peak, activations are
    # few, so forward+backward is only 1.7x it: a weak demonstration, which the page says.
    at = page(PROOF, model="tiny-bert", max_batch="16", current_batch="1", precision="bf16-mixed")
    at = click(at, "Run the proof")
    assert not at.exception
    assert at.metric[0].value == "1.70x"
    assert at.metric[0].proto.delta.startswith("WARN")
    assert "try a larger batch" in at.warning[0].value
