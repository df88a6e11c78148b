"""Report arithmetic: optimal batch, waste, speedup from throughput and savings, memory figures
(allocated, reserved, limit, margin) and the JSON contract."""

import dataclasses
import json

import pytest

from memorymark import gpus
from memorymark.cli import render
from memorymark.measurement import DepthReplay, Measurement
from memorymark.report import Report
from memorymark.reporting import markdown
from memorymark.reporting.json_form import report_to_dict
from memorymark.settings import Costs, Settings

GIB = 2**30
A10 = gpus.find_gpu("a10")


def m(batch, gib_used, fits=True, sps=None, reserved_gib=None, runs=None):
    reserved = None if reserved_gib is None else int(reserved_gib * GIB)
    return Measurement(
        batch_size=batch,
        fits=fits,
        runs=runs,
        peak_bytes=int(gib_used * GIB),
        required_bytes=reserved if reserved is not None else int(gib_used * GIB),
        backend="sim",
        measured=False,
        samples_per_second=sps,
        throughput_source="estimated" if sps else None,
        predicted_reserved_bytes=reserved,
    )


def report(measurements, current=16, costs=None):
    return Report(
        settings=Settings(current_batch=current, gpu="a10"),
        costs=costs or Costs(),
        gpu=A10,
        backend="sim",
        measurements=tuple(measurements),
        elapsed_seconds=1.5,
    )


PROBES = [m(8, 2.0), m(16, 3.0), m(176, 20.0), m(184, 21.0, fits=False)]


def test_optimal_is_the_largest_fit_below_the_first_failure():
    r = report(PROBES)
    assert r.optimal.batch_size == 176
    assert r.current.batch_size == 16


def test_waste_is_usable_memory_idle_at_the_current_batch():
    r = report(PROBES)
    assert r.waste_bytes == A10.usable_bytes - 3 * GIB
    assert r.waste_percent == round(100 * (A10.usable_bytes - 3 * GIB) / A10.usable_bytes, 1)


def test_without_throughput_speedup_falls_back_to_the_batch_ratio_and_says_so():
    r = report(PROBES, costs=Costs(usd_per_hour=1.0, hours_per_run=10, runs_per_year=50))
    assert r.batch_ratio == r.speedup == 11.0
    assert (r.speedup_source, r.throughput_source) == ("batch_ratio", None)
    assert r.annual_cost_usd == 500.0
    assert r.cost_savings_annual == pytest.approx(500 * (1 - 1 / 11), abs=0.01)


THROUGHPUT = [
    m(8, 2.0, sps=50.0),
    m(16, 3.0, sps=80.0),
    m(64, 8.0, sps=96.0),
    m(128, 14.0, sps=99.0),
    m(176, 20.0, sps=100.0, reserved_gib=20.5),
    m(184, 21.0, fits=False),
]


def test_speedup_is_the_throughput_ratio_and_savings_are_the_time_saved():
    # Same samples at 100 instead of 80 samples/s: 20% less time, so 20% of the annual cost.
    r = report(THROUGHPUT, costs=Costs(usd_per_hour=1.0, hours_per_run=10, runs_per_year=50))
    assert r.speedup == 1.25
    assert r.batch_ratio == 11.0  # the old definition, kept
    assert (r.speedup_source, r.throughput_source) == ("throughput", "estimated")
    assert r.cost_savings_annual == pytest.approx(500 * (1 - 80 / 100), abs=0.01)


def test_no_savings_when_the_larger_batch_is_not_faster():
    slower = [m(16, 3.0, sps=80.0), m(32, 5.0, sps=79.0), m(40, 30.0, fits=False)]
    r = report(slower)
    assert r.speedup == round(79 / 80, 3)
    assert r.cost_savings_annual == 0.0


def test_larger_batches_stop_paying_off_at_the_smallest_batch_within_5_percent_of_the_best():
    r = report(THROUGHPUT)
    assert r.knee().batch_size == 64  # 96 >= 0.95 * 100; 16 reaches only 80
    assert r.knee(0.99).batch_size == 128
    assert report(PROBES).knee() is None  # no throughput known


def test_catalog_price_is_the_default_and_repricing_needs_no_new_measurements():
    r = report(PROBES)
    assert r.usd_per_hour == A10.usd_per_hour
    cheaper = r.with_costs(Costs(usd_per_hour=0.5))
    assert cheaper.measurements is r.measurements
    assert cheaper.annual_cost_usd == 0.5 * 2 * 100


def test_a_current_batch_that_crashes_is_never_priced_as_if_it_ran():
    r = report(PROBES, current=184)
    assert not r.current_fits
    assert (r.waste_bytes, r.waste_percent, r.cost_savings_annual) == (None, None, None)
    assert (r.speedup, r.batch_ratio, r.throughput_ratio) == (None, None, None)
    assert r.verdict().startswith(
        "Batch 184 crashes with out of memory on this A10 "
        f"(needs 21.00 of {A10.usable_gib:.2f} GiB); batch 176 trains"
    )
    d = report_to_dict(r)
    assert (d["waste_gb"], d["speedup"], d["cost_savings_annual"]) == (None, None, None)
    # The plan keeps the current global batch with accumulation (the engine fills it in).
    assert r.global_batch == 184


