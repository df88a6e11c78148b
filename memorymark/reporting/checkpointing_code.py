"""The snippets' activation checkpointing: the code that turns on the mode measured.

full is the model's own switch; selective-op passes torchtitan's op policy as the checkpoint's
`context_fn` (PyTorch's `create_selective_checkpoint_contexts`), written from the same op list
memorymark/step/checkpointing.py runs; layers:K turns the switch off again in the blocks
torchtitan leaves alone (transformers' own `every_n_layers` counts from block 0, not from the
K-th: the memory would differ). Text only: must not import torch.
"""

from __future__ import annotations

from memorymark.step.checkpointing import MATMUL_OPS, SAVED_OPS

KWARGS = '{"use_reentrant": False}'  # non-reentrant, as memorymark/step/checkpointing.py runs it
_SELECTIVE_KWARGS = '{"use_reentrant": False, "context_fn": selective_op_context}'


def trainer_arguments(mode: str) -> list[str]:
    """TrainingArguments lines for `mode`: Trainer's own switch for full checkpointing; the
    other modes are turned on on the model before Trainer (`model_code`), as its arguments
    cannot carry a policy function (they are saved as JSON) or a block pattern."""
    if mode != "full":
        return []
    # Newer transformers call both activation_checkpointing*; the old names, which every
    # supported version reads, work until v6.
    return ["    gradient_checkpointing=True,", f"    gradient_checkpointing_kwargs={KWARGS},"]


def model_code(mode: str, trainer: bool) -> list[str]:
    """Lines that turn on checkpointing `mode` on `model` (none with `trainer` for full: the
    Trainer's arguments do it)."""
    if mode == "none" or (trainer and mode == "full"):
        return []
    if mode == "selective-op":
        return [
            *_selective_op_policy(),
            "model.gradient_checkpointing_enable(",
            f"    gradient_checkpointing_kwargs={_SELECTIVE_KWARGS}",
            ")",
        ]
    lines = [f"model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={KWARGS})"]
    if mode.startswith("layers:"):
        every = int(mode.removeprefix("layers:"))
        lines += [
            f"# {mode}: every {_nth(every)} block in full, the rest keep their activations;",
            "# blocks are counted from 1 as torchtitan's selective layer mode counts them.",
            "blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]",
            "for i, block in enumerate(blocks):",
            f"    block.gradient_checkpointing = (i + 1) % {every} == 0",
        ]
    return lines


def imports_for(code: str) -> list[str]:
    """The imports the checkpointing lines in `code` use."""
    imports = []
    if "create_selective_checkpoint_contexts(" in code:
        imports.append(
            "from torch.utils.checkpoint import CheckpointPolicy, "
            "create_selective_checkpoint_contexts"
        )
    if "GradientCheckpointingLayer)" in code:
        imports.append("from transformers.modeling_layers import GradientCheckpointingLayer")
    return imports


def _selective_op_policy() -> list[str]:
    """torchtitan's selective op policy as code (torchtitan/models/llama3/infra/parallelize.py)."""
    matmuls = ", ".join(f"torch.ops.{op}" for op in MATMUL_OPS)
    saved = [f"    torch.ops.{op}," for op in SAVED_OPS if op not in MATMUL_OPS]
    return [
        "# Selective op checkpointing, torchtitan's policy: every block recomputes in backward",
        "# all but the outputs of its matmuls (every second one excepted) and attention.",
        f"MATMULS = {{{matmuls}}}",
        "SAVED = MATMULS | {",
        *saved,
        "}",
        "",
        "",
        "def selective_op_context():",
        '    counts = {"forward": 0, "recompute": 0}  # this block\'s matmuls so far',
        "",
        "    def policy(ctx, func, *args, **kwargs):",
        '        mode = "recompute" if ctx.is_recompute else "forward"',
        "        if func in MATMULS:",
        "            counts[mode] += 1",
        "        if func in SAVED and not (func in MATMULS and counts[mode] % 2 == 0):",
        "            return CheckpointPolicy.MUST_SAVE",
        "        return CheckpointPolicy.PREFER_RECOMPUTE",
        "",
        "    return create_selective_checkpoint_contexts(policy)",
        "",
        "",
    ]


def _nth(every: int) -> str:
    """2 -> "2nd", as a comment reads it."""
    suffix = "th" if 10 <= every % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(every % 10, "th")
    return f"{every}{suffix}"
