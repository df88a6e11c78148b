"""Ready-to-paste snippets parse as Python, carry every measured setting, and build for real:
the Hugging Face arguments, Trainer and peft config are constructed from the text, and the
PyTorch loop trains a tiny BERT on CPU. Lightning is not installed here, so its code is parsed."""

import ast
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model

from memorymark.reporting.snippets import SNIPPET_FORMATS, snippet
from memorymark.search.plan import TrainingPlan
from memorymark.settings import Settings
from memorymark.settings.choices import OPTIMIZERS, PRECISIONS
from memorymark.step.catalog import CatalogStep

# The snippets use the checkpointing names every supported transformers (4.46 to 5.x) reads;
# transformers 5 deprecates them for activation_checkpointing*, and peft reads the old property.
OLD_CHECKPOINTING_NAMES = "ignore:`(is_)?gradient_checkpointing.*deprecated:FutureWarning"


def calls(code: str, name: str) -> list[ast.Call]:
    """Every call to `name` (a function or a method) in `code`, in source order."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called == name:
                found.append(node)
    return sorted(found, key=lambda node: (node.lineno, node.col_offset))


def keywords(code: str, call: str) -> dict:
    """Literal keyword arguments of the first call to `call` in `code`."""
    found = calls(code, call)
    if not found:
        raise AssertionError(f"no call to {call}")
    return {
        k.arg: ast.literal_eval(k.value)
        for k in found[0].keywords
        if isinstance(k.value, (ast.Constant, ast.List, ast.Dict))
    }


def assigned(code: str, name: str):
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"no assignment to {name}")


def statement(code: str, name: str) -> str:
    """The source of the top-level statement that assigns `name`."""
    for node in ast.parse(code).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return ast.get_source_segment(code, node)
    raise AssertionError(f"no assignment to {name}")


def run(code: str, **names) -> dict:
    """Execute a snippet with the user's `model` and `dataset` given; its names afterwards."""
    namespace = dict(names)
    exec(compile(code, "<snippet>", "exec"), namespace)
    return namespace


PLAN = TrainingPlan(micro_batch=128, accumulation_steps=2, target_batch=256)
TINY = Settings(model="tiny-bert", seq_len=8)
# 2 micro-batches of 2, then one optimizer step
TINY_PLAN = TrainingPlan(micro_batch=2, accumulation_steps=2, target_batch=4)


def tiny_model() -> torch.nn.Module:
    """A plain 2-layer BERT classifier, as a user would load it: no LoRA, no checkpointing."""
    return CatalogStep(TINY).build_model()


def tiny_dataset() -> list[dict[str, torch.Tensor]]:
    return [{"input_ids": torch.zeros(8, dtype=torch.long), "labels": torch.tensor(0)}] * 4


# -- every dialect -------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", SNIPPET_FORMATS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_snippet_parses(fmt, precision):
    ast.parse(snippet(fmt, Settings(precision=precision, grad_checkpointing=True), PLAN))


@pytest.mark.parametrize("fmt", SNIPPET_FORMATS)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_optimizer_parses_with_lora_and_clipping(fmt, optimizer):
    settings = Settings(optimizer=optimizer, lora_rank=8, max_grad_norm=1.0)
    ast.parse(snippet(fmt, settings, PLAN))


@pytest.mark.parametrize("fmt", SNIPPET_FORMATS)
def test_every_dialect_builds_the_same_lora_config(fmt):
    code = snippet(fmt, Settings(model="gpt2", lora_rank=8), PLAN)
    assert keywords(code, "LoraConfig") == {
        "r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "target_modules": ["c_attn"],  # peft's default for gpt2, written out
        "task_type": "CAUSAL_LM",
        "fan_in_fan_out": True,  # GPT-2's Conv1D projections
    }
    assert len(calls(code, "get_peft_model")) == 1


@pytest.mark.parametrize("fmt", SNIPPET_FORMATS)
def test_no_lora_no_peft(fmt):
    assert "peft" not in snippet(fmt, Settings(), PLAN)


