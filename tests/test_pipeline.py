"""Pipeline parallelism simulated with torch.distributed.pipelining's own stages and schedules
on a fake process group: every distinct stage's peak, the worst rank, the schedules' order, the
microbatches, and the one-line refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from memorymark import Session, Settings
from memorymark.backends.pipeline_sim import simulated_ranks
from memorymark.cli import render
from memorymark.cli.parser import main
from memorymark.measurement import Measurement
from memorymark.models import sources
from memorymark.reporting.json_form import report_to_dict
from memorymark.step.pipeline import layer_split, stages_of_rank

TINY = json.loads(
    (Path(__file__).parents[1] / "memorymark/models/configs/tiny-llama.json").read_text()
)


@pytest.fixture(scope="module")
def llama4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """tiny-llama with 4 layers (two stages of two, or four of one under interleaving), read
    from tmp_path (the app, once imported, limits config files to its uploads)."""
    path = tmp_path_factory.mktemp("pp") / "llama4.json"
    path.write_text(json.dumps({**TINY, "_source": None, "num_hidden_layers": 4}))
    before = sources._config_root
    sources.restrict_config_files(None)
    yield f"file:{path}"
    sources.restrict_config_files(before)


def _pp(model: str, schedule: str = "1f1b", **kw: object) -> Settings:
    kw.setdefault("virtual_stages", 2 if schedule == "interleaved-1f1b" else 1)
    base = dict(model=model, seq_len=256, gpu="h100", backend="sim", precision="bf16-mixed")
    return Settings(**{**base, "dist": "fsdp", "gpus": "4", "pp": 2, "microbatches": 4,
                       "pp_schedule": schedule, **kw})  # fmt: skip


@pytest.fixture(scope="module")
def by_schedule(llama4: str) -> dict[str, Measurement]:
    return {s: Session(_pp(llama4, s)).measure(8) for s in ("gpipe", "1f1b", "interleaved-1f1b")}


def test_every_distinct_stage_is_simulated_and_the_worst_is_named(by_schedule):
    m = by_schedule["1f1b"]
    assert [(s.pp_rank, s.rank, s.stages, s.micro_batch) for s in m.stages] == [
        (0, 0, (0,), 2),
        (1, 2, (1,), 2),  # pp is the mesh's outermost dimension: rank = pp_rank x 4 / 2
    ]
    # The last stage holds the head and the loss's vocabulary-sized logits: the worst.
    assert m.worst_stage == 1 and m.peak_bytes == m.stages[1].peak_bytes
    assert m.stages[1].peak_bytes > 2 * m.stages[0].peak_bytes
    record = m.to_dict()
    assert (record["worst_rank"], record["worst_pp_rank"]) == (2, 1)
    assert [s["stages"] for s in record["stages"]] == [[0], [1]]
    # History keeps the stages: a saved record reopens with them.
    from memorymark.reporting.record import measurement_from_record, measurement_record

    saved = json.loads(json.dumps(measurement_record(m)))
    reopened = measurement_from_record(saved)
    assert (reopened.stages, reopened.worst_stage) == (m.stages, m.worst_stage)


def test_gpipe_holds_every_microbatch_and_1f1b_fewer(by_schedule):
    gpipe, one_f, inter = (by_schedule[s] for s in ("gpipe", "1f1b", "interleaved-1f1b"))
    for rank in (0, 1):
        assert gpipe.stages[rank].peak_bytes > one_f.stages[rank].peak_bytes
    # Interleaving holds two stages a rank: stages 0 and 2 on rank 0, 1 and 3 on rank 1.
    assert [s.stages for s in inter.stages] == [(0, 2), (1, 3)]
    assert one_f.peak_bytes < inter.peak_bytes < gpipe.peak_bytes


def test_a_pipeline_is_estimated_as_fast_as_its_slowest_stage_less_the_bubble(by_schedule):
    gpipe, one_f, inter = (by_schedule[s] for s in ("gpipe", "1f1b", "interleaved-1f1b"))
    assert {m.throughput_source for m in (gpipe, one_f, inter)} == {"estimated"}
    # The same stages and the same bubble, 1 / (4 + 1): the same rate (the layout search read
    # none before, and called every pipeline "no fit").
    assert one_f.samples_per_second == pytest.approx(gpipe.samples_per_second)
    # Interleaving halves the bubble: (1 / 2) / (4 + 1 / 2) of the step against 1 / 5.
    assert inter.samples_per_second > one_f.samples_per_second


def test_the_middle_ranks_are_stood_for_by_the_second():
    assert simulated_ranks(2) == (0, 1)
    assert simulated_ranks(8) == (0, 1, 7)
    assert stages_of_rank(1, 4, 2) == (1, 5)
    assert [len(r) for r in layer_split(10, 4)] == [3, 3, 2, 2]


def test_the_report_carries_each_stage_and_the_worst_rank(llama4, capsys):
    from memorymark.ui.results import distributed_note  # Streamlit loads only here

    sources.restrict_config_files(None)  # the app, imported, limits configs to its uploads
    settings = _pp(llama4).replace(max_batch=16, step=8)
    report = Session(settings).analyze(fixes=False, plan=False)
    data = report_to_dict(report)
    pipeline = data["distributed"]["pipeline"]
    assert pipeline["layout"] == "FSDP 2 x PP 2"
    assert (pipeline["worst_rank"], pipeline["worst_pp_rank"]) == (2, 1)
    assert [s["pp_rank"] for s in pipeline["stages"]] == [0, 1]
    assert pipeline["micro_batch"] * pipeline["microbatches"] == report.optimal.batch_size
    # Two data-parallel ranks share each local batch's pipeline: the global batch is 2 x local.
    assert data["distributed"]["global_batch"] == 2 * report.optimal.batch_size
    assert data["depth_replay"]["fallback"].startswith("2 blocks a stage are too few to gain")
    render.print_report(report, data)
    printed = capsys.readouterr().out
    assert "worst stage on rank 2 (pipeline rank 1)" in printed
    assert "pipeline rank 0 (rank 0, stages 0)" in printed
    note = distributed_note(report)
    assert note is not None
    assert "the worst stage is on rank 2 (pipeline rank 1)" in note


def _flags() -> list[str]:
    return ["--gpu", "h100", "--backend", "sim", "--seq-len", "256", "--dist", "fsdp",
            "--gpus", "4", "--pp", "2", "--microbatches", "4", "--step", "8"]  # fmt: skip


@pytest.mark.parametrize(
    ("kw", "batch", "message"),
    [
        (dict(pp=4, gpus="4"), 4, "4 pipeline stages over 2 layers"),
        (dict(backend="cpu"), 8, "takes one process per GPU: torchrun"),
        (dict(), 6, "does not split into 4 microbatches"),
        (dict(dist="ddp"), 8, "--pp with --dist ddp is not modelled"),
        (dict(microbatches=1), 8, "--microbatches 1 under 1f1b: it takes at least one a stage"),
        (dict(lora_rank=8), 8, "--pp with LoRA is not simulated"),
    ],
)
def test_bad_pipeline_input_is_refused_in_one_line(kw, batch, message):
    settings = _pp("tiny-llama", **kw)
    with pytest.raises(ValueError, match=message) as caught:
        Session(settings).measure(batch)
    assert "\n" not in str(caught.value)


def test_the_snippets_split_the_model_and_run_the_schedule():
    from memorymark.reporting.snippets import snippet
    from memorymark.search.plan import TrainingPlan

    settings = Settings(
        model="llama-3.1-8b", seq_len=8192, gpu="h100", dist="fsdp", gpus="32", pp=4,
        pp_schedule="interleaved-1f1b", virtual_stages=2, microbatches=8,
        precision="bf16-mixed",
    )  # fmt: skip
    plan = TrainingPlan(micro_batch=8, accumulation_steps=1, target_batch=None)
    code = snippet("torch", settings, plan)
    compile(code, "train.py", "exec")
    assert 'mesh_dim_names=("pp", "dp_shard")' in code
    assert "ScheduleInterleaved1F1B(stages, n_microbatches=8, loss_fn=loss_fn)" in code
    assert "pp, stages_per_rank = 4, 2" in code
    fragment = snippet("hf", settings, plan)
    assert "#   pipeline_parallel_degree = 4" in fragment
    assert '#   pipeline_parallel_schedule = "Interleaved1F1B"' in fragment
    assert "#   pipeline_parallel_microbatch_size = 1" in fragment


def test_a_pipeline_search_tries_multiples_of_its_microbatches(capsys):
    code = main(["analyze", "tiny-llama", "--backend", "sim", "--gpu-memory", "1", "--gpus", "2",
                 "--pp", "2", "--seq-len", "4096", "--max-batch", "16", "--json"])  # fmt: skip
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    tried = [r["batch_size"] for r in report["results"]]
    assert tried and all(b % 2 == 0 for b in tried)  # 1 never: 1F1B takes 2 microbatches
    assert report["optimal_batch_size"] is None
    assert "even a local batch of 2" in report["verdict"]


@pytest.mark.parametrize(
    ("target", "plan", "note"),
    [
        # 24 over 2 data-parallel ranks is 12 each: 6 x 2, 6 a multiple of the 2 microbatches.
        (24, {"micro_batch": 6, "accumulation_steps": 2, "data_parallel_ranks": 2}, None),
        # 9 a rank has no even divisor: planning 3 crashed the accumulation check.
        (18, None, "a rank's share (9) is not a multiple of the 2 microbatches"),
    ],
)
def test_a_pipeline_s_plan_shares_the_target_in_multiples_of_its_microbatches(
    capsys, target, plan, note
):
    code = main(["analyze", "tiny-llama", "--backend", "sim", "--gpus", "4", "--dist", "fsdp",
                 "--pp", "2", "--seq-len", "64", "--max-batch", "8", "--current-batch", "8",
                 "--target-batch", str(target), "--json"])  # fmt: skip
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["optimal_batch_size"] == 8
    if plan is None:
        assert report["plan"] is None and note in report["plan_note"]
    else:
        assert {k: report["plan"][k] for k in plan} == plan
        assert report["plan"]["effective_batch"] == target


def test_tensor_parallelism_splits_each_stage(llama4: str) -> None:
    # FSDP 2 x TP 2 x PP 2 on 8 GPUs against FSDP 2 x PP 2 on 4: each stage's blocks, and the
    # last stage's output layer, split over the tp ranks (the logits by vocabulary for
    # loss_parallel), the stream between stages each rank's half of the sequence.
    alone = Session(_pp(llama4)).measure(8)
    split = Session(_pp(llama4, gpus="8", tp=2)).measure(8)
    for one, two in zip(alone.stages, split.stages, strict=True):
        assert two.peak_bytes < one.peak_bytes
    # Half the parameters, less the norms' weights, which every tp rank keeps whole.
    assert 0.49 < split.breakdown.parameters / alone.breakdown.parameters < 0.51
    assert split.breakdown.logits < alone.breakdown.logits / 2
    assert [s.rank for s in split.stages] == [0, 4]  # pp is the mesh's outermost dimension


def test_each_rank_s_stages_are_depth_replayed_as_traced(tmp_path: Path) -> None:
    # 28 blocks, 14 a stage: each rank's stages are read off the model built with 2 to 5
    # blocks a stage, and every rank's peak, reserved and required bytes are the full trace's.
    path = tmp_path / "llama28.json"
    path.write_text(json.dumps({**TINY, "_source": None, "num_hidden_layers": 28}))
    sources.restrict_config_files(None)
    runs, summaries = {}, {}
    for depth in ("replay", "trace"):
        settings = _pp(f"file:{path}", seq_len=32, microbatches=2, depth=depth)
        backend = Session(settings).open_backend()
        with backend.session():
            runs[depth] = [backend.measure(b) for b in (2, 4)]
            summaries[depth] = backend.depth_replay
    replay = summaries["replay"]
    assert replay is not None and replay.fallback is None, replay
    assert (replay.layers, replay.stages, replay.replayed_steps) == (14, 2, 4)
    assert replay.says().startswith("14 blocks a stage (2 stages) replayed from simulated")
    for replayed, traced in zip(runs["replay"], runs["trace"], strict=True):
        assert replayed.stages == traced.stages
        for name in ("peak_bytes", "cuda_reserved_bytes", "required_bytes", "runs", "fits"):
            assert getattr(replayed, name) == getattr(traced, name), name


def test_stages_of_uneven_depth_are_traced_in_full(llama4: str, tmp_path: Path) -> None:
    path = tmp_path / "llama29.json"
    path.write_text(json.dumps({**TINY, "_source": None, "num_hidden_layers": 29}))
    sources.restrict_config_files(None)
    backend = Session(_pp(f"file:{path}", seq_len=32, microbatches=2)).open_backend()
    replay = backend.depth_replay
    assert replay is not None and not replay.traced_depths
    assert replay.fallback == "its 29 blocks do not split evenly into 2 pipeline stages"
