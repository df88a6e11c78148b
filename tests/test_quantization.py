"""Quantized base weights (QLoRA, LLM.int8()) and bitsandbytes' optimizers in the simulated step:
the storage bitsandbytes keeps, the temporaries its kernels make, peft's k-bit preparation, the
8-bit and paged optimizer state, and the fit rule for paged state."""

import json

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from memorymark import cuda_rules
from memorymark.accounting.tracker import MemoryTracker
from memorymark.backends.sim import to_fake
from memorymark.cuda_rules import bnb_gemm
from memorymark.engine import Session
from memorymark.measurement import Category
from memorymark.settings import Settings
from memorymark.step import paging, quantization
from memorymark.step.catalog import CatalogStep

HIDDEN, FFN, VOCAB, LAYERS = 128, 256, 1000, 2
# Linear weights per layer: q, o (128x128), k, v (64x128: 2 of 4 heads), gate, up, down.
LINEAR_SHAPES = [(128, 128), (64, 128), (64, 128), (128, 128), (256, 128), (256, 128), (128, 256)]


@pytest.fixture
def tiny_llama(tmp_path, any_config_path):
    """A 2-layer Llama whose embedding and head (128k values each) are paged by bitsandbytes."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": HIDDEN,
                "intermediate_size": FFN,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_hidden_layers": LAYERS,
                "vocab_size": VOCAB,
                "max_position_embeddings": 4096,
                "tie_word_embeddings": False,
            }
        )
    )
    return f"file:{path}"


def qlora(model: str, **changes) -> Settings:
    base = dict(
        model=model,
        backend="sim",
        gpu="A10",
        precision="bf16-mixed",
        seq_len=16,
        lora_rank=4,
        quantization="nf4",
    )
    return Settings(**(base | changes))


def build(settings: Settings) -> torch.nn.Module:
    with torch.device("meta"):
        return CatalogStep(settings).build_model()


def quantized_layers(model):
    four, eight = quantization.quantized_classes()
    return [m for m in model.modules() if isinstance(m, (four, eight))]


# -- storage ---------------------------------------------------------------------------------
def test_nf4_stores_packed_bytes_and_an_fp32_absmax_per_64_weights(tiny_llama):
    layers = quantized_layers(build(qlora(tiny_llama)))
    assert len(layers) == 7 * LAYERS  # every linear but lm_head
    for layer in layers:
        out_f, in_f = layer._shape
        assert layer.weight.dtype == torch.uint8
        assert layer.weight.shape == ((out_f * in_f + 1) // 2, 1)
        assert (layer.absmax.dtype, layer.absmax.numel()) == (torch.float32, out_f * in_f // 64)
        assert not layer.weight.requires_grad
    assert sorted(tuple(m._shape) for m in layers[:7]) == sorted(LINEAR_SHAPES)


def test_double_quant_stores_the_absmax_in_8_bits_with_fp32_stats_per_256(tiny_llama):
    layer = quantized_layers(build(qlora(tiny_llama, double_quant=True)))[0]
    blocks = layer._shape[0] * layer._shape[1] // 64
    assert (layer.absmax.dtype, layer.absmax.numel()) == (torch.uint8, blocks)
    assert (layer.absmax2.dtype, layer.absmax2.numel()) == (torch.float32, -(-blocks // 256))
    assert layer.code2.numel() == 256 and layer.offset.dtype == torch.float32


def test_int8_stores_int8_weights_and_one_fp32_scale_per_row(tiny_llama):
    layer = quantized_layers(build(qlora(tiny_llama, quantization="int8")))[0]
    assert layer.weight.dtype == torch.int8
    assert (layer.SCB.dtype, layer.SCB.numel()) == (torch.float32, layer.weight.shape[0])


def test_the_model_is_prepared_as_peft_prepares_k_bit_models(tiny_llama):
    # bf16-true converts everything first; prepare_model_for_kbit_training casts what is not
    # quantized back to fp32, and only the adapters train.
    model = build(qlora(tiny_llama, precision="bf16-true"))
    float_params = {p.dtype for p in model.parameters() if p.is_floating_point()}
    assert float_params == {torch.float32}
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    four_bit, _ = quantization.quantized_classes()
    assert not isinstance(model.get_submodule("base_model.model.lm_head"), four_bit)


def test_quantized_weight_bytes_are_what_bitsandbytes_stores(tiny_llama):
    m = Session(qlora(tiny_llama, double_quant=True)).measure(1)
    per_layer = sum(
        quantization.quantized_weight_bytes(o, i, "nf4", nested=True) for o, i in LINEAR_SHAPES
    )
    shared_code = 256 * 4  # the double-quant code, one tensor for every layer
    assert m.fits and not m.measured
    assert m.quantized_weight_bytes == LAYERS * per_layer + shared_code
    assert m.quantized_weight_bytes <= m.breakdown.parameters
    assert m.to_dict()["quantized_weight_bytes"] == m.quantized_weight_bytes


def test_int8_weight_bytes_are_a_byte_per_weight_and_a_scale_per_row(tiny_llama):
    m = Session(qlora(tiny_llama, quantization="int8")).measure(1)
    per_layer = sum(
        quantization.quantized_weight_bytes(o, i, "int8", False) for o, i in LINEAR_SHAPES
    )
    assert m.quantized_weight_bytes == LAYERS * per_layer


# -- kernels' temporaries ---------------------------------------------------------------------
def test_cuda_dequantizes_the_whole_weight_past_1536_rows():
    def nothing(*args):
        return []

    small = torch.empty(1, 1536, 64, dtype=torch.float32, device="meta")
    large = torch.empty(1, 1537, 64, dtype=torch.float32, device="meta")
    absmax = torch.empty(8, dtype=torch.uint8, device="meta")
    bf16 = torch.bfloat16
    assert bnb_gemm.dequantized_scratch(nothing, small, bf16, (32, 64), absmax) == []
    scratch = bnb_gemm.dequantized_scratch(nothing, large, bf16, (32, 64), absmax)
    assert [(t.shape, t.dtype) for t in scratch] == [
        (torch.Size([8]), torch.float32),
        (torch.Size([32, 64]), torch.bfloat16),
    ]


def one_layer_peak(rows: int, nested: bool = False) -> int:
    """Peak bytes of one 4-bit 128->256 layer's forward over `rows` rows, as on an A10."""
    four_bit, _ = quantization.quantized_classes()
    with torch.device("meta"):
        linear = torch.nn.Linear(128, 256, bias=False, dtype=torch.bfloat16)
        layer = four_bit(linear, "nf4", nested, torch.bfloat16)
    mode = FakeTensorMode()
    to_fake(layer, mode)
    with mode:
        x = torch.empty(1, rows, 128, dtype=torch.bfloat16)
    tracker = MemoryTracker()
    tracker.track_all([*layer.parameters(), *layer.buffers()], Category.PARAMETERS)
    weights = tracker.live_bytes
    with mode, cuda_rules.applied((8, 6)), tracker:
        layer(x)
    return tracker.peak_bytes - weights