@pytest.mark.filterwarnings(OLD_CHECKPOINTING_NAMES)
@pytest.mark.parametrize(
    "settings",
    [
        Settings(model="tiny-bert", seq_len=8, lora_rank=4),
        Settings(model="tiny-gpt2", seq_len=8, lora_rank=2, lora_targets="c_attn, c_proj"),
        Settings(model="tiny-resnet", image_size=32, lora_rank=4),
    ],
    ids=["bert-default-targets", "gpt2-named-targets", "resnet-image-head"],
)
def test_the_snippets_lora_model_is_the_one_memorymark_measured(settings):
    code = snippet("torch", settings, PLAN)
    lora_config = run(statement(code, "lora_config"), LoraConfig=LoraConfig)["lora_config"]
    assert lora_config.r == settings.workload.lora_rank
    pasted = get_peft_model(CatalogStep(replace(settings, lora_rank=0)).build_model(), lora_config)
    measured = CatalogStep(settings).build_model()
    fields = ("target_modules", "lora_alpha", "lora_dropout", "task_type", "fan_in_fan_out")
    fields += ("modules_to_save",)  # as peft fills it in: the task's head, or ours
    pasted_config, measured_config = pasted.peft_config["default"], measured.peft_config["default"]
    for field in fields:
        assert getattr(pasted_config, field) == getattr(measured_config, field), field
    # The same weights train: adapters, and the head peft keeps trainable.
    assert trainable(pasted) == trainable(measured)


def trainable(model: torch.nn.Module) -> dict[str, int]:
    return {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}


def test_importing_the_snippets_loads_no_torch():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, memorymark.reporting.snippets; print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        check=True,
    )
    assert out.stdout.strip() == "False"


# -- Hugging Face ----------------------------------------------------------------------------------
def test_hf_training_arguments_match_the_plan():
    code = snippet("hf", Settings(precision="bf16-mixed", grad_checkpointing=True), PLAN)
    kw = keywords(code, "TrainingArguments")
    assert kw["per_device_train_batch_size"] == 128
    assert kw["gradient_accumulation_steps"] == 2
    assert (kw["bf16"], kw["fp16"], kw["gradient_checkpointing"]) == (True, False, True)
    assert kw["optim"] == "adamw_torch"
    assert (
        keywords(snippet("hf", Settings(optimizer="adafactor"), PLAN), "TrainingArguments")["optim"]
        == "adafactor"
    )


@pytest.mark.filterwarnings(OLD_CHECKPOINTING_NAMES)
@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            Settings(precision="bf16-mixed", grad_checkpointing=True),
            dict(bf16=True, fp16=False, gradient_checkpointing=True, optim="adamw_torch",
                 max_grad_norm=0.0),
        ),
        (
            Settings(precision="16-mixed", optimizer="adamw-fused", max_grad_norm=0.5),
            dict(bf16=False, fp16=True, gradient_checkpointing=False, optim="adamw_torch_fused",
                 max_grad_norm=0.5),
        ),
        (
            Settings(precision="bf16-true", optimizer="adafactor", max_grad_norm=2.0),
            dict(bf16=False, fp16=False, gradient_checkpointing=False, optim="adafactor",
                 max_grad_norm=2.0),
        ),
    ],
    ids=["bf16-mixed", "16-mixed", "bf16-true"],
)  # fmt: skip
def test_hf_training_arguments_build_for_real(settings, expected, monkeypatch, tmp_path):
    # TrainingArguments refuses bf16 without a bf16 GPU (see the next test); the snippet is for
    # a GPU machine, so this test gives transformers' capability check the GPU's answer.
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.chdir(tmp_path)
    code = snippet("hf", settings, PLAN)
    args = run(statement(code, "args"), TrainingArguments=transformers.TrainingArguments)["args"]
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (128, 2)
    assert {name: getattr(args, name) for name in expected} == expected
    if settings.workload.grad_checkpointing:
        assert args.gradient_checkpointing_kwargs == {"use_reentrant": False}  # as measured


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what transformers says on CPU")
def test_hf_bf16_arguments_need_a_bf16_gpu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = snippet("hf", Settings(precision="bf16-mixed"), PLAN)
    with pytest.raises(ValueError, match="Your setup doesn't support bf16/gpu"):
        run(statement(code, "args"), TrainingArguments=transformers.TrainingArguments)


