"""Ready-to-paste training settings for the configuration a report found.

Three dialects: Hugging Face `TrainingArguments`, a Lightning `Trainer`, and a plain PyTorch loop.
Each is generated from the settings and the batch plan, never from hand-typed numbers, and the
test suite parses each as Python and reads the values back. No torch import: text only.
"""

from __future__ import annotations

from memorymark.plan import TrainingPlan
from memorymark.settings import Settings

FORMATS = ("hf", "lightning", "torch")

# Settings.optimizer -> TrainingArguments.optim (transformers' OptimizerNames).
_HF_OPTIM = {
    "adamw": "adamw_torch",
    "adamw-fused": "adamw_torch_fused",
    "sgd": "sgd",
    "adafactor": "adafactor",
}

_AUTOCAST_DTYPE = {"bf16-mixed": "torch.bfloat16", "16-mixed": "torch.float16"}


def snippet(fmt: str, settings: Settings, plan: TrainingPlan) -> str:
    """The code for one dialect (`hf`, `lightning` or `torch`)."""
    if fmt == "hf":
        return _hf(settings, plan)
    if fmt == "lightning":
        return _lightning(settings, plan)
    if fmt == "torch":
        return _torch(settings, plan)
    raise ValueError(f"format must be one of {', '.join(FORMATS)} (got {fmt!r})")


def _hf(settings: Settings, plan: TrainingPlan) -> str:
    lines = [
        "from transformers import TrainingArguments",
        "",
        "args = TrainingArguments(",
        '    output_dir="out",',
        f"    per_device_train_batch_size={plan.micro_batch},",
        f"    gradient_accumulation_steps={plan.accumulation_steps},",
        f"    bf16={settings.precision == 'bf16-mixed'},",
        f"    fp16={settings.precision == '16-mixed'},",
        f"    gradient_checkpointing={settings.grad_checkpointing},",
    ]
    if settings.optimizer in _HF_OPTIM:
        lines.append(f'    optim="{_HF_OPTIM[settings.optimizer]}",')
    lines.append(")")
    if settings.precision == "bf16-true":
        lines.append("# bf16-true: load the model with torch_dtype=torch.bfloat16 (no autocast)")
    return "\n".join(lines) + "\n"


def _lightning(settings: Settings, plan: TrainingPlan) -> str:
    return (
        "\n".join(
            [
                "import lightning as L",
                "from torch.utils.data import DataLoader",
                "",
                f"loader = DataLoader(dataset, batch_size={plan.micro_batch}, shuffle=True)",
                "trainer = L.Trainer(",
                f'    precision="{settings.precision}",',
                f"    accumulate_grad_batches={plan.accumulation_steps},",
                ")",
                "trainer.fit(model, loader)",
            ]
        )
        + "\n"
    )


_TORCH_OPTIMIZER = {
    "adamw": "torch.optim.AdamW(params, lr=1e-4)",
    "adamw-fused": "torch.optim.AdamW(params, lr=1e-4, fused=True)",
    "sgd": "torch.optim.SGD(params, lr=1e-3, momentum=0.9)",
    "adafactor": "transformers.optimization.Adafactor(params, lr=None)",
}


def _torch(settings: Settings, plan: TrainingPlan) -> str:
    dtype = _AUTOCAST_DTYPE.get(settings.precision)
    autocast = f'torch.autocast("cuda", dtype={dtype})' if dtype else "contextlib.nullcontext()"
    scaler = settings.precision == "16-mixed"
    lines = ["import contextlib", "", "import torch"]
    if settings.optimizer == "adafactor":
        lines.append("import transformers")
    lines += [
        "from torch.utils.data import DataLoader",
        "",
        f"loader = DataLoader(dataset, batch_size={plan.micro_batch}, shuffle=True)",
        f"accumulation_steps = {plan.accumulation_steps}",
    ]
    if settings.precision == "bf16-true":
        lines.append("model = model.to(torch.bfloat16)")
    if settings.grad_checkpointing:
        lines.append("model.gradient_checkpointing_enable()")
    lines.append("params = [p for p in model.parameters() if p.requires_grad]")
    lines.append(f"optimizer = {_TORCH_OPTIMIZER.get(settings.optimizer, 'None')}")
    if scaler:
        lines.append('scaler = torch.amp.GradScaler("cuda")')
    lines += [
        "model.train()",
        "for i, batch in enumerate(loader):",
        f"    with {autocast}:",
        "        loss = model(**batch).loss / accumulation_steps",
        "    scaler.scale(loss).backward()" if scaler else "    loss.backward()",
        "    if (i + 1) % accumulation_steps == 0:",
        "        scaler.step(optimizer)" if scaler else "        optimizer.step()",
    ]
    if scaler:
        lines.append("        scaler.update()")
    lines.append("        optimizer.zero_grad(set_to_none=True)")
    return "\n".join(lines) + "\n"
