"""Exports: the environment stamp in JSON, CSV and Markdown, file names, and the Markdown page."""

from __future__ import annotations

import csv
import dataclasses
import io
import json

import pytest
from app_samples import sample_report

from memorymark.environment import stamp
from memorymark.reporting import exports
from memorymark.reporting.markdown import escape
from memorymark.search.plan import TrainingPlan
from memorymark.settings import Settings

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)

WHEN = "2026-01-02T03:04:05Z"


def stamped(report=None):
    return dataclasses.replace(
        report or sample_report(),
        stamp=stamp(backend="sim", device="A10", memory_source="simulated", finished_utc=WHEN),
    )


def test_json_and_csv_carry_the_environment_stamp() -> None:
    report = stamped()
    data = json.loads(exports.report_json(report))
    env = data["environment"]
    assert env["finished_utc"] == WHEN
    assert env["memorymark_version"] and env["torch_version"] and env["transformers_version"]
    assert env["python_version"] and env["backend"] == "sim" and env["device"] == "A10"
    rows = list(csv.DictReader(io.StringIO(exports.probes_csv(report))))
    assert len(rows) == 4
    assert {r["finished_utc"] for r in rows} == {WHEN}
    assert {r["torch_version"] for r in rows} == {env["torch_version"]}
    assert {r["model"] for r in rows} == {"tiny-bert"}
    assert rows[0]["backend"] == "sim"  # the probe's own column, not overwritten


def test_file_names_carry_model_gpu_key_settings_and_time() -> None:
    report = stamped()
    assert exports.file_name(report, "json") == (
        "memorymark-tiny-bert-A10-32-true-seq128-bs16-20260102T030405Z.json"
    )
    assert exports.file_name(report, "markdown").endswith(".md")
    image = dataclasses.replace(
        report, settings=Settings(model="resnet", precision="bf16-mixed", current_batch=64)
    )
    assert (
        exports.file_stem(image) == "memorymark-resnet-A10-bf16-mixed-img224-bs64-20260102T030405Z"
    )


def test_file_names_are_safe_slugs() -> None:
    assert exports.slug("file:/tmp/My Config (v2).json") == "file-tmp-My-Config-v2.json"
    assert exports.slug("../../etc/passwd") == "etc-passwd"
    assert exports.slug("A100 80GB") == "A100-80GB"
    assert exports.slug("???") == "x"
    assert len(exports.slug("a" * 500)) == 40


def test_markdown_report_has_answer_settings_probes_environment_and_command() -> None:
    report = dataclasses.replace(
        stamped(),
        plan=TrainingPlan(micro_batch=64, accumulation_steps=4, target_batch=256),
    )
    text = exports.markdown(report)
    assert text.startswith("## MemoryMark: tiny-bert on A10 (simulated)")
    assert "| Optimal batch size | 192 (2% margin kept free) |" in text
    assert "| Max batch size | 192 (keeps the margin free: 19.75 GiB reserved) |" in text
    assert "| Memory at the optimal batch (simulated) | 19.750 GiB (peak allocated) |" in text
    assert "| Plan for a global batch of 256 | micro-batch 64 x 4 accumulation steps |" in text
    # One table row per probe, sorted by batch, the OOM saying so.
    probe_rows = [line for line in text.splitlines() if line[:2] == "| " and line[2].isdigit()]
    assert [row.split(" | ")[0] for row in probe_rows] == ["| 8", "| 16", "| 192", "| 200"]
    assert "| 200 | OOM | 20.531 |" in text
    assert f"finished {WHEN}" in text and "MemoryMark " in text and "torch " in text
    assert "```sh\nmemorymark analyze tiny-bert --gpu A10\n```" in text


def test_markdown_shows_user_text_as_typed_never_as_a_link() -> None:
    assert escape("[Sign in](//evil.example/login)") == "\\[Sign in\\](//evil.example/login)"
    assert escape("a|b `c` <img>") == "a\\|b \\`c\\` \\<img\\>"
    assert escape("two\nlines") == "two lines"


def test_a_command_line_with_backticks_cannot_close_its_code_block() -> None:
    from memorymark.reporting.markdown import _fence

    fenced = _fence("echo ````")
    assert fenced.startswith("`````sh\n") and fenced.endswith("\n`````")
