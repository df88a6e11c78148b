"""The compiled step simulated (memorymark/step/compiled.py): what AOTAutograd's partitioner
saves is what the tracker holds after forward, a fused pointwise chain allocates only its
output, graph breaks are reported where they happen, and Float8 is refused before FP8 GPUs."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from memorymark import Session, Settings
from memorymark.accounting.tracker import CompiledStepTracker
from memorymark.backends.sim import to_fake
from memorymark.measurement import Category
from memorymark.step import compiled


def _saved_bytes(nodes: list[torch.fx.Node]) -> int:
    """Bytes of the storages behind `nodes`' values, each storage once (a view saved beside
    its base shares it)."""
    storages = {n.meta["val"].untyped_storage()._cdata: n.meta["val"] for n in nodes}
    return sum(v.untyped_storage().nbytes() for v in storages.values())


def _forward_growth(module: nn.Module, x_shape: tuple[int, ...]) -> tuple[int, int]:
    """(bytes alive after a compiled forward beyond the inputs and weights, bytes the
    partitioner reports saved for backward and returned)."""
    compiled.reset_log()
    fake_mode = FakeTensorMode()
    with torch.device("meta"):
        module = module.to("meta")
    to_fake(module, fake_mode)
    module.compile(backend=compiled.simulated_backend(), dynamic=False)
    tracker = CompiledStepTracker()
    with fake_mode, tracker:
        tracker.track_all(list(module.parameters()), Category.PARAMETERS)
        x = torch.zeros(x_shape)
        before = tracker.live_bytes
        out = module(x)
        growth = tracker.live_bytes - before
    graphs = compiled.log()
    (forward,) = graphs.forward
    saved = [
        n
        for n in graphs.saved_for_backward()
        if n.op != "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
    ]
    assert saved, "the partitioner saved no activation"
    return growth, _saved_bytes(saved) + out.untyped_storage().nbytes()


def test_a_compiled_mlp_holds_what_the_partitioner_saves() -> None:
    mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    growth, reported = _forward_growth(mlp, (32, 64))
    # AOTAutograd saves the first linear's output and the GELU's (32 x 256 fp32 each) and
    # returns 32 x 64: 2 * 32 KiB + 8 KiB.
    assert growth == reported == 2 * 32 * 256 * 4 + 32 * 64 * 4


def test_a_compiled_two_layer_transformer_holds_what_the_partitioner_saves() -> None:
    layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    growth, reported = _forward_growth(model, (4, 16, 64))
    assert growth == reported
    assert reported > 4 * 16 * 64 * 4 * 4  # more than the output: several activations a layer


def _chain(x: torch.Tensor) -> torch.Tensor:
    return ((x * 2 + 1).sin() * 3).cos()


def _peak_growth(fn, shape: tuple[int, ...]) -> int:
    tracker = CompiledStepTracker()
    with FakeTensorMode(), tracker:
        x = torch.zeros(shape)
        before = tracker.live_bytes
        fn(x)
        return tracker.peak_bytes - before


def test_a_fused_pointwise_chain_allocates_only_its_output() -> None:
    shape, nbytes = (256, 256), 256 * 256 * 4
    eager = _peak_growth(_chain, shape)
    compiled.reset_log()
    fused = _peak_growth(
        torch.compile(_chain, backend=compiled.simulated_backend(), dynamic=False), shape
    )
    assert eager == 2 * nbytes  # each op's input and output alive at once
    assert fused == nbytes  # one kernel: only its output exists
    unfused = _peak_growth(
        torch.compile(_chain, backend=compiled.simulated_backend(fuse=False), dynamic=False), shape
    )
    assert unfused == eager


def _with_a_break(x: torch.Tensor) -> torch.Tensor:
    y = x.sin()
    torch._dynamo.graph_break()
    return y.cos()


def test_a_graph_break_is_reported_where_it_happened() -> None:
    compiled.reset_log()
    fn = torch.compile(_with_a_break, backend=compiled.simulated_backend(), dynamic=False)
    with compiled.breaks_recorded():
        _peak_growth(fn, (8, 8))
    breaks = compiled.log().breaks
    assert breaks, "no graph break recorded"
    assert any(b.where.startswith(__file__) for b in breaks), breaks
    assert len(compiled.log().forward) == 2  # the two regions around the break


@pytest.mark.parametrize("gpu", ["a100-80gb", "a10", "t4"])
def test_float8_is_refused_before_fp8_gpus(gpu: str) -> None:
    with pytest.raises(ValueError, match=r"float8 training needs FP8 matmuls .*drop --float8"):
        Settings(model="tiny-llama", gpu=gpu, float8="tensorwise")
    Settings(model="tiny-llama", gpu="h100", float8="tensorwise")  # Hopper: accepted


def test_the_memory_budget_needs_compile() -> None:
    with pytest.raises(ValueError, match="add --compile"):
        Settings(model="tiny-llama", activation_memory_budget=0.5)


def _measure(**changes: object):
    s = Settings(model="tiny-llama", gpu="h100", backend="sim", seq_len=128,
                 precision="bf16-mixed", depth="trace", **changes)  # fmt: skip
    backend = Session(s).open_backend()
    with backend.session():
        return backend.measure(4)


def test_a_compiled_catalog_step_holds_fewer_activations_than_eager() -> None:
    eager, comp = _measure(), _measure(compile=True)
    assert comp.breakdown.activations < eager.breakdown.activations
    assert comp.peak_bytes < eager.peak_bytes


def test_float8_converts_the_linear_layers_torchtitan_converts() -> None:
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    from memorymark.step.catalog import CatalogStep

    step = CatalogStep(Settings(model="tiny-llama", gpu="h100", float8="tensorwise"))
    with torch.device("meta"):
        model = step.build_model()
    linear = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    converted = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert converted == {n for n in linear if not n.endswith("lm_head")}
    assert converted  # tiny-llama's projections are multiples of 16


def test_the_snippets_compile_each_block_and_convert_to_float8() -> None:
    from memorymark.reporting import snippets
    from memorymark.search.plan import TrainingPlan

    s = Settings(model="tiny-llama", gpu="h100", compile=True, float8="rowwise",
                 activation_memory_budget=0.5)  # fmt: skip
    code = snippets.snippet("torch", s, TrainingPlan(micro_batch=2, accumulation_steps=1,
                                                     target_batch=None))  # fmt: skip
    compile(code, "snippet", "exec")
    assert 'Float8LinearConfig.from_recipe_name("rowwise")' in code
    assert "torch._functorch.config.activation_memory_budget = 0.5" in code
    assert "    block.compile()" in code


def test_float8_without_torchao_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from memorymark.step import float8

    monkeypatch.setitem(sys.modules, "torchao", None)  # as if not installed
    with pytest.raises(ValueError, match=r"needs torchao: pip install 'memorymark\[float8\]'"):
        float8.convert(nn.Sequential(nn.Linear(16, 16)), "tensorwise")


def test_a_compiled_report_sets_the_eager_step_beside_it() -> None:
    from memorymark.reporting.json_form import report_to_dict
    from memorymark.reporting.markdown import report_markdown
    from memorymark.reporting.record import record_to_report, report_to_record

    settings = Settings(model="tiny-gpt2", gpu="a10", seq_len=64, max_batch=64, compile=True)
    report = Session(settings).analyze(fixes=False, plan=False)
    gap = report.compile_gap
    assert gap is not None and gap.at_batch == report.optimal.batch_size == gap.compiled_max
    assert gap.eager.batch_size == gap.at_batch
    eager = Session(settings.replace(compile=False)).measure(gap.at_batch)
    assert gap.eager.breakdown == eager.breakdown  # the eager twin, measured as it would be
    # The partitioner saves less than eager autograd: the reason leads the sentence.
    (name, before, after), *_ = gap.reasons()
    assert (name, after < before) == ("activations", True)
    assert "saved activations" in gap.verdict()
    data = report_to_dict(report)["compile_gap"]
    assert data["at_batch"] == gap.at_batch and data["reasons"][0]["category"] == "activations"
    assert "Compiled and eager" in report_markdown(report)
    assert report_to_dict(record_to_report(report_to_record(report)))["compile_gap"] == data


def test_an_eager_report_has_no_compile_gap() -> None:
    from memorymark.reporting.json_form import report_to_dict

    settings = Settings(model="tiny-gpt2", gpu="a10", seq_len=64, max_batch=16)
    report = Session(settings).analyze(fixes=False, plan=False)
    assert report.compile_gap is None and report_to_dict(report)["compile_gap"] is None


# A step compiled a second time in one process: Dynamo, re-tracing the block, reads a gradient
# attribute torch warns about (not ours, and it changes nothing counted).
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.usefixtures("any_config_path")  # a file: config in tmp_path
def test_the_simulated_compiled_step_holds_what_inductors_cpu_code_holds(tmp_path) -> None:
    # Inductor's real CPU code, its own buffers seen by the profiler (the tracker misses them),
    # against the simulated compiled step: the same bytes (benchmarks/compiled_cpu.py).
    from benchmarks.compiled_cpu import real_peak, without_dropout

    settings = Settings(
        model=without_dropout("tiny-gpt2", tmp_path), seq_len=64, attention="eager", compile=True
    )
    real, tracked = real_peak(settings.replace(backend="cpu"), 4)
    simulated = Session(settings.replace(backend="sim")).measure(4).peak_bytes
    assert tracked.peak_bytes < real  # Inductor's buffers bypass the dispatcher
    assert abs(simulated - real) <= 0.05 * real


# A step compiled a second time in one process: Dynamo, re-tracing the block, reads a gradient
# attribute torch warns about (not ours, and it changes nothing counted).
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_a_compiled_step_measured_again_holds_the_same() -> None:
    # The compiled graphs' runners hold no inputs or outputs past a call (an earlier one kept
    # the last block's saved activations alive into the next step: 5% more here). The second
    # step may differ by a few hundred bytes of optimizer bookkeeping, not by a tensor.
    settings = Settings(model="tiny-gpt2", seq_len=64, compile=True)
    with Session(settings).open_backend().session() as backend:
        first, second = backend.measure(4), backend.measure(4)
    assert abs(second.peak_bytes - first.peak_bytes) <= 1024


def test_a_memory_budget_is_measured_against_the_default_partitioner() -> None:
    from memorymark.reporting.json_form import report_to_dict

    settings = Settings(
        model="tiny-gpt2", gpu="a10", seq_len=64, max_batch=16, compile=True,
        activation_memory_budget=0.0,
    )  # fmt: skip
    report = Session(settings).analyze(fixes=False, plan=False)
    gap = report.compile_gap
    assert gap is not None and gap.full_budget is not None
    full = Session(settings.replace(activation_memory_budget=1.0)).measure(gap.at_batch)
    assert gap.full_budget.required_bytes == full.required_bytes
    assert "activation memory budget 0 saved" in gap.verdict()  # recomputing all saves memory
    data = report_to_dict(report)["compile_gap"]
    assert data["activation_memory_budget"] == 0.0 and data["full_budget_required_gb"] > 0
