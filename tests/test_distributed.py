"""Many GPUs simulated with PyTorch's own DDP, ZeRO and FSDP2 on a fake process group: what one
rank holds, the NCCL overhead, `--gpus auto`, and the report's per-GPU and global batch."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch.distributed as dist

from memorymark import Session, Settings
from memorymark.accounting import allocator
from memorymark.cli.parser import main
from memorymark.distributed import topology
from memorymark.measurement import Measurement
from memorymark.reporting.json_form import report_to_dict
from memorymark.search.gpu_count import min_gpus
from memorymark.units import GIB, MIB

# A 2-layer GPT-2 whose every dimension divides by 4, so FSDP2's shards carry no padding.
ONE_GPU = Settings(model="tiny-gpt2", seq_len=32, gpu="a10", backend="sim", max_batch=64)


def _on(dist_name: str, gpus: int, **kw: object) -> Settings:
    return ONE_GPU.replace(dist=dist_name, gpus=str(gpus), **kw)


@pytest.fixture(scope="module")
def single() -> Measurement:
    return Session(ONE_GPU).measure(2)


def _states(settings: Settings) -> dict:
    """Rank 0's bytes by category once the model is spread and the optimizer primed."""
    return Session(settings).resident_bytes()


def test_fsdp_keeps_a_quarter_of_parameters_and_optimizer_state_on_four_ranks(single):
    one, four = _states(ONE_GPU), _states(_on("fsdp", 4))
    assert four["parameters"] * 4 == one["parameters"]
    # AdamW's two moments per parameter, sharded; its step counters stay whole (one per tensor).
    assert one["optimizer_state"] / 4 < four["optimizer_state"] < one["optimizer_state"] / 3.9
    assert not dist.is_initialized()  # the fake process group went with the backend


def test_fsdp_frees_each_gathered_block_and_no_reshard_keeps_them(single):
    fsdp = Session(_on("fsdp", 4)).measure(2)
    kept = Session(_on("fsdp-no-reshard", 4)).measure(2)
    # At the peak (early in backward) fsdp holds its shards and the block being gathered...
    assert single.breakdown.parameters / 4 < fsdp.breakdown.parameters
    assert fsdp.breakdown.parameters < single.breakdown.parameters
    # ...and without resharding, every block gathered in forward is still whole.
    assert kept.breakdown.parameters > fsdp.breakdown.parameters


def test_fsdp_allocates_gathers_and_gradient_shards_on_its_own_streams(monkeypatch):
    # FSDP2 makes each flat all-gather buffer on its copy-in stream (1) and each reduce-scatter
    # output on its reduce-scatter stream (3); the allocator replay keeps their blocks apart.
    logs = []
    replay = allocator.replay

    def spy(setup, step, *args, **kwargs):
        logs.append(step[1])
        return replay(setup, step, *args, **kwargs)

    monkeypatch.setattr(allocator, "replay", spy)
    Session(_on("fsdp", 4)).measure(2)
    made = [e for e in logs[-1] if e is not None and e >= 0]
    streams = [allocator.event_stream(e) for e in made]
    groups = 3  # each of the 2 blocks, and the root (embeddings, final norm)
    assert streams.count(3) == groups
    assert streams.count(1) >= groups  # a gather per group in forward, again in backward
    assert set(streams) == {0, 1, 3}
    for i, stream in enumerate(streams):
        if stream == 3:  # a quarter of the reduce-scatter input made just before it
            assert allocator.event_bytes(made[i]) * 4 == made[i - 1]


def test_hsdp_shards_inside_a_node_and_replicates_across_nodes():
    assert _states(_on("hsdp", 4, nodes=2))["parameters"] * 2 == _states(ONE_GPU)["parameters"]


def test_ddp_keeps_gradient_buckets_as_large_as_the_gradients(single):
    m = Session(_on("ddp", 2)).measure(2)
    # gradient_as_bucket_view=False (DDP's default): flat buckets hold a copy of every gradient.
    assert m.breakdown.gradients >= single.breakdown.parameters
    assert m.breakdown.parameters == single.breakdown.parameters
    assert m.peak_bytes > single.peak_bytes


