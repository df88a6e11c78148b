"""Report arithmetic: optimal batch, waste, batch ratio and savings, and the JSON contract."""

import json

import pytest

from memorymark import gpus
from memorymark.measurement import Measurement
from memorymark.report import Report
from memorymark.settings import Costs, Settings

GIB = 2**30
A10 = gpus.find_gpu("a10")


def m(batch, gib_used, fits=True):
    return Measurement(
        batch_size=batch, fits=fits, peak_bytes=int(gib_used * GIB), backend="sim", measured=False
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


def test_speedup_is_the_batch_ratio_and_savings_follow_from_it():
    r = report(PROBES, costs=Costs(usd_per_hour=1.0, hours_per_run=10, runs_per_year=50))
    assert r.batch_ratio == 11.0
    assert r.annual_cost_usd == 500.0
    assert r.cost_savings_annual == pytest.approx(500 * (1 - 1 / 11), abs=0.01)


def test_catalog_price_is_the_default_and_repricing_needs_no_new_measurements():
    r = report(PROBES)
    assert r.usd_per_hour == A10.usd_per_hour
    cheaper = r.with_costs(Costs(usd_per_hour=0.5))
    assert cheaper.measurements is r.measurements
    assert cheaper.annual_cost_usd == 0.5 * 2 * 100


def test_a_current_batch_that_does_not_fit_wastes_nothing_and_saves_nothing():
    r = report(PROBES, current=184)
    assert not r.current_fits
    assert (r.waste_bytes, r.cost_savings_annual) == (0, 0.0)
    assert r.verdict().startswith("Batch 184 runs out of memory on this A10; batch 176 trains")


def test_verdict_names_the_share_used_and_the_boundary():
    assert report(PROBES).verdict() == (
        f"Batch 16 uses {100 * 3 * GIB / A10.usable_bytes:.0f}% of this A10's usable memory; "
        "batch 176 trains, 184 does not."
    )


def test_no_fit_at_all():
    r = report([m(8, 30, fits=False), m(1, 25, fits=False)])
    assert r.optimal is None
    assert r.to_dict()["optimal_batch_size"] is None
    assert "even batch 1 runs out of memory" in r.verdict()


def test_json_keeps_the_original_api_fields_in_gib():
    d = json.loads(json.dumps(report(PROBES).to_dict()))
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
    assert d["results"][-1] == {"batch_size": 184, "memory_gb": 21.0, "success": False}
    assert d["probes"] == 4
    assert d["memory_source"] == "simulated"
