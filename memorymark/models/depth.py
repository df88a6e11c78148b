"""How deep a model is, read from its config: its blocks, and the pattern they repeat.

The depth replay (memorymark/accounting/depth.py) traces a model built with a few of its blocks
and reads the full depth off them, which holds when the blocks repeat: one block (most
decoders), one period of a layer pattern (Gemma 3's five sliding-window layers and one global,
an MoE step every k layers), after a prefix that does not repeat (DeepSeek's dense first
layers). This module finds the count, the period and the prefix in a config, and writes the
config of the same model with another count. Configs only: no torch, no transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LAYER_COUNTS: tuple[tuple[str, ...], ...] = (
    ("num_hidden_layers",),  # most transformers configs (BERT, Llama, Qwen, Gemma, ViT)
    ("n_layer",),  # GPT-2
    ("n_layers",),  # DistilBERT
    ("num_layers", "num_decoder_layers"),  # T5: the encoder's and the decoder's
    ("encoder_layers", "decoder_layers"),  # BART, Whisper
)
"""The keys a transformers config gives its block count under (transformers'
`attribute_map` aliases them to `num_hidden_layers` where it can); the keys of one row are
stacks of one model, deepened together."""


@dataclass(frozen=True, slots=True)
class LayerPlan:
    """A model's depth: `layers` blocks, of which those past the first `prefix` repeat every
    `period`."""

    keys: tuple[str, ...]
    """The config keys that hold the count (all deepened together)."""
    layers: int
    period: int = 1
    prefix: int = 0

    def depths(self) -> tuple[int, ...]:
        """The four depths the replay traces: the base (one period past the prefix, at least
        two blocks, the same layers modulo the period as the full model) and the next three
        periods. A first block can differ from the rest (under FSDP a 1-block step runs
        operators a 2-block one does not), so the base holds two at least."""
        base = self.prefix + max(2, self.period)
        base += (self.layers - base) % self.period
        return tuple(base + i * self.period for i in range(4))

    def worth_replaying(self) -> bool:
        """Whether tracing `depths()` costs less than tracing the model. A replay traces four
        shallower models at the first batch size and two at each later one, each with the
        embeddings, head, loss and optimizer a full trace has once: the two must hold at most
        half the model's blocks (timed on this project's 2-core machine: Llama-3.2-1B's 16
        blocks gain, a probe after the first 0.8-1.0 s replayed against 1.6-1.9 s traced, the
        first 4.9 s against 4.8; BERT-base's 12 would not)."""
        depths = self.depths()
        return self.layers > depths[-1] and 2 * (depths[1] + depths[2]) <= self.layers


def replayed_plan(config: dict[str, Any]) -> LayerPlan | None:
    """The layer plan of the model `config` describes where a depth replay of it pays off
    (`LayerPlan.worth_replaying`), else None."""
    plan = layer_plan(config)
    return plan if isinstance(plan, LayerPlan) and plan.worth_replaying() else None


def layer_plan(config: dict[str, Any], checkpoint_every: int | None = None) -> LayerPlan | str:
    """The depth of the model `config` describes, or why it has none a replay can use. With
    `checkpoint_every` K (layers:K checkpointing), a block checkpointed differs from one that is
    not: the period is then a multiple of K (the least common one with the config's), in phase
    with the blocks checkpointed (memorymark/step/checkpointing.py's `checkpointed_block`)."""
    keys = next((row for row in LAYER_COUNTS if row[0] in config), None)
    if keys is None:
        return "its config gives no layer count"
    counts = {config.get(key, config[keys[0]]) for key in keys}
    if len(counts) != 1 or not all(isinstance(c, int) and c > 0 for c in counts):
        return f"its stacks differ in depth ({', '.join(f'{k}={config.get(k)}' for k in keys)})"
    layers = counts.pop()
    kinds = _layer_kinds(config, layers)
    if isinstance(kinds, str):
        return kinds
    if checkpoint_every:
        # The blocks layers:K checkpoints, counted from 1 as torchtitan's `_apply_layer_sac`
        # does: (i + 1) % K == 0 (memorymark/step/checkpointing.py, which must agree).
        kinds = [(*kind, (i + 1) % checkpoint_every == 0) for i, kind in enumerate(kinds)]
    prefix, period = _repeat(kinds)
    return LayerPlan(keys, layers, period, prefix)


def with_layers(config: dict[str, Any], plan: LayerPlan, layers: int) -> dict[str, Any]:
    """`config` with `layers` blocks: its count, and any per-layer list cut or extended by its
    pattern (the prefix, then the period repeated)."""
    out = dict(config)
    for key in plan.keys:
        if key in out:
            out[key] = layers
    for key, value in config.items():
        if isinstance(value, list) and len(value) == plan.layers and key != "mlp_only_layers":
            out[key] = [value[_source(i, plan)] for i in range(layers)]
    if config.get("mlp_only_layers"):
        dense = set(config["mlp_only_layers"])
        out["mlp_only_layers"] = [i for i in range(layers) if _source(i, plan) in dense]
    return out


def _source(i: int, plan: LayerPlan) -> int:
    """The layer of the full model that layer `i` of a shallower one stands for."""
    if i < plan.prefix:
        return i
    return plan.prefix + (i - plan.prefix) % plan.period


def _layer_kinds(config: dict[str, Any], layers: int) -> list[tuple[Any, ...]] | str:
    """What sets each layer apart from the others, as the config says, layer by layer."""
    lists = [
        (key, value)
        for key, value in config.items()
        if isinstance(value, list) and len(value) == layers and key != "mlp_only_layers"
    ]
    dense = set(config.get("mlp_only_layers") or ())
    sparse_step = config.get("decoder_sparse_step") if config.get("num_experts") else None
    first_dense = config.get("first_k_dense_replace") or 0
    moe_every = config.get("moe_layer_freq") if config.get("n_routed_experts") else None
    pattern = config.get("sliding_window_pattern") if config.get("sliding_window") else None
    if config.get("use_sliding_window") and config.get("max_window_layers", layers) < layers:
        return "its sliding-window layers stop part way (max_window_layers)"
    for name, every in (("decoder_sparse_step", sparse_step), ("moe_layer_freq", moe_every)):
        if every is not None and not (isinstance(every, int) and every > 0):
            return f"its {name} is not a whole number of layers"
    if pattern is not None and not (isinstance(pattern, int) and pattern > 0):
        return "its sliding_window_pattern is not a whole number of layers"
    sparse, moe, sliding = sparse_step or 0, moe_every or 0, pattern or 0
    return [
        (
            *(value[i] for _, value in lists),
            i in dense,
            sparse > 0 and (i + 1) % sparse == 0,
            i < first_dense,
            moe > 0 and i >= first_dense and (i - first_dense) % moe == 0,
            sliding > 0 and (i + 1) % sliding == 0,
        )
        for i in range(layers)
    ]


def _repeat(kinds: list[tuple[Any, ...]]) -> tuple[int, int]:
    """(prefix, period): the shortest period after the shortest prefix past which the layers
    repeat (a period as long as what is left, when nothing does)."""
    n = len(kinds)
    for span in range(1, n + 1):  # the smallest prefix + period first
        for prefix in range(span):
            period = span - prefix
            if all(kinds[i] == kinds[i + period] for i in range(prefix, n - period)):
                return prefix, period
    return 0, n
