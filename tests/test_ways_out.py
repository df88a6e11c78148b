"""Ways out by hardware (the cheapest GPU that fits, the fewest GPUs under FSDP), their prices,
and every place a report shows them; a stated peak is what applying the way out measures."""

import pytest

from memorymark import Session, gpus
from memorymark.analyses import hardware
from memorymark.analyses.fixes import WaysOutSearch
from memorymark.cli import render
from memorymark.measurement import Breakdown, Measurement
from memorymark.report import Report
from memorymark.reporting.json_form import report_to_dict
from memorymark.reporting.markdown import report_markdown
from memorymark.settings import Costs, Settings
from memorymark.units import GIB
from memorymark.ways_out import SAMPLES_PER_RUN, Fix

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)


def _step(required_gib: float, activations_gib: float = 0.0) -> Measurement:
    """A fake batch-1 step that needs `required_gib` (it fits: its verdict is the caller's)."""
    need = int(required_gib * GIB)
    live = Breakdown(parameters=need - int(activations_gib * GIB), gradients=0,
                     optimizer_state=0, activations=int(activations_gib * GIB))  # fmt: skip
    return Measurement(batch_size=1, fits=True, runs=True, peak_bytes=need, required_bytes=need,
                       backend="sim", measured=False, samples_per_second=10.0,
                       throughput_source="estimated", breakdown=live)  # fmt: skip


def test_the_cheapest_gpu_that_fits_beats_bigger_dearer_ones():
    # 30 GiB at batch 1: the T4, RTX 4090 and A10 are cheaper but too small; the A100 40GB is
    # the cheapest that holds it (the L40S, A100 80GB and H100 hold it too, dearer).
    stepped = []

    def step(settings, gpu):
        stepped.append(gpu.name)
        return _step(30)

    settings = Settings(model="tiny-bert", gpu_memory_gib=8)
    fix = hardware.cheapest_gpu(settings, gpus.custom_gpu(8), step, states=0)
    assert fix is not None and fix.fits and fix.gpu.name == "A100 40GB"
    # In price order; the L4 and A10G share a stepped GPU's compute capability, whose step
    # already passed their limit, so they are not stepped.
    assert stepped == ["T4", "RTX 4090", "A10", "A100 40GB"]
    assert fix.label == "a bigger GPU" and fix.title == "a bigger GPU: A100 40GB"
    assert fix.settings.hardware.gpu == "A100 40GB" and fix.settings.hardware.gpu_memory_gib is None


def test_a_gpu_that_cannot_run_the_precision_is_passed_over():
    stepped = []

    def step(settings, gpu):
        stepped.append(gpu.name)
        return _step(10)

    settings = Settings(model="tiny-bert", precision="bf16-mixed", gpu_memory_gib=8)
    fix = hardware.cheapest_gpu(settings, gpus.custom_gpu(8), step, states=0)
    assert stepped == ["RTX 4090"] and fix is not None  # the cheaper T4 has no bf16


def test_states_past_every_limit_step_nothing():
    def step(settings, gpu):
        raise AssertionError("stepped")

    settings = Settings(model="tiny-bert", gpu_memory_gib=8)
    assert hardware.cheapest_gpu(settings, gpus.custom_gpu(8), step, states=200 * GIB) is None


def test_a_rank_holds_its_share_of_the_states_under_fsdp_and_all_of_them_elsewhere():
    states = 800 * GIB
    on = dict(model="tiny-llama", gpu="h100")
    assert hardware.per_rank_states(Settings(**on), states) == states
    assert hardware.per_rank_states(Settings(**on, dist="ddp", gpus="8"), states) == states
    assert hardware.per_rank_states(Settings(**on, dist="fsdp", gpus="8"), states) == states // 8
    fsdp_tp = Settings(**on, dist="fsdp", gpus="16", tp=2)
    assert hardware.per_rank_states(fsdp_tp, states) == states // 16
    offloaded = Settings(**on, dist="fsdp", gpus="8", offload="cpu")
    assert hardware.per_rank_states(offloaded, 0 + states) == 0