def test_a_current_batch_inside_the_margin_runs_and_is_priced():
    probes = [m(8, 1), m(16, 2, fits=False, runs=True), m(24, 30, fits=False)]
    r = report(probes, current=16)
    assert r.current_fits and r.waste_bytes == A10.usable_bytes - 2 * GIB
    assert r.optimal.batch_size == 8 and r.max_fit.batch_size == 16
    assert r.verdict().startswith("Batch 16 runs on this A10 but leaves less than the margin free")
    assert report_to_dict(r)["max_batch_size"] == 16


def test_verdict_names_the_share_used_and_the_boundary():
    assert report(PROBES).verdict() == (
        f"Batch 16 uses {100 * 3 * GIB / A10.usable_bytes:.0f}% of this A10's usable memory; "
        "batch 176 trains, 184 does not."
    )


def test_no_fit_at_all():
    r = report([m(8, 30, fits=False), m(1, 25, fits=False)])
    assert r.optimal is None
    assert report_to_dict(r)["optimal_batch_size"] is None
    assert "even batch 1 runs out of memory" in r.verdict()


def test_json_keeps_the_original_api_fields_in_gib():
    d = json.loads(json.dumps(report_to_dict(report(PROBES))))
    original = {
        "model_name",
        "device",
        "gpu_name",
        "gpu_total_gb",
        "optimal_batch_size",
        "optimal_memory_gb",
        "current_batch_size",
        "current_memory_gb",
        "waste_gb",
        "waste_percent",
        "speedup",
        "cost_savings_annual",
        "results",
    }
    added = {
        "backend",
        "settings",
        "usable_gb",
        "probes",
        "elapsed_seconds",
        "breakdown",
        "memory_source",
    }
    assert original | added <= set(d)
    assert d["optimal_memory_gb"] == 20.0
    assert d["gpu_total_gb"] == round(A10.total_bytes / GIB, 3)
    assert d["results"][-1] == {
        "batch_size": 184,
        "memory_gb": 21.0,
        "success": False,
        "runs": False,
        "replayed": False,
        "required_bytes": 21 * GIB,
        "reserved_gb": None,
        "alloc_retries": None,
        "samples_per_second": None,
        "error": None,
    }
    assert d["probes"] == 4
    assert d["memory_source"] == "simulated"


def test_json_says_which_memory_number_is_which():
    r = report(THROUGHPUT)
    d = json.loads(json.dumps(report_to_dict(r)))
    margin = int(A10.usable_bytes * 0.02)  # the default margin, 2% of usable
    assert d["optimal_memory_gb"] == 20.0  # live tensor bytes at the peak
    assert d["optimal_reserved_gb"] == 20.5  # what the caching allocator would hold
    assert d["optimal_allocated_gb"] == 20.0  # no allocator prediction in this probe: the peak
    assert d["margin_gb"] == round(margin / GIB, 3)
    assert d["limit_gb"] == round((A10.usable_bytes - margin) / GIB, 3)
    assert d["headroom_gb"] == round((A10.usable_bytes - 20.5 * GIB) / GIB, 3)
    assert d["predicted_oom_batch"] == 184
    assert d["fit_criterion"].startswith("runs: no out-of-memory, reserved bytes within usable")
    assert d["gpu_overheads_gb"]["context"] == round(A10.context_bytes / GIB, 3)
    assert (d["speedup"], d["batch_ratio"], d["speedup_source"]) == (1.25, 11.0, "throughput")
    assert d["throughput_source"] == "estimated"
    assert (d["optimal_samples_per_second"], d["current_samples_per_second"]) == (100.0, 80.0)
    assert d["diminishing_returns_batch"] == 64
    assert [row["samples_per_second"] for row in d["results"]] == [50, 80, 96, 99, 100, None]


def test_nothing_past_max_batch_is_the_answer():
    # The current batch (100) is measured for its needs, but the search stopped at 64.
    r = Report(
        settings=Settings(current_batch=100, max_batch=64, gpu="a10"), costs=Costs(), gpu=A10,
        backend="sim", measurements=(m(8, 2.0), m(64, 8.0), m(100, 12.0)), elapsed_seconds=0.1,
    )  # fmt: skip
    assert r.optimal.batch_size == 64 and r.max_fit.batch_size == 64 and r.capped


def test_runs_without_the_margin_is_not_called_out_of_memory():
    probes = [m(1, 20.0, fits=False, runs=True), m(2, 20.5, fits=False, runs=True)]
    r = report(probes, current=2)
    assert r.optimal is None and r.max_fit.batch_size == 2
    assert r.verdict().startswith("No batch size on this A10 leaves the margin free")
    assert r.predicted_oom_batch is None


