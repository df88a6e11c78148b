"""The app's pure builders: figures, tables, downloads and the probe log, from engine objects."""

from __future__ import annotations

import csv
import dataclasses
import io
import json

import pytest
from app_samples import A10, MIB, by_name, gpu_fit, probe, sample_proof, sample_report

from memorymark.reporting import exports
from memorymark.reporting.json_form import report_to_dict
from memorymark.settings import Settings
from memorymark.ui import charts, compare_view, page_charts, probe_log, tables
from memorymark.units import GIB

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)


def test_affine_fit_recovers_the_line_through_fitting_probes_only() -> None:
    intercept, slope = charts.affine_fit([probe(8), probe(16), probe(64), probe(200, fits=False)])
    assert intercept == pytest.approx(GIB)
    assert slope == pytest.approx(100 * MIB)


def test_affine_fit_needs_two_distinct_batches() -> None:
    assert charts.affine_fit([probe(8)]) is None
    assert charts.affine_fit([probe(8), probe(16, fits=False)]) is None


def test_nice_ceiling_rounds_up_to_a_readable_number() -> None:
    assert [charts.nice_ceiling(v) for v in (0, 7, 23, 101, 336, 4300)] == [
        1,
        8,
        25,
        120,
        400,
        5000,
    ]


def test_axis_ranges_are_fixed_once_two_batches_fit() -> None:
    first = [probe(8), probe(16)]
    x_range, y_range = charts.axis_ranges(first, A10, max_batch=4096)
    # 1 GiB + 0.1 GiB * b reaches the A10's 22.07 GiB total at b ~ 210; 5% margin, rounded up.
    assert x_range == [0.0, 250.0]
    assert y_range == [0.0, pytest.approx(A10.total_bytes / GIB * 1.08)]
    later = [*first, probe(192), probe(200, fits=False)]
    assert charts.axis_ranges(later, A10, max_batch=4096) == (x_range, y_range)


def test_axis_ranges_start_small_are_capped_by_max_batch_and_widen_for_outliers() -> None:
    assert charts.axis_ranges([probe(8)], A10, 4096)[0] == [0.0, 80.0]
    assert charts.axis_ranges([probe(8), probe(16)], A10, 64)[0] == [0.0, 80.0]
    tiny = [probe(8, per_sample=MIB), probe(16, per_sample=MIB), probe(4096, per_sample=MIB)]
    assert charts.axis_ranges(tiny, A10, 4096)[0] == [0.0, 5000.0]


def test_sweep_figure_draws_probes_ooms_fit_and_capacity_lines() -> None:
    report = sample_report()
    fig = charts.sweep_figure(report.measurements, A10, memory_source="simulated",
                              max_batch=4096, optimal=report.optimal)  # fmt: skip
    names = [t.name for t in fig.data]
    assert names == [f"usable ({A10.usable_gib:.2f} GiB)", f"GPU total ({A10.total_gib:.2f} GiB)",
                     "fit", "fits", "OOM", "optimal (batch 192)"]  # fmt: skip
    assert list(by_name(fig, "fits").x) == [8, 16, 192]
    assert list(by_name(fig, "fits").y) == pytest.approx([1.78125, 2.5625, 19.75])
    assert list(by_name(fig, "OOM").x) == [200]
    assert by_name(fig, "OOM").marker.color == charts.RED
    assert list(fig.data[0].y) == [pytest.approx(A10.usable_gib)] * 2
    assert list(fig.data[1].y) == [pytest.approx(A10.total_gib)] * 2
    assert list(by_name(fig, "fit").y)[0] == pytest.approx(1.0)
    assert "simulated" in fig.layout.title.text
    assert fig.layout.xaxis.range == (0.0, 250.0)


def test_sweep_figure_says_measured_for_a_real_gpu() -> None:
    fig = charts.sweep_figure([probe(8)], A10, memory_source="measured", max_batch=64)
    assert "measured on the GPU" in fig.layout.title.text
    assert [t.name for t in fig.data][2:] == ["fits", "OOM"]  # no fit line from one batch


def test_sweep_figure_draws_the_margin_limit_below_usable() -> None:
    limit = A10.usable_bytes - 2 * GIB
    fig = charts.sweep_figure([probe(8)], A10, memory_source="simulated", max_batch=64,
                              limit_bytes=limit)  # fmt: skip
    line = fig.data[2]
    assert line.name == f"usable less margin ({limit / GIB:.2f} GiB)"
    assert list(line.y) == [pytest.approx(limit / GIB)] * 2


def test_capacity_bars_compare_current_and_optimal_against_usable() -> None:
    fig = charts.capacity_bars(sample_report())
    bar = fig.data[0]
    assert list(bar.y) == ["current (batch 16)", "optimal (batch 192)"]
    assert list(bar.x) == pytest.approx([2.5625, 19.75])
    assert list(bar.marker.color) == [charts.RED, charts.GREEN]
    assert fig.layout.shapes[0].x0 == pytest.approx(A10.usable_gib)


def test_capacity_bars_mark_a_current_batch_that_runs_out_of_memory() -> None:
    fig = charts.capacity_bars(sample_report(current=200))
    assert fig.data[0].text[0] == "out of memory"


