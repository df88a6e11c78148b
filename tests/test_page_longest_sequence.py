"""The Longest sequence page under AppTest, on the real engine (tiny GPT-2, simulated)."""

from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from memorymark.ui import sweep_runner

PAGE = "../pages/4_Longest_sequence.py"  # AppTest resolves paths against this file
TIMEOUT = 90


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own result cache (process-wide in the app); with no server runtime
    the page's engine calls run inline, in the test process."""
    cache = sweep_runner.ResultCache()
    monkeypatch.setattr(sweep_runner, "result_cache", lambda: cache)


def test_the_page_finds_the_longest_sequence_at_the_current_batch() -> None:
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.query_params.update(model="tiny-gpt2", current_batch="2", seq_step="32", gpu="T4")
    at = at.run()
    assert not at.exception
    at = next(b for b in at.button if b.label == "Find the longest sequence").click().run()
    assert not at.exception
    metric = at.metric[0]
    assert metric.value == "128 tokens"  # tiny GPT-2's 128 positions, far below a T4's memory
    assert "(simulated)" in metric.label
    table = at.dataframe[0].value
    assert list(table["Sequence length"])[0] == 128
    assert set(table["Why not"]) == {""}  # every length fits: nothing to explain
    # Wide enough for its sentence (it was cut to "needs a cache fl...").
    assert json.loads(at.dataframe[0].proto.columns)["Why not"]["width"] == "large"
    # The answer that ends the worker's stream is not counted as one more probe.
    # The answer that ends the worker's stream is not counted as one more probe.
    labels = [getattr(e, "label", None) for e in at.main.children.values()]
    assert f"All {len(table)} measured" in labels
    assert "--find seq-len" in at.main.caption[-1].value


def test_an_image_model_has_no_sequence_to_search() -> None:
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.query_params.update(model="tiny-resnet")
    at = at.run()
    assert not at.exception
    assert "image models have no sequence length" in at.info[0].value


def test_the_main_page_sends_a_sequence_search_to_its_page() -> None:
    at = AppTest.from_file("../app.py", default_timeout=TIMEOUT)
    at.query_params.update(model="tiny-gpt2", find="seq-len")
    at = at.run()
    assert not at.exception
    assert "Longest sequence page" in at.info[0].value
    assert not [b for b in at.button if b.label == "Analyze"]