def test_sharded_states_no_bigger_gpu_holds_whole_still_step_the_bigger_gpu():
    # 3,000 GiB over 80 FSDP ranks is 37.5 GiB a rank: an H200 is stepped, not ruled out by the
    # whole model's states (Llama-3.1-405B on 80 H100s said "needs >= 3,023.84 GiB" an H200).
    stepped = []

    def step(settings, gpu):
        stepped.append(gpu.name)
        return _step(100)

    settings = Settings(model="tiny-llama", gpu="h100", dist="fsdp", gpus="80")
    fix = hardware.cheapest_gpu(settings, gpus.find_gpu("h100"), step, states=3000 * GIB)
    assert fix is not None and fix.gpu.name == "H200" and not fix.lower_bound
    assert stepped[-1] == "H200"  # stepped (an A100 80GB first: more usable, cheaper)


def test_the_fewest_gpus_start_where_a_rank_s_share_of_the_states_fits():
    # States of 100 GiB, sharded over n A10s, need n >= 5; batch 1 needs 2 GiB more per rank.
    stepped = []

    def step(settings, gpu):
        n = settings.hardware.gpu_count
        stepped.append(n)
        return _step(2 + 100 / n)

    a10 = gpus.find_gpu("a10")
    settings = Settings(model="tiny-bert", gpu="a10")
    fix = hardware.fewest_gpus(settings, a10, step, states=100 * GIB, parameters=10**9)
    assert stepped == [5, 6]  # 5: 22 GiB, past the limit; 6: 18.7 GiB
    assert fix is not None and fix.fits and fix.gpus == 6
    assert (fix.settings.hardware.dist, fix.settings.hardware.gpus) == ("fsdp", "6")
    assert fix.title == "several GPUs (FSDP): 6 x A10"
    # Six GPUs cost six times the hour, and the run's time is estimated.
    assert fix.usd_per_hour() == pytest.approx(6 * a10.usd_per_hour)
    assert fix.samples_per_second is not None
    hours = SAMPLES_PER_RUN / fix.samples_per_second / 3600
    assert fix.cost_per_run_usd() == pytest.approx(6 * a10.usd_per_hour * hours, abs=0.01)
    # The user's own price for this kind replaces the catalog's.
    assert fix.to_dict(usd_per_gpu_hour=1.0)["usd_per_hour"] == 6.0


def test_a_gpu_count_past_the_search_s_first_tries_is_bisected():
    stepped = []

    def step(settings, gpu):
        n = settings.hardware.gpu_count
        stepped.append(n)
        return _step(15 + 100 / n)  # 100 GiB sharded, 15 GiB whatever the count

    settings = Settings(model="tiny-bert", gpu="a10")
    fix = hardware.fewest_gpus(settings, gpus.find_gpu("a10"), step, states=100 * GIB,
                               parameters=10**9)  # fmt: skip
    # 5 and 6 in order (too big); 15 + 100/n through them says 24 holds it (19.2 GiB per
    # rank): the count before it goes first (16: 21.25 GiB, too big), then 24. Four steps.
    assert stepped == [5, 6, 16, 24] and fix.gpus == 24 and fix.fits


def test_no_more_gpus_are_stepped_once_activations_overflow_alone():
    stepped = []

    def step(settings, gpu):
        stepped.append(settings.hardware.gpu_count)
        # 25 GiB of activations whatever the count: sharding never brings them down.
        return _step(25 + 50 / settings.hardware.gpu_count, activations_gib=25)

    settings = Settings(model="tiny-bert", gpu="a10")
    fix = hardware.fewest_gpus(settings, gpus.find_gpu("a10"), step, states=50 * GIB,
                               parameters=10**9)  # fmt: skip
    assert stepped == [3] and fix is not None and not fix.fits and fix.gpus == 3


