"""Tensor and context parallelism simulated with PyTorch's own `parallelize_module`, loss
parallelism and ring attention on a fake process group: what one rank holds, what shrinks, and
the layouts refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from memorymark import Session, Settings, models
from memorymark.backends import tensor_parallel
from memorymark.measurement import Measurement

# A 2-layer Llama (4 heads, 2 key/value heads, vocabulary 8192, width 64): every split divides.
ONE = Settings(
    model="tiny-llama", seq_len=256, gpu="h100", backend="sim", precision="bf16-mixed",
    max_batch=64,
)  # fmt: skip


def _on(**kw: object) -> Settings:
    return ONE.replace(**kw)


@pytest.fixture(scope="module")
def steps() -> dict[str, Measurement]:
    layouts = {
        "fsdp2": _on(dist="fsdp", gpus="2"),
        "fsdp2_tp2": _on(dist="fsdp", gpus="4", tp=2),
        "fsdp2_cp2": _on(dist="fsdp", gpus="4", cp=2),
    }
    return {name: Session(s).measure(2) for name, s in layouts.items()}


def test_each_rank_holds_one_tp_times_dp_share_of_the_weights():
    whole = Session(ONE).resident_bytes()["parameters"]
    for gpus, tp in ((2, 2), (4, 2)):
        held = Session(_on(dist="fsdp" if gpus > tp else "none", gpus=str(gpus), tp=tp))
        share = held.resident_bytes()["parameters"]
        # Within what stays whole on every tp rank: the norms' weights (5 x 64 fp32 values).
        assert abs(share * gpus - whole) <= gpus * 5 * 64 * 4
    assert not dist.is_initialized()


def test_tensor_parallelism_shrinks_activations_and_splits_logits(steps):
    fsdp, tp = steps["fsdp2"], steps["fsdp2_tp2"]
    assert tp.breakdown.activations < 0.7 * fsdp.breakdown.activations
    # loss_parallel: no rank holds the whole logits or their fp32 copy.
    assert tp.peak_bytes < 0.6 * fsdp.peak_bytes


def test_gathered_logits_cost_more_than_loss_parallel(monkeypatch):
    settings = _on(dist="none", gpus="2", tp=2)
    split = Session(settings).measure(2).peak_bytes
    original = tensor_parallel.apply_tp
    monkeypatch.setattr(
        tensor_parallel, "apply_tp", lambda m, mesh, **_: original(m, mesh, loss_parallel=False)
    )
    monkeypatch.setattr(tensor_parallel, "loss_parallel_context", lambda on: _no_context())
    gathered = Session(settings).measure(2).peak_bytes
    assert gathered > 1.5 * split


def _no_context():
    import contextlib

    return contextlib.nullcontext()


def test_attention_runs_with_the_local_heads_and_the_ring_with_the_local_sequence(monkeypatch):
    from torch.distributed.tensor.experimental._context_parallel import _attention

    seen: list[tuple[int, ...]] = []
    original = _attention._templated_ring_attention

    def spy(*args, **kwargs):
        seen.append(tuple(kwargs["query"].shape))
        return original(*args, **kwargs)

    monkeypatch.setattr(_attention, "_templated_ring_attention", spy)
    Session(_on(dist="fsdp", gpus="8", tp=2, cp=2)).measure(2)
    # (batch, heads 4 / tp 2, sequence 256 / cp 2, head dim 16), once per block.
    assert seen == [(2, 2, 128, 16)] * 2


def test_context_parallelism_halves_activations_and_shards_over_dp_times_cp(steps):
    fsdp, cp = steps["fsdp2"], steps["fsdp2_cp2"]
    assert cp.breakdown.activations < 0.6 * fsdp.breakdown.activations
    # FSDP2 shards over dp_shard x cp (4 ranks), as torchtitan flattens them.
    whole = Session(ONE).resident_bytes()["parameters"]
    held = Session(_on(dist="fsdp", gpus="4", cp=2)).resident_bytes()["parameters"]
    assert held * 4 == pytest.approx(whole, rel=1e-3)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(dist="fsdp", gpus="6", tp=3), "--tp 3 does not divide the model's 4 attention"),
        (dict(dist="fsdp", gpus="4", tp=2, seq_len=255), "divisible by 2"),
        (dict(dist="fsdp", gpus="4", cp=2, seq_len=254), "divisible by 4"),
        (dict(dist="fsdp", gpus="4", cp=2, attention="eager"), "use --attention sdpa"),
        (dict(dist="ddp", gpus="4", tp=2), "--dist ddp beside --tp or --cp is not modelled"),
        (dict(dist="fsdp", gpus="4", tp=2, lora_rank=8), "--tp beside LoRA adapters"),
        (dict(dist="fsdp", gpus="8", cp=2, pp=2), "--pp beside --cp is not simulated"),
        (dict(dist="fsdp", gpus="4", tp=2, compile=True), "--compile beside --tp"),
        (dict(model="tiny-bert", seq_len=64, dist="fsdp", gpus="4", cp=2), "as a causal LM"),
        (dict(model="resnet", dist="fsdp", gpus="4", tp=2), "resnet is an image model"),
    ],
)
def test_layouts_the_model_cannot_take_are_refused_in_one_line(fields, message):
    with pytest.raises(ValueError, match=message) as raised:
        Session(_on(**fields)).measure(1)
    assert "\n" not in str(raised.value)


def test_a_model_without_a_plan_is_refused_in_one_line():
    with pytest.raises(ValueError, match="carries none") as raised:
        Session(_on(model="tiny-gpt2", seq_len=64, dist="none", gpus="2", tp=2)).measure(1)
    assert "\n" not in str(raised.value)


def test_the_torch_snippet_builds_the_mesh_and_splits_as_simulated():
    import ast

    from memorymark.reporting.snippets import snippet, torchtitan_toml
    from memorymark.search.plan import TrainingPlan

    s = Settings(model="llama-3.1-8b", precision="bf16-mixed", dist="fsdp", gpus="16", tp=2, cp=2)
    code = snippet("torch", s, TrainingPlan(micro_batch=2, accumulation_steps=1, target_batch=None))
    ast.parse(code)
    assert "mesh_dim_names=('dp_shard', 'cp', 'tp')" in code and "(4, 2, 2)" in code
    assert "model.config.base_model_tp_plan" in code and "parallelize_module(block" in code
    assert 'mesh["dp_shard", "cp"]._flatten("dp_shard_cp")' in code
    assert "with train_context(batch):" in code and "loss_parallel()" in code
    assert "num_replicas=4, rank=dp_rank" in code
    toml = torchtitan_toml(s)
    assert "tensor_parallel_degree = 2" in toml and "data_parallel_shard_degree = 4" in toml
    assert "# context_parallel_degree = 2" in code


def test_the_json_report_names_the_layout():
    from memorymark.reporting.json_form import _layout_dict

    d = _layout_dict(_on(dist="fsdp", gpus="8", tp=2, cp=2))
    assert d == {"tp": 2, "cp": 2, "dp": 2, "layout": "FSDP 2 x CP 2 x TP 2",
                 "mesh": {"dp_shard": 2, "cp": 2, "tp": 2}}  # fmt: skip


def test_the_global_batch_counts_data_parallel_ranks_only():
    from memorymark import Costs
    from memorymark.report import Report

    settings = _on(dist="fsdp", gpus="8", tp=2, cp=2, grad_accum=2)
    session = Session(settings)
    m = session.measure(4)
    report = Report(
        settings=settings, costs=Costs(), gpu=session.gpu, backend="sim", measurements=(m,),
        elapsed_seconds=0.0,
    )  # fmt: skip
    # FSDP 2 x CP 2 x TP 2: two data-parallel ranks of 4 samples, twice accumulated.
    assert report.global_batch_per_step == 4 * 2 * 2


def test_activations_shrink_as_tp_grows(tmp_path, any_config_path):
    import json

    config = json.loads((Path(models.__file__).parent / "configs" / "tiny-llama.json").read_text())
    config.update(num_attention_heads=8, num_key_value_heads=4, head_dim=8, vocab_size=1024)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    activations = []
    for tp in (1, 2, 4):
        spread = dict(dist="none", gpus=str(tp), tp=tp) if tp > 1 else {}
        m = Session(_on(model=f"file:{path}", **spread)).measure(2)
        activations.append(m.breakdown.activations)
    assert activations[0] > activations[1] > activations[2]


def test_apply_tp_splits_a_pipeline_stage_s_subtree():
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from memorymark.backends.dist_sim import fake_group

    entry = models.find_model("tiny-llama")
    with torch.device("meta"):
        model = models.build_model(entry, "causal-lm")
    # The last stage of two, torchtitan-style: the second block, the final norm, the head.
    base = model.model
    base.layers = torch.nn.ModuleList([base.layers[1]])
    base.embed_tokens = None
    with fake_group(2):
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        tensor_parallel.apply_tp(model, mesh)
    q = base.layers[0].self_attn.q_proj.weight
    assert isinstance(q, DTensor) and q.placements == (Shard(0),)
    assert q.to_local().shape == (32, 64)  # 2 of 4 heads of 16
    assert isinstance(base.norm.weight, DTensor)  # sequence parallel
    head = model.lm_head.weight
    assert isinstance(head, DTensor) and head.to_local().shape == (4096, 64)  # vocab split


def test_a_tensor_parallel_rank_is_estimated_to_compute_its_share():
    # DTensor operators reach the tracker with global shapes: their FLOPs are divided over the
    # ranks their output is split over, their bytes are the local tensors'. Before, a TP 2
    # rank was estimated as slow as one computing the whole step (1.0x; now 1.78x).
    base = dict(model="tiny-llama", seq_len=256, backend="sim", gpu="h100", dist="fsdp", gpus="4")
    alone = Session(Settings(**base)).measure(8)
    split = Session(Settings(**base, tp=2)).measure(8)
    assert split.samples_per_second > 1.5 * alone.samples_per_second


def test_the_split_s_own_tensors_are_not_set_up_memory():
    # torchtitan splits a model built on the meta device and materialises each rank's part at
    # the end: the whole tp slices FSDP2 then shards never take device memory. Counted, they
    # left Llama-3.1-70B at FSDP 128 x TP 2 with 146 GiB reserved for a 16.5 GiB peak.
    from memorymark.accounting.allocator import event_bytes

    backend = Session(_on(dist="fsdp", gpus="4", tp=2)).open_backend()
    backend.keep_records()
    with backend.session():
        backend.measure(2)
        # This rank's shards (fp32), what spreading the model leaves it.
        held = sum(p.to_local().untyped_storage().nbytes() for p in backend._model.parameters())
    record = backend.last_record
    assert record is not None and record.state_from is not None
    _, setup = record.baseline_events
    spreading = sum(event_bytes(e) for e in setup[: record.state_from] if e is not None and e > 0)
    # FSDP2's shards and what it copies making them: 3.0x the shards here. Counting the tp
    # slices too made it 7.0x.
    assert held <= spreading <= 4 * held