@pytest.mark.parametrize("nested", [False, True])
def test_a_long_input_holds_the_dequantized_weight_beside_the_output(nested):
    output = 256 * 2  # bf16 bytes per row
    assert one_layer_peak(1536, nested) == 1536 * output
    absmax = 128 * 256 // 64 * 4 if nested else 0  # dequantized to fp32 first
    assert one_layer_peak(2048, nested) == 2048 * output + 256 * 128 * 2 + absmax


def test_the_fused_4bit_and_int8_matmuls_count_their_flops():
    from memorymark.accounting.throughput import Roofline, WorkCounter
    from memorymark.gpus import find_gpu

    four_bit, eight_bit = quantization.quantized_classes()
    for make, dtype in ((lambda lin: four_bit(lin, "nf4", True, torch.bfloat16), torch.bfloat16),
                        (eight_bit, torch.float16)):  # fmt: skip
        with torch.device("meta"):
            layer = make(torch.nn.Linear(128, 256, bias=False, dtype=dtype))
        mode = FakeTensorMode()
        to_fake(layer, mode)
        with mode:
            x = torch.empty(1, 100, 128, dtype=dtype)
        tracker = MemoryTracker()
        tracker.work_counter = WorkCounter(Roofline.for_gpu(find_gpu("A10")))
        with mode, cuda_rules.applied((8, 6)), tracker:
            layer(x)
        assert tracker.work_counter.flops == 2 * 100 * 128 * 256  # as a dense mm


# -- optimizers ------------------------------------------------------------------------------
def full_finetune(model: str, optimizer: str) -> Settings:
    return Settings(model=model, backend="sim", gpu="A10", seq_len=16, optimizer=optimizer)


def param_numels(model: str) -> list[int]:
    with torch.device("meta"):
        built = CatalogStep(full_finetune(model, "adamw")).build_model()
    return [p.numel() for p in built.parameters()]


