"""The layouts a search tries and what each costs beyond the simulated step, in numbers.

Owns the candidate layouts over a GPU count (data parallel x tensor x pipeline, x context on
long sequences), the pruning of those whose sharded states alone pass a GPU, torchtitan's
default microbatch count, the pipeline bubble, and the bytes tensor, context and pipeline
parallelism move per step with the time that takes. Pure arithmetic: no torch, no devices, no
I/O; memorymark/analyses/layouts.py steps each candidate and reads these formulas beside it.

Sources:
- Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM" (SC '21), section 2.2: the pipeline bubble of GPipe and 1F1B is (p - 1)
  microbatch-times against m of work, (p - 1) / v under the interleaved schedule with v
  stages a GPU; section 2.3 / 3.3: tensor parallelism all-reduces the activations (b x s x h)
  twice in each layer's forward and twice in its backward.
- Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022):
  with sequence parallelism each all-reduce becomes an all-gather and a reduce-scatter, the
  same bytes on a ring.
- torchtitan `docs/composability.md` and `torchtitan/distributed/pipeline_parallel.py`
  (`build_pipeline_schedule`): microbatches = local batch / pipeline_parallel_microbatch_size
  (default 1); its mesh puts tp innermost, so TP stays in a node.
- Ring collectives as nccl-tests' bus bandwidth model counts them (topology.step_traffic).
"""

from __future__ import annotations

from dataclasses import dataclass

from memorymark.distributed import layout, topology

TP_DEGREES = (1, 2, 4, 8)
"""Tensor-parallel degrees tried: inside one 8-GPU node (torchtitan's mesh, tp innermost)."""
PP_DEGREES = (1, 2, 4, 8)
"""Pipeline degrees tried: torchtitan's published layouts go to PP 8 (405B on 512 H100s)."""
CP_DEGREES = (1, 2, 4, 8)
"""Context-parallel degrees tried on long sequences."""
LONG_SEQUENCE_TOKENS = 32_768
"""From this length on context parallelism is tried (torchtitan's CP runs start at 32k)."""
INTERLEAVED_STAGES = 2
"""Stages a GPU holds in the interleaved variant tried (torchtitan's tests use 2)."""
TP_ALL_REDUCES_PER_LAYER = 4
"""Two all-reduces of b x s x h in a layer's forward, two in its backward (Megatron-LM)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One layout the search tries: degrees, and for a pipeline its schedule."""

    layout: layout.Layout
    schedule: str = "1f1b"
    virtual_stages: int = 1

    def describe(self) -> str:
        """The layout as torchtitan's logs write it, with a pipeline's schedule."""
        text = self.layout.describe()
        if self.layout.pp > 1:
            if self.schedule == "interleaved-1f1b":
                return f"{text} (interleaved 1F1B, {self.virtual_stages} stages a GPU)"
            return f"{text} ({self.schedule.upper()})"
        return text


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the candidates and their traffic read off the model's config."""

    heads: int | None
    kv_heads: int | None
    layers: int | None
    hidden: int | None


def candidates(
    gpus: int, dist: str, shape: ModelShape, seq_len: int | None, nodes: int | None = None
) -> tuple[list[Candidate], int]:
    """(The layouts to try over `gpus` GPUs, data parallelism over what tp x cp x pp leave
    under `dist`; how many the model's shape refused), FSDP-only first. A pipeline is tried
    with 1F1B; `interleaved` gives its variant."""
    long = seq_len is not None and seq_len >= LONG_SEQUENCE_TOKENS
    found: list[Candidate] = []
    refused = 0
    for pp in PP_DEGREES:
        for tp in TP_DEGREES:
            for cp in CP_DEGREES if long else (1,):
                if gpus % (tp * cp * pp) or (dist == "none" and gpus > tp * cp * pp):
                    continue
                try:
                    lay = layout.Layout(gpus=gpus, dist=dist, tp=tp, cp=cp, pp=pp,
                                        nodes=topology.nodes_for(gpus, nodes))  # fmt: skip
                    _check(lay, shape, seq_len, 1)
                except ValueError:
                    refused += 1
                    continue
                found.append(Candidate(lay))
    return found, refused