def test_hf_without_clipping_turns_off_trainers_default_clip():
    assert transformers.TrainingArguments.max_grad_norm == 1.0  # Trainer's default: clip at 1.0
    kw = keywords(snippet("hf", Settings(max_grad_norm=None), PLAN), "TrainingArguments")
    assert kw["max_grad_norm"] == 0.0  # Trainer clips only when max_grad_norm > 0


@pytest.mark.filterwarnings(OLD_CHECKPOINTING_NAMES)
@pytest.mark.parametrize(
    ("optimizer", "optim", "cls", "defaults"),
    [
        ("adamw", "adamw_torch", None, {}),
        ("adamw-fused", "adamw_torch_fused", None, {}),
        ("adafactor", "adafactor", None, {}),
        ("adamw-forloop", None, torch.optim.AdamW, {"foreach": False}),
        ("sgd", None, torch.optim.SGD, {"momentum": 0.9, "foreach": None}),
        ("sgd-forloop", None, torch.optim.SGD, {"momentum": 0.9, "foreach": False}),
    ],
)
def test_hf_trainer_gets_the_measured_optimizer(
    optimizer, optim, cls, defaults, monkeypatch, tmp_path
):
    # A real Trainer on the real LoRA model, built from the snippet; only train() is skipped.
    trained = []
    monkeypatch.setattr(transformers.Trainer, "train", lambda self: trained.append(self))
    monkeypatch.chdir(tmp_path)
    settings = Settings(
        model="tiny-bert", seq_len=8, lora_rank=4, grad_checkpointing=True, optimizer=optimizer
    )
    names = run(snippet("hf", settings, TINY_PLAN), model=tiny_model(), dataset=tiny_dataset())
    trainer = names["trainer"]
    assert trained == [trainer]
    assert isinstance(trainer.model, PeftModel)
    assert trainer.model.peft_config["default"].r == 4
    assert trainer.args.gradient_checkpointing
    if optim is not None:
        assert (trainer.args.optim, trainer.optimizer) == (optim, None)  # Trainer builds it
    else:
        assert type(trainer.optimizer) is cls
        assert {k: trainer.optimizer.defaults[k] for k in defaults} == defaults
        trainable = {id(p) for p in trainer.model.parameters() if p.requires_grad}
        assert {id(p) for p in trainer.optimizer.param_groups[0]["params"]} == trainable


def test_hf_says_when_the_measured_step_had_no_optimizer():
    code = snippet("hf", Settings().with_protocol("inference-style"), PLAN)
    assert "# The measured step had no optimizer (inference-style)" in code
    assert "optim" not in keywords(code, "TrainingArguments")


def test_hf_bf16_true_converts_the_weights():
    code = snippet("hf", Settings(precision="bf16-true"), PLAN)
    assert "model = model.to(torch.bfloat16)" in code
    assert code.startswith("import torch\n")
    kw = keywords(code, "TrainingArguments")
    assert (kw["bf16"], kw["fp16"]) == (False, False)  # no autocast on top of bf16 weights


# -- Lightning -----------------------------------------------------------------------------------
def test_lightning_trainer_matches_the_plan():
    code = snippet("lightning", Settings(precision="16-mixed"), PLAN)
    assert keywords(code, "Trainer") == {"precision": "16-mixed", "accumulate_grad_batches": 2}
    assert keywords(code, "DataLoader")["batch_size"] == 128