def test_no_more_gpus_are_stepped_once_a_fit_says_what_stays_overflows():
    stepped = []

    def step(settings, gpu):
        stepped.append(settings.hardware.gpu_count)
        # 22 GiB stay whatever the count (not activations: gathered weights, say), past 21.
        return _step(22 + 50 / settings.hardware.gpu_count)

    settings = Settings(model="tiny-bert", gpu="a10")
    fix = hardware.fewest_gpus(settings, gpus.find_gpu("a10"), step, states=50 * GIB,
                               parameters=10**9)  # fmt: skip
    assert stepped == [3, 4] and fix is not None and not fix.fits and fix.gpus == 4


def test_a_first_count_far_off_steps_the_most_gpus_next():
    stepped = []

    def step(settings, gpu):
        stepped.append(settings.hardware.gpu_count)
        return _step(45 + 60 / settings.hardware.gpu_count)  # 45 GiB stay, past 21

    settings = Settings(model="tiny-bert", gpu="a10")
    fix = hardware.fewest_gpus(settings, gpus.find_gpu("a10"), step, states=60 * GIB,
                               parameters=10**9)  # fmt: skip
    # 3 A10s hold the states' shares (20 GiB each) but need 65 GiB: 1,024 is stepped next.
    assert stepped == [3, 1024] and fix is not None and not fix.fits and fix.gpus == 1024


def test_a_cost_is_not_guessed_when_the_time_cannot_be_estimated():
    fix = Fix(label=hardware.SEVERAL_GPUS, settings=Settings(model="tiny-bert", gpu="a10",
              dist="fsdp", gpus="16"), gpu=gpus.find_gpu("a10"), peak_bytes=GIB,
              required_bytes=GIB, limit_bytes=2 * GIB, hardware=True)  # fmt: skip
    d = fix.to_dict()
    assert d["gpus"] == 16 and d["usd_per_hour"] == pytest.approx(16 * 0.86)
    assert d["cost_per_run_usd"] is None and "run time not estimated" in d["cost_note"]


def _report_with_fixes() -> Report:
    settings = Settings(model="tiny-bert", gpu="a10")
    a10, a100 = gpus.find_gpu("a10"), gpus.find_gpu("A100 80GB")
    oom = Measurement(batch_size=1, fits=False, runs=False, peak_bytes=30 * GIB,
                      required_bytes=30 * GIB, backend="sim", measured=False)  # fmt: skip
    fixes = (
        Fix(label="QLoRA: NF4 + LoRA + checkpointing", settings=settings, gpu=a10,
            peak_bytes=25 * GIB, required_bytes=25 * GIB, limit_bytes=21 * GIB,
            lower_bound=True),
        Fix(label=hardware.BIGGER_GPU, settings=settings.replace(gpu="A100 80GB"), gpu=a100,
            peak_bytes=30 * GIB, required_bytes=31 * GIB, limit_bytes=77 * GIB, hardware=True,
            samples_per_second=100.0),
        Fix(label=hardware.SEVERAL_GPUS, settings=settings.replace(dist="fsdp", gpus="4"),
            gpu=a10, peak_bytes=9 * GIB, required_bytes=10 * GIB, limit_bytes=21 * GIB,
            hardware=True),
    )  # fmt: skip
    return Report(settings=settings, costs=Costs(), gpu=a10, backend="sim",
                  measurements=(oom,), elapsed_seconds=1.0, fixes=fixes,
                  batch_1_required_bytes=30 * GIB)  # fmt: skip


def test_every_report_form_lists_the_ways_out(capsys):
    r = _report_with_fixes()
    d = report_to_dict(r)
    assert [f["title"] for f in d["fixes"]] == [
        "QLoRA: NF4 + LoRA + checkpointing",
        "a bigger GPU: A100 80GB",
        "several GPUs (FSDP): 4 x A10",
    ]
    assert d["fixes"][1]["cost_per_run_usd"] == pytest.approx(
        round(SAMPLES_PER_RUN / 100 / 3600 * 2.4984, 2)
    )
    assert d["fixes"][2]["gpus"] == 4 and d["fixes"][2]["usd_per_hour"] == pytest.approx(3.44)
    page = report_markdown(r, d)
    assert "### Ways out" in page
    assert "| QLoRA: NF4 + LoRA + checkpointing | too big | at least 25.00 | 21.00 |" in page
    assert "| a bigger GPU: A100 80GB | fits | 31.00 | 77.00 |" in page
    assert "10.00 per GPU" in page and "run time not estimated" in page
    render.print_report(r, d)
    text = capsys.readouterr().out
    assert "a bigger GPU: A100 80GB" in text and "on A100 80GB" not in text
    assert ">=    25.00 GiB of 21.00  still too big" in text