def interleaved(c: Candidate, shape: ModelShape, seq_len: int | None) -> Candidate | None:
    """A 1F1B pipeline's interleaved variant, `INTERLEAVED_STAGES` stages a GPU, where the
    layers give every stage one; None for no pipeline or too few layers."""
    if c.layout.pp <= 1 or c.schedule != "1f1b":
        return None
    try:
        _check(c.layout, shape, seq_len, INTERLEAVED_STAGES)
    except ValueError:
        return None
    return Candidate(c.layout, "interleaved-1f1b", INTERLEAVED_STAGES)


def _check(lay: layout.Layout, shape: ModelShape, seq_len: int | None, stages: int) -> None:
    layout.check_model(lay, heads=shape.heads, kv_heads=shape.kv_heads, layers=shape.layers,
                       seq_len=seq_len, pp_stages_per_rank=stages)  # fmt: skip


def sharded_states(states_bytes: int, lay: layout.Layout) -> float:
    """A rank's share of the model's states: FSDP shards over dp_shard, TP splits each
    weight over tp, a pipeline stage holds 1/pp of the blocks (a lower bound: the first and
    last stages hold the embeddings and head too)."""
    return states_bytes / (lay.dp_shard * lay.tp * lay.pp)


def pruned(states_bytes: int, lay: layout.Layout, capacity_bytes: int) -> bool:
    """Whether a rank's share of the states alone passes its capacity: no step can fit."""
    return sharded_states(states_bytes, lay) > capacity_bytes


def bubble_fraction(pp: int, microbatches: int, schedule: str, virtual_stages: int = 1) -> float:
    """Share of a pipeline step its GPUs sit idle: (p - 1) / (m + p - 1) for GPipe and 1F1B,
    the bubble divided by v for interleaved 1F1B (Narayanan et al. 2021, section 2.2)."""
    if pp <= 1:
        return 0.0
    bubble = (pp - 1) / (virtual_stages if schedule == "interleaved-1f1b" else 1)
    return bubble / (microbatches + bubble)


def tp_bytes(
    lay: layout.Layout, shape: ModelShape, local_batch: int, seq_len: int, elem_bytes: int
) -> float:
    """Bytes a rank sends per step for tensor parallelism: 4 ring all-reduces of b x s x h a
    layer (or their all-gather + reduce-scatter under sequence parallelism, the same bytes),
    over the layers of its stage and the tokens of its context shard."""
    if lay.tp <= 1 or not shape.hidden or not shape.layers:
        return 0.0
    activations = local_batch * (seq_len / lay.cp) * shape.hidden * elem_bytes
    per_all_reduce = 2 * (lay.tp - 1) / lay.tp * activations
    return TP_ALL_REDUCES_PER_LAYER * per_all_reduce * shape.layers / lay.pp


def cp_bytes(
    lay: layout.Layout, shape: ModelShape, local_batch: int, seq_len: int, elem_bytes: int
) -> float:
    """Bytes a rank sends per step for ring attention: each layer passes its keys and values
    round the ring (cp - 1 hops of the shard's K and V) in forward, and K, V and their
    gradients in backward: 3 x that (torch's `context_parallel`, `_templated_ring_attention`)."""
    if lay.cp <= 1 or not shape.hidden or not shape.layers or not shape.heads:
        return 0.0
    kv_hidden = shape.hidden * (shape.kv_heads or shape.heads) / shape.heads / lay.tp
    shard_kv = 2 * local_batch * (seq_len / lay.cp) * kv_hidden * elem_bytes
    return 3 * (lay.cp - 1) * shard_kv * shape.layers / lay.pp


def pp_bytes(
    lay: layout.Layout, shape: ModelShape, local_batch: int, seq_len: int, elem_bytes: int
) -> float:
    """Bytes a middle stage sends per step: each microbatch's activations forward and their
    gradient backward (b x s x h each way, over the step's local batch)."""
    if lay.pp <= 1 or not shape.hidden:
        return 0.0
    return 2 * local_batch * (seq_len / lay.cp) * shape.hidden * elem_bytes


def dp_nodes(lay: layout.Layout) -> int:
    """Nodes a data-parallel group spans: its ranks sit tp x cp apart on the mesh."""
    return topology.nodes_for(lay.dp * lay.tp * lay.cp) if lay.dp > 1 else 1


def pp_crosses_nodes(lay: layout.Layout) -> bool:
    """Whether pipeline neighbours sit on different nodes (pp is outermost on the mesh)."""
    return lay.gpus // lay.pp >= topology.GPUS_PER_NODE or lay.nodes > 1
