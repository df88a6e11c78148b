"""The Scale out page under AppTest on the real engine (tiny model, fake ranks), and its
engine call: per-rank memory falling with the GPU count, and the cost per run."""

from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from memorymark import Session, Settings
from memorymark.ui import sweep_runner

PAGE = "../pages/5_Scale_out.py"  # AppTest resolves paths against this file


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own result cache (process-wide in the app); with no server runtime
    the page's engine calls run inline, in the test process."""
    cache = sweep_runner.ResultCache()
    monkeypatch.setattr(sweep_runner, "result_cache", lambda: cache)


def test_rank_memory_falls_and_cost_is_priced_per_count():
    s = Settings(model="tiny-gpt2", seq_len=32, gpu="a10", backend="sim", dist="fsdp",
                 max_batch=16)  # fmt: skip
    rows = list(Session(s).scale_out((1, 2), samples_per_run=1e6))
    assert [r.gpus for r in rows] == [1, 2]
    assert rows[1].states_bytes < rows[0].states_bytes
    assert all(r.per_gpu_batch == 16 and r.global_batch == 16 * r.gpus for r in rows)
    one = rows[1]
    assert one.step_seconds == max(one.compute_seconds, one.comm_seconds)
    hours = 1e6 / one.samples_per_second / 3600
    assert one.usd_per_run == pytest.approx(2 * 0.86 * hours)


def test_the_page_asks_for_a_strategy_then_draws_each_count():
    at = AppTest.from_file(PAGE, default_timeout=90)
    at.query_params.update(model="tiny-gpt2", seq_len="32", max_batch="8")
    at.run()
    assert not at.exception
    assert "Many GPUs" in at.info[0].value
    at.query_params.update(dist="fsdp")
    at = AppTest.from_file(PAGE, default_timeout=90)
    at.query_params.update(model="tiny-gpt2", seq_len="32", max_batch="8", dist="fsdp")
    at.run()
    at.multiselect[0].set_value([1, 2]).run()
    at = next(b for b in at.button if b.label == "Scale out").click().run()
    assert not at.exception
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert spec["data"][1]["y"] == [8, 8]  # the largest per-GPU batch on 1 and 2 GPUs
    table = at.dataframe[0].value
    assert list(table["GPUs"]) == [1, 2]
    assert list(table["global batch"]) == [8, 16]
    assert at.metric[0].value == "1 GPU"  # never "1 GPUs"


def test_the_page_lists_the_parallel_layouts_of_one_count():
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.query_params.update(model="tiny-llama", seq_len="32", max_batch="8", dist="fsdp")
    at.run()
    at.selectbox(key="layout_gpus").set_value(4).run()
    at = next(b for b in at.button if b.label == "Search layouts").click().run()
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["layout"])[0] == "FSDP 4"  # the only layout simulated today, best
    assert list(table["per-GPU batch"])[0] == 8
    assert any("steps traced" in m.value for m in at.markdown)