def test_zero1_partitions_optimizer_state_greedily_and_unevenly(single):
    m = Session(_on("zero1", 4)).measure(2)
    full = single.breakdown.optimizer_state
    # Rank 0 gets the 1000x32 embedding, the largest tensor: more than a quarter, less than all.
    assert full / 4 < m.breakdown.optimizer_state < full


def test_a_sweep_reports_per_gpu_and_global_batch_and_nccl_in_json():
    session = Session(_on("fsdp", 2))
    one_gpu = Session(ONE_GPU)
    assert one_gpu.gpu.usable_bytes - session.gpu.usable_bytes == 256 * MIB
    d = report_to_dict(session.analyze(fixes=False, plan=False))
    per_gpu = d["distributed"]["per_gpu_batch"]
    assert per_gpu == d["optimal_batch_size"] == 64
    assert d["distributed"]["global_batch"] == 2 * per_gpu
    assert d["distributed"]["zero_stage"] == 3
    assert d["gpu_overheads_gb"]["nccl"] == 0.25
    assert d["distributed"]["per_rank_breakdown_bytes"]["parameters"] > 0


def test_repeated_simulations_with_other_rank_counts_share_one_process():
    for n in (3, 2, 3):
        m = Session(_on("fsdp-no-reshard", n)).measure(1)
        assert m.fits
    assert not dist.is_initialized()


def _fake_measure(needs_gpus: int | None, seen: list[int], a: int = 0, b: int = 0):
    def measure(s: Settings) -> Measurement:
        n = s.hardware.gpu_count
        seen.append(n)
        runs = needs_gpus is not None and n >= needs_gpus
        return Measurement(
            batch_size=1, fits=runs, runs=runs, peak_bytes=1, backend="fake", measured=False,
            required_bytes=a + b // n,
        )  # fmt: skip

    return measure


def test_min_gpus_predicts_from_one_gpu_and_one_node():
    # Batch 1 needs 10 + 1000/n GiB-like units; 80 fit: 1000/n <= 70 from n = 15, so 16, and
    # the count before it (8) was the node measured second: three steps, none on 1,024 ranks.
    seen: list[int] = []
    measure = _fake_measure(16, seen, a=10, b=1000)
    search = min_gpus(_on("fsdp", 1), measure, limit=lambda n: 80)
    assert search.min_gpus == 16
    assert seen == [1, 8, 16]


def test_min_gpus_checks_the_count_before_a_prediction():
    # 10 + 2000/n <= 80 from n = 28.6: predicted 32; 24 goes first (it does not run), then 32.
    seen: list[int] = []
    search = min_gpus(_on("fsdp", 1), _fake_measure(32, seen, a=10, b=2000), limit=lambda n: 80)
    assert search.min_gpus == 32
    assert seen == [1, 8, 24, 32]


def test_min_gpus_starts_from_the_counts_a_caller_stepped():
    # The ways out stepped 2 and 3 in order (10 + 60/n: 40 and 30 do not fit 20): they are
    # not stepped again, and a + b/n through them predicts 6 (20 fits): 5 goes first, then 6.
    seen: list[int] = []
    measure = _fake_measure(6, seen, a=10, b=60)
    known = {n: measure(_on("fsdp", n)) for n in (2, 3)}
    seen.clear()
    search = min_gpus(_on("fsdp", 4), measure, (4, 5, 6, 7, 8), lambda n: 20, known=known)
    assert search.min_gpus == 6
    assert seen == [5, 6]
    assert [n for n, _ in search.tried] == [2, 3, 5, 6]


def test_min_gpus_steps_below_a_high_guess_first():
    # Llama-3.1-70B's QLoRA on A10s (GiB, limit 21.25): a + b/n through 2 and 3 guesses 7,
    # high; 6 goes first and fits, so 7 is never stepped; through 3 and 6 none of 4, 5 would,
    # so 5 alone is checked, not 4 then 5.
    needs = {2: 34.6, 3: 28.2, 4: 23.5, 5: 21.4, 6: 20.0, 7: 18.8, 8: 17.9}
    seen: list[int] = []

    def measure(s: Settings) -> Measurement:
        n = s.hardware.gpu_count
        seen.append(n)
        fits = needs[n] <= 21.25
        return Measurement(
            batch_size=1, fits=fits, runs=fits, peak_bytes=1, backend="fake", measured=False,
            required_bytes=int(needs[n] * GIB),
        )  # fmt: skip

    known = {n: measure(_on("fsdp", n)) for n in (2, 3)}
    seen.clear()
    search = min_gpus(
        _on("fsdp", 4), measure, (4, 5, 6, 7, 8), lambda n: int(21.25 * GIB), known=known
    )
    assert search.min_gpus == 6 and seen == [6, 5]


