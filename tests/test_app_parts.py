"""The app's builders for the newer pieces: the throughput figure, which memory number is which,
how far off each fix is, the probes CSV, the compare and proof rows, and error next steps."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import replace

import pytest
from app_samples import A10, MIB, by_name, gpu_fit, probe, sample_proof, sample_report

from memorymark.measurement import Measurement
from memorymark.models import sources
from memorymark.reporting import exports
from memorymark.settings import Settings
from memorymark.ui import compare_view, model_inputs, results, tables, throughput_chart, views
from memorymark.units import GIB


def timed_probe(batch: int, samples_per_second: float, **kwargs) -> Measurement:
    return replace(
        probe(batch, **kwargs),
        predicted_reserved_bytes=GIB + 110 * MIB * batch,
        required_bytes=GIB + 110 * MIB * batch,
        samples_per_second=samples_per_second,
        throughput_source="estimated",
    )


def test_throughput_figure_plots_samples_per_second_of_fitting_probes() -> None:
    ms = [timed_probe(16, 200.0), timed_probe(8, 120.0), probe(200, fits=False)]
    fig = throughput_chart.throughput_figure(ms, A10, x_range=[0.0, 250.0], current_batch=8,
                                             optimal_batch=16, knee_batch=8)  # fmt: skip
    line = by_name(fig, "samples/s (estimated)")
    assert (list(line.x), list(line.y)) == ([8, 16], [120.0, 200.0])
    assert list(by_name(fig, "current (batch 8)").y) == [120.0]
    assert list(by_name(fig, "optimal (batch 16)").y) == [200.0]
    assert fig.layout.yaxis.range == (0.0, 250.0)  # 1.2 x the best, rounded up
    shapes = {(s.type, s.x0) for s in fig.layout.shapes}
    assert ("rect", 200) in shapes and ("line", 8) in shapes
    assert "estimated from FLOPs and bytes" in fig.layout.title.text


def test_throughput_figure_says_measured_and_skips_a_knee_at_the_optimal_batch() -> None:
    m = replace(timed_probe(16, 200.0), throughput_source="measured")
    fig = throughput_chart.throughput_figure([m], A10, x_range=[0.0, 80.0], optimal_batch=16,
                                             knee_batch=16)  # fmt: skip
    assert "measured on the GPU" in fig.layout.title.text
    assert not fig.layout.shapes


def test_memory_rows_say_which_number_is_which() -> None:
    ms = tuple(timed_probe(b, 100.0 + b, fits=b < 200) for b in (8, 16, 192, 200))
    report = replace(sample_report(), measurements=ms)
    rows = {r["Figure"]: r for r in tables.memory_rows(report)}
    reserved = GIB + 110 * MIB * 192
    assert rows["Reserved at batch 192"]["Value"] == f"{reserved / GIB:.2f} GiB"
    assert rows["Reserved at batch 192"]["Source"] == "simulated"
    headroom = A10.usable_bytes - reserved
    assert rows["Headroom at batch 192"]["Value"] == f"{round(headroom / GIB, 3):.2f} GiB"
    assert rows["First batch out of memory"]["Value"] == "batch 200"
    assert "CUDA context" in rows["Usable capacity"]["Meaning"]


def test_how_far_off_says_the_ratio_or_what_is_to_spare() -> None:
    assert tables.how_far_off(3 * GIB, 2 * GIB) == "3.00 GiB of 2.00 GiB: 1.5x the limit"
    assert tables.how_far_off(GIB, 2 * GIB) == "1.00 GiB of 2.00 GiB: fits, 1.00 GiB to spare"
    assert tables.how_far_off(GIB, 0).endswith("the margin leaves no room at all")


def test_the_baseline_peak_is_the_reports_batch_1_requirement() -> None:
    report = sample_report()
    assert tables.baseline_peak(report) is None
    assert tables.baseline_peak(replace(report, batch_1_required_bytes=5 * GIB)) == 5 * GIB


def test_the_probes_csv_has_reserved_bytes_and_throughput() -> None:
    report = replace(sample_report(), measurements=(timed_probe(8, 120.0),))
    row = next(csv.DictReader(io.StringIO(exports.probes_csv(report))))
    assert row["predicted_reserved_bytes"] == str(GIB + 110 * MIB * 8)
    assert (row["samples_per_second"], row["throughput_source"]) == ("120.0", "estimated")


def test_compare_table_has_the_estimated_relative_speed() -> None:
    row = replace(gpu_fit("H100", 512, 1.0), relative_speed=7.654)
    assert compare_view.table([row], Settings())[0]["Speed (est.)"] == 7.65


def test_protocol_line_as_each_protocol_lands() -> None:
    r = sample_proof().results[1]
    assert tables.protocol_line(r, 16) == (
        "**forward backward**: 1.500 GiB at batch 16 (simulated); max batch 272"
    )


@pytest.mark.parametrize(
    ("error", "step"),
    [
        ("unknown GPU 'B300'; known: T4, A10", "pick another GPU"),
        ("no default LoRA targets for resnet; name the modules", "LoRA target modules"),
        ("ResNet does not support gradient checkpointing; turn it off", "Activation checkpointing"),
        ("could not fetch x's config.json from the Hugging Face hub (OSError)", "upload it"),
        ("unknown model 'bret'; did you mean 'bert'?", "pick a model from the list"),
        ("seq_len 9999 exceeds bert's 512 positions", "lower the sequence length"),
    ],
)
def test_every_engine_error_gets_a_next_step(error: str, step: str) -> None:
    assert step in views.next_step(error)


def test_an_upload_is_saved_once_per_content(tmp_path) -> None:
    first = model_inputs.save_upload("My  Model (2).json", b"{}", tmp_path)
    # A name the engine's `upload:` source accepts: no path, no "--" (sources.check_spec).
    assert re.fullmatch(r"upload:My-Model-2-[0-9a-f]{10}", first)
    assert (tmp_path / first.removeprefix("upload:") / "config.json").read_bytes() == b"{}"
    sources.check_spec(first)
    assert model_inputs.save_upload("My  Model (2).json", b"{}", tmp_path) == first
    assert model_inputs.save_upload("My  Model (2).json", b"{ }", tmp_path) != first


def test_throughput_figure_says_why_it_is_empty() -> None:
    def title(ms: list[Measurement]) -> str:
        return throughput_chart.throughput_figure(ms, A10, x_range=[0.0, 80.0]).layout.title.text

    assert title([]).endswith("waiting for the first probe</sup>")
    assert title([probe(8, fits=False)]).endswith("no batch fitted, so none was timed</sup>")
    assert title([probe(8)]).endswith("not known for this backend</sup>")


def test_cards_price_nothing_against_a_current_batch_that_crashes() -> None:
    crash = replace(probe(400, fits=False), required_bytes=40 * GIB)
    report = replace(sample_report(current=400), measurements=(probe(8), probe(16), crash))
    cards = {label: (value, delta) for label, value, _, delta in results.metric_cards(report)}
    assert cards["Memory at batch 400 (simulated)"][0] == "OOM"
    assert cards["Usable memory wasted"] == ("n/a", "the current batch crashes")
    assert cards["Annual savings (estimated)"] == ("n/a", "the current batch crashes")
    assert cards["Speedup (the current batch crashes)"][0] == "n/a"
