"""Settings the chosen GPU cannot train are refused in the sidebar at once, in the app's words
(widget names, not CLI flags), and an engine refusal that still reaches a job reads the same.

The case a user hit: bf16-mixed on a T4 (no bf16) was accepted, then Analyze showed "Failed:
0 probes" under a full green bar, with advice naming `--precision`.
"""

from __future__ import annotations

import pytest
from app_helpers import app, shown

from memorymark import gpus
from memorymark.settings import Settings
from memorymark.ui import sidebar, views

pytestmark = pytest.mark.usefixtures("fresh_caches")
T4 = gpus.find_gpu("T4")


def test_bf16_on_a_t4_is_refused_in_the_sidebar_with_what_to_choose(fake) -> None:
    at = app(model="tiny-bert", gpu="T4", precision="bf16-mixed")
    assert not at.exception
    message = shown(at.error[0].value)
    assert "the T4 has no bf16 (compute capability 7.5" in message
    assert "Set **Precision** to 16-mixed" in message and "32-true" in message
    assert "pick a **GPU** with bf16" in message
    assert "--" not in message  # no CLI flag in the app
    assert not [b for b in at.button if b.label == "Analyze"]  # nothing to fail later
    assert fake.created == []


def test_a_gpu_with_bf16_or_fp16_on_a_t4_is_not_refused() -> None:
    assert sidebar.gpu_refusal(Settings(precision="16-mixed"), T4) is None
    assert sidebar.gpu_refusal(Settings(precision="bf16-mixed"), gpus.find_gpu("A10")) is None
    refusal = sidebar.gpu_refusal(Settings(attention="flash_attention_2", precision="16-mixed"), T4)
    assert refusal is not None and "Set **Attention** to sdpa" in refusal


def test_an_engine_refusal_reaching_a_job_names_the_widget_and_shows_no_full_bar(fake) -> None:
    fake.error = ValueError(
        "the T4 has no bf16 support (compute capability 7.5, bf16 needs 8.0 or newer): use "
        "--precision 16-mixed (fp16 autocast with a GradScaler)"
    )
    at = app(model="tiny-bert")  # the sidebar's own check passes: the engine refuses
    at.button(key="analyze").click().run()
    assert not at.exception
    error = shown(at.error[0].value)
    assert "set Precision to 16-mixed" in error and "--precision" not in error
    assert "Next step: set Precision to 16-mixed or 32-true in the sidebar" in error
    assert not at.get("progress")  # a failed job never shows a full (green) bar
    assert any(c.value.startswith("Failed after 0 probes") for c in at.caption)


def test_app_words_put_each_flag_as_its_widget() -> None:
    assert views.app_words("use --attention sdpa") == "set Attention to sdpa"
    assert views.app_words("use --backend sim") == "set Backend (Advanced) to sim"
