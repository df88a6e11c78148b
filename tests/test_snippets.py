"""Ready-to-paste snippets parse as Python and carry the report's numbers."""

import ast

import pytest

from memorymark.plan import TrainingPlan
from memorymark.settings import Settings
from memorymark.snippets import FORMATS, snippet


def keywords(code: str, call: str) -> dict:
    """Literal keyword arguments of the first call to `call` in `code`."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name == call:
                return {
                    k.arg: ast.literal_eval(k.value)
                    for k in node.keywords
                    if isinstance(k.value, ast.Constant)
                }
    raise AssertionError(f"no call to {call}")


def assigned(code: str, name: str):
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Assign) and node.targets[0].id == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"no assignment to {name}")


PLAN = TrainingPlan(micro_batch=128, accumulation_steps=2, target_batch=256)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed", "bf16-true"])
def test_every_snippet_parses(fmt, precision):
    ast.parse(snippet(fmt, Settings(precision=precision, grad_checkpointing=True), PLAN))


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


def test_lightning_trainer_matches_the_plan():
    code = snippet("lightning", Settings(precision="16-mixed"), PLAN)
    assert keywords(code, "Trainer") == {"precision": "16-mixed", "accumulate_grad_batches": 2}
    assert keywords(code, "DataLoader")["batch_size"] == 128


def test_plain_torch_loop_matches_the_plan_and_scales_fp16():
    code = snippet("torch", Settings(precision="16-mixed"), PLAN)
    assert assigned(code, "accumulation_steps") == 2
    assert keywords(code, "DataLoader")["batch_size"] == 128
    assert "scaler.scale(loss).backward()" in code
    assert "GradScaler" not in snippet("torch", Settings(), PLAN)


def test_unknown_format():
    with pytest.raises(ValueError, match="format must be one of hf, lightning, torch"):
        snippet("keras", Settings(), PLAN)