def test_lightning_carries_clipping_lora_checkpointing_and_the_optimizer():
    settings = Settings(
        precision="bf16-true",
        optimizer="adamw-forloop",
        grad_checkpointing=True,
        lora_rank=16,
        max_grad_norm=0.5,
    )
    code = snippet("lightning", settings, PLAN)
    assert keywords(code, "Trainer") == {
        "precision": "bf16-true",
        "accumulate_grad_batches": 2,
        "gradient_clip_val": 0.5,
    }
    assert keywords(code, "LoraConfig")["r"] == 16
    assert keywords(code, "gradient_checkpointing_enable") == {
        "gradient_checkpointing_kwargs": {"use_reentrant": False}
    }
    assert keywords(code, "AdamW") == {"lr": 1e-4, "foreach": False}
    assert "bfloat16" not in code  # precision="bf16-true" converts the weights itself


def test_lightning_without_an_optimizer_returns_none():
    code = snippet("lightning", Settings(optimizer="none"), PLAN)
    assert "        return None" in code
    assert "torch.optim" not in code


# -- plain PyTorch ---------------------------------------------------------------------------------
def test_plain_torch_loop_matches_the_plan_and_scales_fp16():
    code = snippet("torch", Settings(precision="16-mixed"), PLAN)
    assert assigned(code, "accumulation_steps") == 2
    assert keywords(code, "DataLoader")["batch_size"] == 128
    assert "scaler.scale(loss).backward()" in code
    assert "GradScaler" not in snippet("torch", Settings(), PLAN)


def test_plain_torch_loop_unscales_before_it_clips():
    code = snippet("torch", Settings(precision="16-mixed", max_grad_norm=1.0), PLAN)
    lines = code.splitlines()
    order = [
        next(i for i, line in enumerate(lines) if line.strip().startswith(prefix))
        for prefix in (
            "scaler.unscale_(optimizer)",
            "torch.nn.utils.clip_grad_norm_",
            "scaler.step",
        )
    ]
    assert order == sorted(order)
    assert "clip_grad_norm_" not in snippet("torch", Settings(precision="16-mixed"), PLAN)


@pytest.mark.filterwarnings(OLD_CHECKPOINTING_NAMES)
@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-true"])
def test_plain_torch_loop_trains_a_tiny_bert(precision, monkeypatch):
    clipped = []
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(
        torch.nn.utils,
        "clip_grad_norm_",
        lambda params, max_norm, **kw: clipped.append(max_norm) or clip(params, max_norm, **kw),
    )
    settings = Settings(
        model="tiny-bert",
        seq_len=8,
        precision=precision,
        grad_checkpointing=True,
        lora_rank=4,
        max_grad_norm=0.5,
    )
    # The snippet is for CUDA; the only change to run it here is the device.
    code = snippet("torch", settings, TINY_PLAN).replace('device = "cuda"', 'device = "cpu"')
    model, forwards = tiny_model(), []
    model.register_forward_hook(lambda *_: forwards.append(1))
    names = run(code, model=model, dataset=tiny_dataset())
    peft_model, optimizer = names["model"], names["optimizer"]
    assert len(forwards) == 2  # two micro-batches ...
    assert [int(s["step"]) for s in optimizer.state.values()] == [1] * len(optimizer.state)
    assert clipped == [0.5]  # ... one clipped optimizer step
    assert isinstance(peft_model, PeftModel)
    assert peft_model.peft_config["default"].r == 4
    assert any(getattr(m, "gradient_checkpointing", False) is True for m in peft_model.modules())
    assert all(p.grad is None for p in peft_model.parameters())  # zero_grad(set_to_none=True)
    word_embeddings = peft_model.base_model.model.bert.embeddings.word_embeddings.weight
    assert word_embeddings.dtype == (torch.bfloat16 if precision == "bf16-true" else torch.float32)


def test_plain_torch_loop_without_an_optimizer_only_frees_gradients():
    code = snippet("torch", Settings().with_protocol("inference-style"), PLAN)
    assert "optimizer" not in code.replace("# The measured step had no optimizer", "")
    assert "model.eval()" in code
    assert "model(**batch).logits.mean()" in code  # the loss inference-style tools use
    assert "        model.zero_grad(set_to_none=True)" in code


def test_unknown_format():
    with pytest.raises(ValueError, match="format must be one of hf, lightning, torch"):
        snippet("keras", Settings(), PLAN)