def test_min_gpus_answers_inside_a_node_without_a_prediction():
    seen: list[int] = []
    assert min_gpus(_on("fsdp", 1), _fake_measure(3, seen)).min_gpus == 3
    assert seen[:2] == [1, 8] and max(seen) == 8


def test_min_gpus_does_not_step_counts_the_sharded_states_alone_overflow():
    # 900 units of states need 900/80 > 11 ranks: 16 is the first stepped, then 24.
    seen: list[int] = []
    measure = _fake_measure(24, seen, a=10, b=1000)
    search = min_gpus(_on("fsdp", 1), measure, limit=lambda n: 80, sharded_states=900)
    assert search.min_gpus == 24 and seen == [16, 24]
    assert search.to_dict()["first_count_stepped"] == 16 and search.ruled_out_below == 16
    assert search.to_dict()["searched_counts"][0]["gpus"] == 16
    # States no count holds: the largest is stepped, to say how far off it is.
    seen.clear()
    measure = _fake_measure(None, seen, a=10, b=10**6)
    none = min_gpus(_on("fsdp", 1), measure, limit=lambda n: 80, sharded_states=10**6)
    assert none.min_gpus is None and seen == [1024] and none.first_count == 1024


def test_min_gpus_bisects_over_what_a_cluster_offers():
    seen: list[int] = []
    search = min_gpus(_on("fsdp", 1), _fake_measure(40, seen))
    assert search.min_gpus == 40
    assert seen[:3] == [1, 8, 1024]  # no fit without a capacity: the largest count is needed
    assert len(seen) <= 3 + 8  # log2 of the 135 counts


def test_min_gpus_is_none_when_no_count_trains():
    seen: list[int] = []
    assert min_gpus(_on("ddp", 1), _fake_measure(None, seen)).min_gpus is None
    assert seen == [1, 8, 1024]
    seen.clear()
    flat = min_gpus(_on("ddp", 1), _fake_measure(None, seen, a=90), limit=lambda n: 80)
    assert flat.min_gpus is None and seen == [1, 8, 1024]


def test_cluster_counts_are_one_node_then_whole_nodes():
    counts = topology.cluster_counts()
    assert counts[:9] == (1, 2, 3, 4, 5, 6, 7, 8, 16)
    assert counts[-1] == 1024 and len(counts) == 8 + 127


def test_traffic_follows_ring_collectives():
    # fsdp: two all-gathers of bf16 parameters and a reduce-scatter of fp32 gradients.
    t = topology.step_traffic("fsdp", 4, 1, 1000, 2, 4)
    assert t.intra_node_bytes == pytest.approx((2 * 2000 + 4000) * 3 / 4)
    t = topology.step_traffic("ddp", 16, 2, 1000, 4, 4)
    assert t.inter_node_bytes == pytest.approx(2 * 15 / 16 * 4000) and t.intra_node_bytes == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": "2"}, "needs a distributed strategy"),
        ({"dist": "fsdp", "gpus": "eight"}, "whole number or auto"),
        ({"dist": "fsdp", "gpus": "2048"}, "at most 1,024"),
        ({"dist": "fsdp", "gpus": "6", "nodes": 4}, "cannot spread evenly"),
        ({"dist": "ddp", "gpus": "2", "offload": "cpu"}, "FSDP2's"),
        ({"dist": "zero3"}, "dist must be one of"),
    ],
)
def test_bad_distribution_settings_are_refused_in_one_line(fields, message):
    with pytest.raises(ValueError, match=message):
        replace(ONE_GPU, **fields)


