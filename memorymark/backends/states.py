"""A lower bound on any training step's peak: the bytes of the model's states alone.

The weights and buffers, and for the parameters that train their gradients and the optimizer's
state, are all alive at the optimizer step, whatever the batch, so their bytes bound every step's
peak from below. They are counted on the meta device: nothing is allocated or run (a 70B model still
takes 10-20 s here, to build its modules). The ways out (memorymark/analyses/fixes.py) use the
bound, through the engine's door (memorymark/analyses/bench.py), to skip a step that cannot fit.

What the bound leaves out, so a step needs more: activations (with checkpointing, each layer's
input and one layer recomputed at a time), the logits and the loss (Llama-3.1-70B's QLoRA step
on an A10, simulated: 2.11 GiB of logits, 0.38 GiB of activations), autograd's temporaries, the
CUDA rules' workspaces, and the caching allocator's rounding and cached free blocks (a step's
required bytes are reserved, not live: 0.48 GiB more there).

Must not know which batch sizes are tried, what the bound is used for, or how it is shown.
"""

from __future__ import annotations

from typing import Any

from memorymark.settings import Settings


def counted_states(settings: Settings) -> tuple[int, int]:
    """(A lower bound on any training step's peak under `settings`: the bytes of the weights
    and, for the parameters that train, their gradients and the optimizer's state, all alive
    at the optimizer step; the model's parameter count as built, what a distributed step's
    traffic is estimated from), from one model on the meta device: nothing is allocated or
    run.

    A model deep enough for the depth replay (memorymark/models/depth.py) is counted at two
    depths a period apart and extended by whole periods: every period of blocks holds the same
    tensors, and building 80 blocks, even on the meta device, took 1-2 s a count here."""
    plan = _layer_plan(settings)
    if plan is None:
        return _counted(settings, None)
    shallow, deeper = plan.depths()[1:3]
    (states, parameters), (more_states, more_parameters) = (
        _counted(settings, shallow),
        _counted(settings, deeper),
    )
    periods = (plan.layers - shallow) // plan.period
    return (
        states + periods * (more_states - states),
        parameters + periods * (more_parameters - parameters),
    )


def _layer_plan(settings: Settings) -> Any:
    """The catalog model's layer plan where the depth replay would use it, else None."""
    from memorymark import models
    from memorymark.models import depth

    config = models.config_of(models.find_model(settings.workload.model))
    return None if config is None else depth.replayed_plan(config)


def _counted(settings: Settings, layers: int | None) -> tuple[int, int]:
    """`counted_states` of the model built with `layers` blocks (None: as configured)."""
    import torch

    from memorymark.step.catalog import CatalogStep

    with torch.device("meta"):
        model = CatalogStep(settings, layers=layers).build_model()
    parameters = sum(p.numel() for p in model.parameters())
    # Buffers live beside the weights: a 4-bit layer's absmax (1 GiB for a 70B model with
    # double quant) is one, not a parameter (memorymark/step/quantization.py).
    held = [*model.parameters(), *model.buffers()]
    weights = sum(t.numel() * t.element_size() for t in held)
    if settings.workload.forward_only or settings.workload.optimizer == "none":
        return weights, parameters
    trained = [p for p in model.parameters() if p.requires_grad]
    trainable = sum(p.numel() * p.element_size() for p in trained)
    return weights + trainable + _state_lower_bound(
        settings.workload.optimizer, trained
    ), parameters


def _state_lower_bound(optimizer: str, trained: list[Any]) -> int:
    """Bytes the optimizer's state takes at least, inside the allocator."""
    like_weights = sum(p.numel() * p.element_size() for p in trained)
    numel = sum(p.numel() for p in trained)
    # AdamW keeps two buffers like each trained weight, SGD's momentum one; bitsandbytes' 8-bit
    # ones a byte per value (two for AdamW, one for Lion), more for small tensors and absmax;
    # paged state lives outside the allocator, and Adafactor's factored moments are small: they
    # count as none (a lower bound stays a lower bound).
    per_optimizer = {
        "adamw": 2 * like_weights,
        "adamw-fused": 2 * like_weights,
        "adamw-forloop": 2 * like_weights,
        "sgd": like_weights,
        "sgd-forloop": like_weights,
        "adamw-8bit": 2 * numel,
        "lion-8bit": numel,
    }
    return per_optimizer.get(optimizer, 0)
