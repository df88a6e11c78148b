"""The layout search: its arithmetic (memorymark/distributed/layout_costs.py), its ranking with a
fake step (memorymark/analyses/layouts.py), and the `layouts` command on a tiny model."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from memorymark import gpus
from memorymark.analyses import layouts
from memorymark.cli.parser import main
from memorymark.distributed import layout_costs
from memorymark.distributed.layout import Layout
from memorymark.distributed.layout_costs import Candidate, ModelShape
from memorymark.measurement import Measurement
from memorymark.reporting.layout_code import init_device_mesh_line, torchtitan_parallelism
from memorymark.settings import Settings
from memorymark.units import GIB

TINY = ModelShape(heads=4, kv_heads=2, layers=2, hidden=64)
SHAPE = ModelShape(heads=8, kv_heads=8, layers=8, hidden=1024)
H100 = gpus.find_gpu("h100")


def _described(found: list[Candidate]) -> list[str]:
    return [c.describe() for c in found]


@pytest.mark.fast
def test_the_candidates_are_the_degrees_the_models_shape_takes():
    # tiny-llama: 4 heads, 2 key/value heads, 2 layers: tp 4 and 8 split no kv head, pp 4 and
    # 8 leave a stage without a layer; 2 stages x 2 virtual ones need 4 layers.
    found, refused = layout_costs.candidates(8, "fsdp", TINY, seq_len=32)
    assert _described(found) == ["FSDP 8", "FSDP 4 x TP 2", "FSDP 4 x PP 2 (1F1B)",
                                 "FSDP 2 x TP 2 x PP 2 (1F1B)"]  # fmt: skip
    # of the 10 tp x pp that divide 8: tp 4 or 8 (with pp 1, 2 where they divide), pp 4 or 8
    assert refused == 6
    deeper, _ = layout_costs.candidates(16, "fsdp", SHAPE, seq_len=2048)
    assert "TP 8 x PP 2 (1F1B)" in _described(deeper)
    assert all(c.layout.cp == 1 for c in deeper)
    # interleaved: 2 stages a GPU need 2 x pp layers (8 layers: pp up to 4)
    variants = [layout_costs.interleaved(c, SHAPE, 2048) for c in deeper]
    assert "TP 8 x PP 2 (interleaved 1F1B, 2 stages a GPU)" in _described(
        [v for v in variants if v]
    )
    assert all(v is None for c, v in zip(deeper, variants, strict=True) if c.layout.pp in (1, 8))
    assert layout_costs.interleaved(found[2], TINY, 32) is None  # 2 layers, pp 2


@pytest.mark.fast
def test_context_parallelism_is_tried_from_32k_tokens():
    found, _ = layout_costs.candidates(8, "fsdp", SHAPE, seq_len=32_768)
    assert {c.layout.cp for c in found} == {1, 2, 4, 8}
    assert "CP 8" in _described(found)


@pytest.mark.fast
def test_the_bubble_is_megatrons():
    # Narayanan et al. 2021, section 2.2: (p - 1) microbatch-times idle against m of work.
    assert layout_costs.bubble_fraction(8, 32, "1f1b") == pytest.approx(7 / 39)
    assert layout_costs.bubble_fraction(8, 32, "gpipe") == pytest.approx(7 / 39)
    assert layout_costs.bubble_fraction(8, 32, "interleaved-1f1b", 2) == pytest.approx(3.5 / 35.5)
    assert layout_costs.bubble_fraction(1, 1, "1f1b") == 0.0
    four = Settings(model="tiny-llama", dist="fsdp", gpus="8", pp=4)
    assert four.hardware.pipeline_microbatches == 4  # one per pipeline rank, as simulated
    assert four.replace(microbatches=8).hardware.pipeline_microbatches == 8


@pytest.mark.fast
def test_tensor_parallel_traffic_is_four_all_reduces_a_layer():
    lay = Layout(gpus=16, dist="fsdp", tp=8, pp=2)
    # 4 x 2(7/8) x (2 x 1024 x 1024 x 2 bytes) x 8 layers / 2 stages
    expected = 4 * 2 * 7 / 8 * (2 * 1024 * 1024 * 2) * 4
    assert layout_costs.tp_bytes(lay, SHAPE, 2, 1024, 2) == pytest.approx(expected)
    assert layout_costs.tp_bytes(Layout(gpus=16, dist="fsdp"), SHAPE, 2, 1024, 2) == 0.0
    assert layout_costs.pp_bytes(lay, SHAPE, 2, 1024, 2) == 2 * 2 * 1024 * 1024 * 2
    assert layout_costs.dp_nodes(lay) == 1  # dp 1
    assert layout_costs.dp_nodes(Layout(gpus=64, dist="fsdp", tp=8)) == 8


@pytest.mark.fast
def test_a_layout_whose_states_alone_pass_a_gpu_is_pruned():
    states = 100 * GIB
    assert layout_costs.pruned(states, Layout(gpus=4, dist="ddp"), 80 * GIB)
    assert not layout_costs.pruned(states, Layout(gpus=4, dist="ddp", tp=2), 80 * GIB)
    assert not layout_costs.pruned(states, Layout(gpus=4, dist="fsdp"), 80 * GIB)


# -- the search, on a fake bench ----------------------------------------------------------------
class FakeBench:
    """Steps whose best batch and speed are known functions of the layout; tp 2 refused."""

    def __init__(
        self,
        refuse_tp: int | None = None,
        needs: dict[int, int] | None = None,
        fail_pp: int | None = None,
        full_pp: int | None = None,
    ):
        self.analyzed: list[str] = []
        self.max_batches: list[int] = []
        self.steps: list[int] = []
        self.refuse_tp = refuse_tp
        self.fail_pp = fail_pp
        self.full_pp = full_pp
        self.needs = needs or {}  # tp -> the fewest GPUs its batch 1 runs on
        self.measured: list[tuple[int, int, int]] = []

    def analyze(self, s: Settings, *, answer_only: bool = False):
        assert answer_only  # a row reads the answer alone
        hw = s.hardware
        self.analyzed.append(hw.layout().describe())
        self.max_batches.append(s.search.max_batch)
        self.steps.append(s.search.step)
        if hw.tp == self.refuse_tp:
            raise ValueError("--tp 2 is not simulated yet")
        if hw.pp == self.fail_pp:
            raise RuntimeError("the training step failed at batch 2: a value read\nat line 1")
        if hw.pp == self.full_pp:  # only multiples of its 2 microbatches run: 2 is the least
            two = Measurement(batch_size=2, fits=False, runs=False, peak_bytes=80 * GIB,
                              backend="fake", measured=False, required_bytes=90 * GIB)  # fmt: skip
            return SimpleNamespace(settings=s, optimal=None, measurements=(two,), depth_replay=None)
        batch = 4 * hw.tp * hw.pp  # model parallelism frees memory for activations
        sps = 40.0 * (1 + hw.tp / 8)
        best = Measurement(batch_size=batch, fits=True, runs=True, peak_bytes=70 * GIB,
                           backend="fake", measured=False, samples_per_second=sps)  # fmt: skip
        return SimpleNamespace(settings=s, optimal=best, measurements=(best,), depth_replay=None)

    def measure(self, s: Settings, gpu, batch_size: int = 1) -> Measurement:
        n, tp = s.hardware.gpu_count, s.hardware.tp
        self.measured.append((tp, s.hardware.pp, n))
        runs = n >= self.needs.get(tp, 10**6)
        return Measurement(batch_size=1, fits=runs, runs=runs, peak_bytes=1, backend="fake",
                           measured=False, required_bytes=1 if runs else 10**15)  # fmt: skip

    def simulated_gpu(self, s: Settings):
        return H100


def _inputs(states_bytes: int = 100 * GIB) -> layouts.Inputs:
    return layouts.Inputs(
        shape=SHAPE, param_count=10**9, states_bytes=states_bytes, gpu=H100,
        capacity=lambda s: 78 * GIB, limit=lambda s: 70 * GIB, usd_per_hour=2.0,
    )  # fmt: skip


BASE = Settings(model="tiny-llama", seq_len=2048, gpu="h100", backend="sim", dist="fsdp",
                gpus="16", precision="bf16-mixed", target_batch=1024)  # fmt: skip


@pytest.mark.fast
def test_layouts_past_the_time_limit_are_listed_not_searched(monkeypatch):
    clock = iter(range(0, 10**6, 40))  # each reading 40 s after the one before
    monkeypatch.setattr(layouts.time, "monotonic", lambda: next(clock))
    bench = FakeBench()
    search = layouts.search_layouts(BASE.replace(time_limit_seconds=100), bench, 16, _inputs())
    skipped = [r for r in search.rows if r.status == "not searched"]
    assert skipped and len(bench.analyzed) + len(skipped) == len(search.rows)
    assert search.rows[-1].status == "not searched" and "time limit (100 s)" in skipped[0].note
    assert search.rows[0].fits  # what was searched still ranks first


@pytest.mark.fast
def test_the_interleaved_variant_keeps_the_time_limit_too(monkeypatch):
    bench = FakeBench()
    every, _ = layouts.layout_costs.candidates(16, "fsdp", SHAPE, 2048, None)
    # The clock stands still while the candidates are swept, then passes the limit.
    monkeypatch.setattr(
        layouts.time, "monotonic", lambda: 0 if len(bench.analyzed) < len(every) else 10**6
    )
    search = layouts.search_layouts(BASE.replace(time_limit_seconds=100), bench, 16, _inputs())
    variant = [r for r in search.rows if r.candidate.schedule == "interleaved-1f1b"]
    assert [r.status for r in variant] == ["not searched"]
    assert len(bench.analyzed) == len(every)


@pytest.mark.fast
def test_a_layout_whose_step_fails_is_listed_and_the_search_goes_on():
    bench = FakeBench(fail_pp=2)
    search = layouts.search_layouts(BASE, bench, 16, _inputs())
    failed = [r for r in search.rows if r.candidate.layout.pp == 2]
    assert failed and {r.status for r in failed} == {"refused"}
    assert failed[0].note == "the training step failed at batch 2: a value read"
    assert any(r.fits for r in search.rows) and len(bench.analyzed) == len(search.rows)


@pytest.mark.fast
def test_a_pipeline_that_does_not_fit_says_what_its_smallest_batch_needs():
    search = layouts.search_layouts(BASE, FakeBench(full_pp=2), 16, _inputs())
    row = next(r for r in search.rows if r.candidate.layout.pp == 2)
    assert (row.status, row.note, row.peak_bytes) == ("no fit", "batch 2 does not fit", 90 * GIB)


@pytest.mark.fast
def test_the_layouts_rank_by_estimated_throughput_with_the_refused_last():
    bench = FakeBench(refuse_tp=2)
    search = layouts.search_layouts(BASE, bench, 16, _inputs())
    fitting = [r for r in search.rows if r.fits]
    speeds = [r.samples_per_second for r in fitting]
    assert speeds == sorted(speeds, reverse=True)
    assert search.rows[-1].status == "refused"
    assert search.rows[-1].note == "--tp 2 is not simulated yet"
    assert {r.candidate.layout.tp for r in search.rows if r.status == "refused"} == {2}
    plain = next(r for r in search.rows if r.candidate.describe() == "FSDP 16")
    # Each sweep stops at the local batch the target asks of a rank: 1024 / 16 on FSDP 16.
    assert bench.max_batches[bench.analyzed.index("FSDP 16")] == 64
    # batch 4 on 16 ranks: 1024 / 64 = 16 accumulation steps to the target's global batch
    assert (plain.per_gpu_batch, plain.accumulation, plain.global_batch) == (4, 16, 1024)
    assert plain.step_seconds == pytest.approx(16 * max(4 / 45.0, plain.dp_seconds))
    assert plain.samples_per_second == pytest.approx(1024 / plain.step_seconds)
    piped = next(r for r in search.rows if r.candidate.describe() == "FSDP 8 x PP 2 (1F1B)")
    assert piped.microbatches == 2  # as simulated: one per pipeline rank
    assert piped.bubble_fraction == pytest.approx(1 / 3)
    assert search.pruned == 0 and search.best is fitting[0]
    # the fastest pipeline's interleaved variant is stepped too, once
    schedules = [r.candidate.schedule for r in search.rows if r.candidate.layout.pp > 1]
    assert schedules.count("interleaved-1f1b") == 1
    assert json.loads(json.dumps(search.to_dict()))["best"]["time_source"] == "estimated"


@pytest.mark.fast
def test_a_sweep_starts_no_larger_than_the_local_batch_the_target_asks():
    bench = FakeBench()
    layouts.search_layouts(BASE.replace(target_batch=32), bench, 16, _inputs())
    asked = dict(zip(bench.analyzed, zip(bench.max_batches, bench.steps, strict=True),
                     strict=False))  # fmt: skip
    assert asked["FSDP 16"] == (2, 2)  # 32 over 16 ranks: the grid's 8 would start past it
    assert asked["FSDP 2 x TP 8"] == (16, 8)  # 16 asked: the grid keeps its step
    assert asked["FSDP 8 x PP 2"] == (4, 4)  # 4 a rank, 2 microbatches each


@pytest.mark.fast
def test_replicated_layouts_whose_states_pass_a_gpu_are_pruned_unstepped():
    bench = FakeBench()
    search = layouts.search_layouts(BASE.replace(dist="ddp"), bench, 16, _inputs(200 * GIB))
    pruned = {r.candidate.describe() for r in search.rows if r.status == "pruned"}
    # ddp replicates: 200 GiB over tp x pp must come under 78 GiB, so tp x pp >= 4
    assert pruned == {"DP 16", "DP 8 x TP 2", "DP 8 x PP 2 (1F1B)"}
    assert search.pruned == 3 and not set(bench.analyzed) & pruned


@pytest.mark.fast
def test_without_a_count_the_fewest_gpus_any_layout_trains_on():
    # FSDP alone trains batch 1 from 64 GPUs, TP 8 from 16: the answer is 16 and its layouts.
    bench = FakeBench(needs={1: 64, 8: 16})
    search = layouts.fewest_gpus(BASE.replace(gpus="auto"), bench, _inputs())
    assert search.gpus == 16
    assert 16 in search.counts_tried
    assert search.count_probes == len(bench.measured)
    assert search.best is not None


@pytest.mark.fast
def test_the_way_out_names_the_fewest_gpus_model_parallel_layout():
    # TP 8 trains batch 1 from 16 GPUs, TP 4 from 32, tp 1 (FSDP alone or with PP) from 64;
    # FSDP alone is not stepped: it is not a model-parallel way out.
    bench = FakeBench(needs={1: 64, 4: 32, 8: 16})

    def measure(s: Settings) -> Measurement:
        return bench.measure(s, H100, 1)

    one_gpu = BASE.replace(dist="none", gpus="1")
    found = layouts.way_out(one_gpu, SHAPE, measure, lambda s: 78 * GIB, 100 * GIB)
    assert found is not None
    label, settings, step = found
    assert label == "a parallel layout (FSDP 2 x TP 8)"
    assert (settings.hardware.gpu_count, settings.hardware.tp) == (16, 8)
    assert step.runs
    assert (1, 1) not in {(tp, pp) for tp, pp, _ in bench.measured}
    nothing = FakeBench()
    assert layouts.way_out(one_gpu, SHAPE, lambda s: nothing.measure(s, H100), lambda s: 78 * GIB,
                           100 * GIB, counts=(8, 16)) is None  # fmt: skip


# -- snippets -------------------------------------------------------------------------------------
@pytest.mark.fast
def test_the_chosen_layouts_torchtitan_fragment_and_mesh():
    c = Candidate(Layout(gpus=512, dist="fsdp", tp=8, pp=8), "interleaved-1f1b", 2)
    toml = torchtitan_parallelism(c)
    assert "data_parallel_shard_degree = 8" in toml
    assert "tensor_parallel_degree = 8" in toml
    assert "pipeline_parallel_degree = 8" in toml
    assert 'pipeline_parallel_schedule = "Interleaved1F1B"' in toml
    # The microbatch size simulated: a local batch of 32 in 8 microbatches.
    assert "pipeline_parallel_microbatch_size = 4" in torchtitan_parallelism(c, 32, 2048, 8)
    assert init_device_mesh_line(c.layout) == (
        'mesh = init_device_mesh("cuda", (8, 8, 8), mesh_dim_names=("pp", "dp_shard", "tp"))'
    )


# -- the command ----------------------------------------------------------------------------------
def test_the_layouts_command_lists_fsdp_on_a_tiny_model(capsys):
    status = main(["layouts", "tiny-llama", "--seq-len", "32", "--gpu", "a10", "--backend",
                   "sim", "--gpus", "4", "--max-batch", "16", "--json"])  # fmt: skip
    assert status == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpus"] == 4
    assert data["best"]["layout"] == "FSDP 4"
    assert data["best"]["per_gpu_batch"] == 16
    assert data["traced_steps"] >= 1
    assert [r["layout"] for r in data["layouts"]][0] == "FSDP 4"
    assert "data_parallel_shard_degree = 4" in data["torchtitan"]
    assert "local_batch_size = 16" in data["torchtitan"]
    assert (
        data["device_mesh"] == 'mesh = init_device_mesh("cuda", (4,), mesh_dim_names=("dp_shard",))'
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["layouts", "tiny-llama", "--tp", "2", "--gpus", "4"], "picks --tp, --cp and --pp"),
        (["layouts", "tiny-llama", "--dist", "none", "--gpus", "1"], "data-parallel strategy"),
    ],
)
def test_bad_layout_input_is_one_line(argv, message, capsys):
    status = main([*argv, "--backend", "sim", "--gpu", "a10"])
    err = capsys.readouterr().err
    assert status == 2
    assert message in err and err.count("\n") == 1


@pytest.mark.fast
def test_the_bench_refuses_degrees_the_engine_does_not_simulate():
    # The layout search steps through the bench: it must refuse what a Session refuses, not
    # answer another layout's figures for pipeline and context parallelism together.
    from memorymark import Session

    bench = Session(Settings(model="tiny-llama", seq_len=32, backend="sim", gpu="a10")).bench
    s = Settings(model="tiny-llama", seq_len=32, backend="sim", gpu="a10", dist="fsdp",
                 gpus="8", pp=2, cp=2)  # fmt: skip
    with pytest.raises(ValueError, match="not simulated yet"):
        bench.measure(s, H100, 1)