def test_cli_gpus_auto_reports_min_gpus(capsys):
    status = main(
        ["analyze", "tiny-gpt2", "--seq-len", "32", "--gpu", "a10", "--backend", "sim",
         "--dist", "fsdp", "--gpus", "auto", "--max-batch", "8", "--json"]
    )  # fmt: skip
    assert status == 0
    d = json.loads(capsys.readouterr().out)["distributed"]
    assert d["min_gpus"] == 1 and d["gpus"] == 1
    assert d["searched_counts"][0]["runs"] is True


def test_cli_refuses_a_bad_gpu_count_with_status_2(capsys):
    status = main(["analyze", "tiny-gpt2", "--dist", "fsdp", "--gpus", "0"])
    assert status == 2
    assert "gpus must be at least 1" in capsys.readouterr().err


def test_cpu_offload_keeps_states_in_host_memory():
    on_gpu, offloaded = _on("fsdp", 4), _on("fsdp", 4, offload="cpu")
    held = _states(offloaded)
    assert held["parameters"] == held["optimizer_state"] == 0
    assert _states(on_gpu)["optimizer_state"] > 0
    kept, moved = Session(on_gpu).measure(2), Session(offloaded).measure(2)
    assert moved.breakdown.optimizer_state == 0
    # Still on the GPU: the gathered block, the activations and backward's temporaries.
    assert 0 < moved.breakdown.parameters < kept.breakdown.parameters
    assert moved.breakdown.activations == kept.breakdown.activations


def test_min_gpus_wants_batch_1_to_fit_with_the_margin_not_only_to_run():
    # On 16 batch 1 runs only past the margin (after a cache flush, say): the sweep there
    # would recommend nothing, so the answer is the first count where it fits, 24.
    seen: list[int] = []

    def measure(s: Settings) -> Measurement:
        n = s.hardware.gpu_count
        seen.append(n)
        return Measurement(batch_size=1, fits=n >= 24, runs=n >= 16, peak_bytes=1,
                           backend="fake", measured=False)  # fmt: skip

    search = min_gpus(_on("fsdp", 1), measure, counts=(8, 16, 24, 32))
    assert search.min_gpus == 24 and seen == [8, 16, 32, 24]
    assert [c["fits"] for c in search.to_dict()["searched_counts"]] == [False] * 2 + [True] * 2
    assert [c["runs"] for c in search.to_dict()["searched_counts"]] == [False] + [True] * 3


def test_min_gpus_keeps_bisecting_below_a_prediction_that_was_too_high():
    # Predicted 32 (the fit is off): 24, below it, goes first and trains, so 32 is never
    # stepped; 16 is the bisection's (the fit through 8 and 24 still says 32).
    seen: list[int] = []
    measure = _fake_measure(24, seen, a=10, b=1000)
    search = min_gpus(_on("fsdp", 1), measure, limit=lambda n: 45)
    assert search.min_gpus == 24
    assert seen == [1, 8, 24, 16]


@pytest.mark.parametrize("dim", [0, 1])
def test_rank_chunks_are_fsdp2s_chunks_made_when_read(dim):
    import torch
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

    from memorymark.backends.dist_sim import RankChunks

    for size in range(10):
        for count in range(1, 7):
            shape = (size, 3) if dim == 0 else (3, size)
            tensor = torch.arange(3 * size, dtype=torch.float32).reshape(shape)
            want, got = _chunk_with_empty(tensor, count, dim), RankChunks(tensor, count, dim)
            assert len(got) == len(want) == count
            for i in range(-count, count):
                a, b = want[i], got[i]
                assert (a.shape, a.stride(), a.storage_offset()) == (
                    b.shape, b.stride(), b.storage_offset()
                )  # fmt: skip
                assert torch.equal(a, b)
            assert [c.shape for c in got[1:]] == [c.shape for c in want[1:]]
            with pytest.raises(IndexError, match="chunk"):
                got[count]


def test_sharding_with_chunks_made_when_read_steps_alike(monkeypatch):
    # 3 ranks pad every shard of the 2-layer GPT-2 (no dimension divides by 3).
    settings = _on("fsdp", 3)
    lazy = Session(settings).measure(2)
    from memorymark.backends import dist_sim

    monkeypatch.setattr(dist_sim, "_sharding_patches", lambda: ())
    eager = Session(settings).measure(2)
    assert lazy.peak_bytes == eager.peak_bytes and lazy.required_bytes == eager.required_bytes
    assert lazy.breakdown == eager.breakdown