def test_a_crashing_current_batch_keeps_its_global_batch_with_accumulation():
    r = Report(
        settings=Settings(current_batch=6, grad_accum=2, gpu="a10"), costs=Costs(), gpu=A10,
        backend="sim", measurements=(m(4, 10.0), m(6, 30.0, fits=False)), elapsed_seconds=0.1,
    )  # fmt: skip
    assert r.global_batch == 12


def test_a_current_batch_that_needed_a_cache_flush_says_so():
    flushed = Measurement(batch_size=16, fits=False, runs=True, peak_bytes=3 * GIB,
                          required_bytes=3 * GIB, alloc_retries=1, backend="sim",
                          measured=False)  # fmt: skip
    r = report([m(8, 2.0), flushed, m(24, 30.0, fits=False)], current=16)
    assert "runs on this A10 only after the allocator flushed its cache" in r.verdict()


def test_the_max_batch_says_what_no_headroom_means():
    # Reported: "max batch size 24 (runs with no headroom: 19.05 GiB reserved)" at 88% reserved.
    kept = report([m(8, 2.0), m(16, 19.05), m(24, 30.0, fits=False)])
    assert kept.max_fit.batch_size == 16
    assert kept.max_note() == "keeps the margin free: 19.05 GiB reserved"
    inside = report([m(8, 2.0), m(16, 21.0, fits=False, runs=True), m(24, 30.0, fits=False)])
    assert inside.max_note() == (
        f"runs, but inside the 2% margin: 21.00 GiB reserved, above the "
        f"{inside.limit_bytes / GIB:.2f} GiB limit"
    )
    flushed = Measurement(batch_size=16, fits=False, runs=True, peak_bytes=3 * GIB,
                          required_bytes=3 * GIB, alloc_retries=1, backend="sim",
                          measured=False)  # fmt: skip
    assert report([m(8, 2.0), flushed]).max_note() == (
        "runs only after a cache flush (an allocation retry): 3.00 GiB reserved"
    )
    assert report([m(8, 30.0, fits=False)]).max_note() is None
    assert "no headroom" not in inside.verdict()


# Depth replay (issue 31): a deep model's full-depth steps replayed from shallower traces.
REPLAYED = DepthReplay(layers=80, traced_depths=(2, 3, 4, 5), traced_steps=14, replayed_steps=6)
REPLAYED_SAYS = (
    "80 blocks replayed from simulated traces at 2, 3, 4 and 5 blocks (14 steps traced, 6 replayed)"
)


def test_a_depth_replay_says_what_was_traced_and_what_replayed_in_one_line():
    assert REPLAYED.says() == REPLAYED_SAYS
    one = DepthReplay(layers=32, traced_depths=(2,), traced_steps=1, replayed_steps=1)
    assert one.says() == (
        "32 blocks replayed from simulated traces at 2 blocks (1 step traced, 1 replayed)"
    )
    fell = DepthReplay(80, (), 0, 0, fallback="the blocks are not all alike")
    assert (
        fell.says() == "the full model traced (80 blocks, simulated): the blocks are not all alike"
    )
    assert DepthReplay(12, (), 0, 0).says() == "the full model traced (12 blocks, simulated)"


def test_the_report_and_its_json_carry_the_depth_replay():
    r = dataclasses.replace(report(PROBES), depth_replay=REPLAYED)
    assert r.depth_note == REPLAYED_SAYS[0].upper() + REPLAYED_SAYS[1:] + "."
    d = json.loads(json.dumps(report_to_dict(r)))
    assert d["depth_replay"] == {
        "layers": 80,
        "traced_depths": [2, 3, 4, 5],
        "traced_steps": 14,
        "replayed_steps": 6,
        "fallback": None,
        "stages": 1,
    }
    assert d["depth_note"] == r.depth_note
    assert DepthReplay.from_dict(d["depth_replay"]) == REPLAYED
    fell = DepthReplay(80, (), 0, 0, fallback="the blocks are not all alike")
    d = report_to_dict(dataclasses.replace(r, depth_replay=fell))
    assert d["depth_replay"]["traced_depths"] == [] and d["depth_replay"]["fallback"] == (
        "the blocks are not all alike"
    )
    assert d["depth_note"] == (
        "The full model traced (80 blocks, simulated): the blocks are not all alike."
    )


def test_without_a_depth_replay_the_report_says_nothing_of_depth(capsys):
    r = report(PROBES)
    assert r.depth_replay is None and r.depth_note is None
    d = report_to_dict(r)
    assert d["depth_replay"] is None and d["depth_note"] is None
    render.print_report(r, d)
    assert "block" not in capsys.readouterr().out
    assert "block" not in markdown.report_markdown(r)


def test_the_cli_and_markdown_reports_say_the_depth_replay(capsys):
    r = dataclasses.replace(report(PROBES), depth_replay=REPLAYED)
    render.print_report(r, report_to_dict(r))
    out = capsys.readouterr().out
    assert f"  {r.depth_note}\n" in out
    assert f" {r.depth_note}" in markdown.report_markdown(r)