def test_the_app_line_names_the_gpu_once():
    from memorymark.ui import tables

    fix = _report_with_fixes().fixes[1]
    line = tables.fix_line(fix)
    assert "A100 80GB" in line.replace("\\", "") and line.count("A100") == 1
    assert "(simulated)" in line and "estimated" in line


def test_each_stated_peak_is_what_applying_the_way_out_measures(monkeypatch):
    # Real steps: tiny-bert on a 1 GiB GPU, every way out that states a peak (not a bound)
    # applied through the front door at batch 1. One change of settings stands for them all
    # (tests/test_fixes.py simulates each); the hardware ways out are all here.
    from memorymark.analyses import fixes

    real_variants = fixes.settings_changes
    monkeypatch.setattr(
        fixes,
        "settings_changes",
        lambda s, gpu: [v for v in real_variants(s, gpu) if v[0] == "LoRA rank 16"],
    )
    settings = Settings(model="tiny-bert", seq_len=32, gpu_memory_gib=1, margin="49%")
    answer = WaysOutSearch(settings, bench=Session(settings).bench).answer()
    stated = [f for f in answer.fixes if not f.lower_bound]
    assert {"LoRA rank 16", "a bigger GPU", "several GPUs (FSDP)"} <= {f.label for f in stated}
    for fix in stated:
        applied = Session(fix.settings).measure(1)
        assert applied.required_bytes == pytest.approx(fix.required_bytes, rel=0.01), fix.title
        assert applied.peak_bytes == pytest.approx(fix.peak_bytes, rel=0.01), fix.title


def test_when_no_count_trains_the_model_qlora_is_sharded_over_the_fewest(monkeypatch):
    # Llama-3.1-70B on A10s: no count trains it in fp32, with or without checkpointing, but its
    # 4-bit base weights shard over 4 (each step here a fake: 500 GiB unless QLoRA).
    from memorymark.analyses import fixes

    stepped = []

    def step(settings, gpu):
        stepped.append(
            (
                settings.workload.quantization,
                settings.workload.grad_checkpointing,
                settings.hardware.gpu_count,
            )
        )
        n = settings.hardware.gpu_count or 1
        # QLoRA: 5 GiB stay, 60 shard (within 21 GiB from 4 GPUs); 500 stay otherwise.
        return _step(5 + 60 / n if settings.workload.quantization == "nf4" else 500)

    monkeypatch.setattr(hardware, "cheapest_gpu", lambda *a, **k: None)
    a10 = gpus.find_gpu("a10")
    settings = Settings(model="tiny-llama", gpu="a10")
    stages = fixes._several_gpus_stages(
        settings, a10, 10 * GIB, 10**9, step, Session(settings).bench.counted_states
    )
    out = [fix for _, fix in stages if fix is not None]
    sharded = [f for f in out if f.label.startswith("QLoRA")]
    assert [f.fits for f in out if f not in sharded] == [False, False]  # as is, checkpointed
    assert len(sharded) == 1 and sharded[0].fits and sharded[0].gpus == 4
    assert sharded[0].title == "QLoRA: NF4 + LoRA + checkpointing, on several GPUs (FSDP): 4 x A10"
    s = sharded[0].settings
    assert (s.workload.quantization, s.workload.lora_rank, s.hardware.dist, s.hardware.gpus) == (
        "nf4",
        16,
        "fsdp",
        "4",
    )
    assert [n for q, _, n in stepped if q == "nf4"] == [2, 3, 4]