@pytest.mark.parametrize("fmt", SNIPPET_FORMATS)
@pytest.mark.parametrize("dist", ["ddp", "zero1", "fsdp", "fsdp-no-reshard", "hsdp"])
def test_every_distributed_strategy_parses_and_says_how_to_launch(fmt, dist):
    s = Settings(model="gpt2", precision="bf16-mixed", dist=dist, gpus="16")
    code = snippet(fmt, s, TrainingPlan(micro_batch=4, accumulation_steps=1, target_batch=None))
    ast.parse(code)
    if fmt == "torch":
        assert "torchrun --nnodes 2 --nproc-per-node 8" in code
        assert "DistributedSampler(dataset)" in code
    if fmt == "torch" and dist in ("fsdp", "hsdp"):
        mesh = "(2, 8)" if dist == "hsdp" else "(16,)"
        assert f'init_device_mesh("cuda", {mesh})' in code
        assert "reduce_dtype=torch.float32" in code and "fully_shard(model, mesh=mesh" in code
    if dist == "zero1" and fmt != "hf":
        assert "ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW" in code
    if fmt == "hf" and dist.startswith("fsdp"):
        assert '"fsdp_version": 2' in code


# -- checkpointing modes ---------------------------------------------------------------------------
@pytest.mark.filterwarnings(OLD_CHECKPOINTING_NAMES)
@pytest.mark.parametrize(
    ("mode", "checkpointed"),
    [("full", [True, True]), ("layers:2", [False, True]), ("selective-op", [True, True])],
)
def test_plain_torch_loop_checkpoints_the_blocks_measured(mode, checkpointed):
    settings = Settings(model="tiny-bert", seq_len=8, checkpointing=mode)
    code = snippet("torch", settings, TINY_PLAN).replace('device = "cuda"', 'device = "cpu"')
    names = run(code, model=tiny_model(), dataset=tiny_dataset())
    # The blocks the snippet checkpoints are the ones the measured model did.
    measured = CatalogStep(settings).build_model()
    assert [layer.gradient_checkpointing for layer in names["model"].bert.encoder.layer] == [
        layer.gradient_checkpointing for layer in measured.bert.encoder.layer
    ] == checkpointed  # fmt: skip


def test_the_selective_op_snippet_runs_the_measured_policy():
    from torch.utils.checkpoint import CheckpointPolicy

    from memorymark.step import checkpointing

    code = snippet("torch", Settings(model="tiny-llama", checkpointing="selective-op"), PLAN)
    kw = calls(code, "gradient_checkpointing_enable")[0].keywords[0].value
    assert ast.unparse(kw) == "{'use_reentrant': False, 'context_fn': selective_op_context}"
    policy_code = code[: code.index("model.gradient_checkpointing_enable(")]
    policy_code = policy_code[policy_code.index("MATMULS") :]
    names = run(
        policy_code,
        torch=torch,
        CheckpointPolicy=CheckpointPolicy,
        create_selective_checkpoint_contexts=lambda policy: policy,
    )
    assert names["SAVED"] == checkpointing._ops(checkpointing.SAVED_OPS)
    snippet_policy, ours = names["selective_op_context"](), checkpointing._selective_op_policy()
    forward = type("Ctx", (), {"is_recompute": False})()
    aten = torch.ops.aten
    ops = [aten.mm.default, aten.mm.default, aten.addmm.default, aten.relu.default,
           aten._scaled_dot_product_efficient_attention.default]  # fmt: skip
    assert [snippet_policy(forward, op) for op in ops] == [ours(forward, op) for op in ops]


def test_hf_sets_the_selective_modes_on_the_model_not_in_its_arguments():
    for mode in ("selective-op", "layers:3"):
        code = snippet("hf", Settings(model="tiny-llama", checkpointing=mode), PLAN)
        assert "gradient_checkpointing" not in keywords(code, "TrainingArguments")
        assert calls(code, "gradient_checkpointing_enable")
        ast.parse(code)
    assert "% 3 == 0" in snippet("lightning", Settings(checkpointing="layers:3"), PLAN)
