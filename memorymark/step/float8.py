"""Float8 training of a model's linear layers as torchao applies it: `convert_to_float8_training`
with one of its recipes (tensorwise: one scale per tensor; rowwise: one per row), every
`nn.Linear` whose dimensions are multiples of 16 (torchtitan's filter, as `_scaled_mm` needs),
the output layer left in high precision (torchtitan's `filter_fqns=["output"]`; transformers
names it `lm_head`, and a classifier's head is `classifier`/`score`).

torchao is an optional extra (`pip install memorymark[float8]`); without it, a one-line error.
Must not know settings' sections, backends or how memory is counted.
"""

from __future__ import annotations

from typing import Any

from torch import nn

# Modules left in high precision, by the last part of their name: torchtitan's "output" and
# transformers' names for the same layer.
_KEPT = ("output", "lm_head", "classifier", "score")


def _float8_ready(module: nn.Module, fqn: str) -> bool:
    """torchtitan's `module_filter_fn` (torchtitan/components/quantization/float8.py): a linear
    layer not named as the output, with both dimensions multiples of 16."""
    if not isinstance(module, nn.Linear) or fqn.rsplit(".", 1)[-1] in _KEPT:
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert(model: nn.Module, recipe: str) -> Any:
    """Swap `model`'s eligible linear layers for torchao's Float8Linear under `recipe`
    (tensorwise or rowwise), in place, or say in one line what is missing."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        raise ValueError(
            "float8 training needs torchao: pip install 'memorymark[float8]' (torchao>=0.18)"
        ) from exc
    config = Float8LinearConfig.from_recipe_name(recipe)
    return convert_to_float8_training(model, config=config, module_filter_fn=_float8_ready)