def test_adamw_8bit_keeps_a_byte_per_value_above_4096_and_fp32_below(tiny_llama):
    m = Session(full_finetune(tiny_llama, "adamw-8bit")).measure(1)
    expected = 2 * 256 * 4  # the two 256-value quantization maps, shared
    for n in param_numels(tiny_llama):
        # bitsandbytes optim/optimizer.py: uint8 state + an fp32 absmax per 256 values per
        # moment from min_8bit_size=4096 values, fp32 moments below.
        expected += 2 * n + 2 * 4 * -(-n // 256) if n >= 4096 else 2 * 4 * n
    assert m.breakdown.optimizer_state == expected
    assert m.paged_bytes is None and m.pages_to_host is None


def test_paged_state_is_outside_the_peak_and_reported_on_its_own(tiny_llama):
    m = Session(full_finetune(tiny_llama, "paged_adamw_32bit")).measure(1)
    numels = param_numels(tiny_llama)
    paged = [n for n in numels if n >= 100_000]
    assert len(paged) == 2  # the embedding and the head
    assert m.paged_bytes == 2 * 4 * sum(paged)
    assert m.breakdown.optimizer_state == 2 * 4 * sum(n for n in numels if n < 100_000)
    assert m.pages_to_host is False  # a few MiB beside the step on an A10


def test_lion_keeps_one_state():
    adamw = Session(full_finetune("tiny-gpt2", "adamw-8bit")).measure(1)
    lion = Session(full_finetune("tiny-gpt2", "lion-8bit")).measure(1)
    assert lion.breakdown.optimizer_state < adamw.breakdown.optimizer_state


def test_paged_state_pages_to_host_only_past_the_capacity():
    assert not paging.pages_to_host(10, 5, 15)
    assert paging.pages_to_host(10, 6, 15)
    assert not paging.pages_to_host(10, 0, 5)
    assert "pages to host" in paging.note(2**30, True)


# -- settings --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"quantization": "nf4"}, "training them needs LoRA"),
        ({"quantization": "int8", "lora_rank": 4, "double_quant": True}, "double_quant needs"),
        ({"double_quant": True}, "double_quant needs"),
        ({"quantization": "nf2", "lora_rank": 4}, "quantization must be one of none, nf4"),
    ],
)
def test_bad_quantization_settings_are_one_line(changes, message):
    with pytest.raises(ValueError, match=message):
        Settings(**({"model": "tiny-gpt2"} | changes))


@pytest.mark.parametrize(
    ("trainer_name", "ours"),
    [
        ("adamw_bnb_8bit", "adamw-8bit"),
        ("paged_adamw_8bit", "paged-adamw-8bit"),
        ("paged_adamw_32bit", "paged-adamw-32bit"),
        ("lion_8bit", "lion-8bit"),
    ],
)
def test_trainer_optim_names_are_accepted(trainer_name, ours):
    settings = Settings(optimizer=trainer_name)
    assert settings.workload.optimizer == ours
    assert settings.workload.paged_optimizer == ours.startswith("paged")


def test_the_command_line_round_trips_quantization():
    settings = qlora("tiny-gpt2", double_quant=True, optimizer="paged-adamw-8bit")
    line = settings.to_command_line()
    assert "--quantization nf4" in line and "--double-quant" in line
    assert Settings.from_query(settings.to_query()) == settings


# -- end to end ------------------------------------------------------------------------------
def test_the_cli_measures_qlora_with_a_paged_optimizer(capsys):
    from memorymark.cli.parser import main

    argv = ["measure", "tiny-gpt2", "--batch-size", "2", "--backend", "sim", "--gpu", "A10"]
    argv += ["--quantization", "nf4", "--double-quant", "--lora-rank", "4"]
    assert main([*argv, "--optimizer", "paged_adamw_8bit", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["quantized_weight_bytes"] > 0
    assert record["paged_bytes"] == 0  # LoRA's adapters are far below bitsandbytes' 1e5 values
    assert record["pages_to_host"] is False
    assert main(argv) == 0
    assert "quantized weights" in capsys.readouterr().out


def test_the_cli_refuses_quantization_without_lora_in_one_line(capsys):
    from memorymark.cli.parser import main

    assert main(["measure", "tiny-gpt2", "--batch-size", "1", "--quantization", "int8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs LoRA" in err and "\n" not in err


# peft reads transformers' deprecated is_gradient_checkpointing (as in test_snippets.py).
@pytest.mark.filterwarnings("ignore:`(is_)?gradient_checkpointing.*deprecated:FutureWarning")
def test_the_snippets_load_the_measured_quantization_and_optimizer():
    from memorymark.reporting.snippets import snippet
    from memorymark.search.plan import TrainingPlan

    settings = qlora("tiny-gpt2", double_quant=True, optimizer="paged-adamw-8bit")
    plan = TrainingPlan(micro_batch=1, accumulation_steps=1, target_batch=1)
    hf = snippet("hf", settings, plan)
    assert 'bnb_4bit_quant_type="nf4"' in hf and "bnb_4bit_use_double_quant=True" in hf
    assert "bnb_4bit_compute_dtype=torch.bfloat16" in hf
    assert "prepare_model_for_kbit_training(model" in hf
    assert 'optim="paged_adamw_8bit"' in hf
    assert "bnb.optim.PagedAdamW8bit(params" in snippet("torch", settings, plan)
    # The HF code up to TrainingArguments runs: its BitsAndBytesConfig and peft calls are real.
    names: dict = {"model": build(Settings(model="tiny-gpt2"))}
    exec(compile(hf.split("\nargs = ")[0], "<snippet>", "exec"), names)
    assert names["bnb_config"].bnb_4bit_use_double_quant
    assert names["bnb_config"].load_in_4bit


def test_no_paged_state_says_why_rather_than_zero_gib():
    # Reported: "Paged optimizer state 0.00 GiB" under a QLoRA answer (LoRA's buffers are small).
    assert "0.00 GiB" not in paging.note(0, False)
    assert paging.note(0, False).startswith("no optimizer state is paged: bitsandbytes pages only")
    assert "0.00" not in paging.note(3 * 2**20, False)  # a few MiB shows as such, not 0.00