def test_capacity_bars_and_the_verdict_give_one_share_on_the_reserved_basis() -> None:
    # A user saw "uses 13%" (reserved) beside "11% of usable" (peak) for the same batch.
    base = sample_report()
    reserved = tuple(
        dataclasses.replace(m, required_bytes=m.peak_bytes + GIB // 4) for m in base.measurements
    )
    report = dataclasses.replace(base, measurements=reserved)
    fig = charts.capacity_bars(report)
    current = report.current.required_bytes
    share = f"{100 * current / A10.usable_bytes:.0f}%"
    assert fig.data[0].text[0] == f"{current / GIB:.2f} GiB, {share}"
    assert fig.data[0].x[0] == pytest.approx(current / GIB)
    assert f"uses {share} of this A10's usable memory" in report.verdict()
    assert "reserved" in fig.layout.xaxis.title.text
    assert "reserved (what the GPU holds), % of usable" in fig.layout.title.text


def test_breakdown_bar_stacks_every_category_to_the_peak() -> None:
    m = probe(192)
    fig = charts.breakdown_bar(m.breakdown, batch_size=192, memory_source="simulated")
    assert [t.name for t in fig.data] == ["parameters", "gradients", "optimizer state",
                                          "activations", "logits", "temporary"]  # fmt: skip
    assert sum(t.x[0] for t in fig.data) == pytest.approx(m.peak_bytes / GIB)
    assert fig.layout.barmode == "stack"


def test_compare_figure_and_table_show_every_gpu() -> None:
    rows = [gpu_fit("T4", 112, 1.92), gpu_fit("A10", 176, 1.0), gpu_fit("H100", None, 0.126)]
    fig = page_charts.compare_figure(rows, chosen="A10")
    assert list(fig.data[0].x) == ["T4", "A10", "H100 80GB"]
    assert list(fig.data[0].y) == [112, 176, 0]
    assert fig.data[0].marker.color[1] == charts.GREEN
    assert list(fig.data[1].y) == [r.est_cost_per_run_usd for r in rows]
    table = compare_view.table(tables.rescale_hours(rows, 2.0), Settings())
    assert table[1]["Batch (sim.)"] == 176
    assert table[1]["h/run (est.)"] == 2.0
    assert table[1]["$/run (est.)"] == pytest.approx(1.72)
    assert table[2]["Batch (sim.)"] is None


def test_proof_figure_shows_ratios_and_each_protocols_max_batch() -> None:
    fig = page_charts.proof_figure(sample_proof(), A10)
    bar = fig.data[0]
    assert list(bar.y) == pytest.approx([0.5, 1.5, 2.0, 3.0])
    assert bar.text[1] == "1.50 GiB, 3.00x forward, max batch 272"
    assert bar.text[3] == "3.00 GiB, 6.00x forward, max batch 176"
    assert "simulated" in fig.layout.title.text


def test_proof_table_and_summary() -> None:
    proof = sample_proof()
    rows = tables.proof_table(proof)
    assert [r["x forward-only"] for r in rows] == [1.0, 3.0, 4.0, 6.0]
    assert [r["Max batch it recommends"] for r in rows] == [4096, 272, 264, 176]
    assert "recommends batch 272" in tables.proof_summary(proof)
    assert "only up to batch 176" in tables.proof_summary(proof)


def test_downloads_hold_the_json_contract_and_one_csv_row_per_probe() -> None:
    report = sample_report(batches=(200, 8, 16, 192))
    data = json.loads(exports.report_json(report))
    stamp = data.pop("environment")  # made at export: the report was built by hand
    expected = json.loads(json.dumps(report_to_dict(report)))
    assert expected.pop("environment") is None
    assert data == expected
    assert {"memorymark_version", "torch_version", "finished_utc"} <= set(stamp)
    rows = list(csv.DictReader(io.StringIO(exports.probes_csv(report))))
    assert [int(r["batch_size"]) for r in rows] == [8, 16, 192, 200]
    assert [r["success"] for r in rows] == ["True", "True", "True", "False"]
    assert rows[0]["peak_bytes"] == str(GIB + 8 * 100 * MIB)
    assert rows[0]["memory_source"] == "simulated"
    assert int(rows[2]["activations_bytes"]) == 192 * 100 * MIB
    assert rows[3]["error"] == "simulated out of memory"
    assert exports.file_stem(report).startswith("memorymark-tiny-bert-A10-32-true-seq128-bs16-")


def test_probe_log_has_one_terminal_line_per_probe() -> None:
    ms = [probe(8), probe(200, fits=False)]
    text = probe_log.log_text("memorymark analyze bert", ms, A10, [0.5, 1.3], "done")
    lines = text.splitlines()
    assert lines[0] == "$ memorymark analyze bert"
    assert lines[1] == "# peak of one full training step; % of usable memory it holds"
    assert lines[2] == "[  0.5s] batch    8 fits   1.78 GiB   8%"
    assert lines[3] == "[  1.3s] batch  200 OOM  simulated out of memory"
    assert lines[4] == "done"


def test_probe_log_says_what_a_step_past_the_edge_would_need() -> None:
    past = dataclasses.replace(probe(400, fits=False), required_bytes=int(38.6 * GIB))
    margin = dataclasses.replace(probe(190, fits=False), runs=True)
    assert probe_log.probe_line(past, A10) == (
        f"batch  400 OOM, needs 38.6 GiB of {A10.usable_bytes / GIB:.1f}"
    )
    assert probe_log.probe_line(margin, A10).startswith("batch  190 runs ")
    assert probe_log.probe_line(margin, A10).endswith("(inside the margin)")


def test_probe_log_says_a_step_ran_only_after_a_cache_flush() -> None:
    flushed = dataclasses.replace(probe(190, fits=False), runs=True, alloc_retries=1)
    assert probe_log.probe_line(flushed, A10).endswith("(after a cache flush)")
