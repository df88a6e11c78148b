"""The parallel layout of a many-GPU step: how its GPUs divide into data, context, tensor and
pipeline parallel groups, in numbers.

Owns the degrees (`--tp`, `--cp`, `--pp`), the pipeline schedules' names, the device mesh they
make, and the checks a layout must pass against the GPU count and the model's shape. The mesh is
torchtitan's (`torchtitan/distributed/parallel_dims.py`, `ParallelDims`): its dimensions,
outermost first, are pp, dp_replicate, dp_shard, cp, tp, and their product is the world size, so
tensor parallelism stays inside a node and pipeline stages span nodes. The data-parallel degree is
what the other degrees leave of the GPU count, and `--dist` says how it is used: fsdp shards over
it (dp_shard), ddp and zero1 replicate over it (dp_replicate), hsdp replicates across nodes and
shards inside one. Pure arithmetic: no torch, no I/O; the simulation builds the mesh from this.
"""

from __future__ import annotations

from dataclasses import dataclass

from memorymark.distributed import topology

MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""torchtitan's mesh dimensions, outermost first (ParallelDims.build_mesh)."""
PP_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")
"""`--pp-schedule`: torch.distributed.pipelining's Schedule1F1B, ScheduleGPipe and
ScheduleInterleaved1F1B (which takes `--virtual-stages` stages per rank)."""


@dataclass(frozen=True, slots=True)
class Layout:
    """The degrees of a step's parallelism over `gpus` GPUs."""

    gpus: int
    dist: str = "none"
    tp: int = 1
    cp: int = 1
    pp: int = 1
    nodes: int = 1

    def __post_init__(self) -> None:
        for name, degree in (("tp", self.tp), ("cp", self.cp), ("pp", self.pp)):
            if degree < 1:
                raise ValueError(f"--{name} must be at least 1 (got {degree})")
        model = self.model_parallel
        if self.gpus % model:
            raise ValueError(
                f"--tp {self.tp} x --cp {self.cp} x --pp {self.pp} = {model} does not divide "
                f"{self.gpus} GPUs: pick degrees whose product divides --gpus"
            )
        if self.dist == "none" and self.dp > 1:
            raise ValueError(
                f"{self.gpus} GPUs over tp x cp x pp = {model} leave {self.dp} data-parallel "
                "ranks: name a --dist (ddp, zero1, fsdp, ...) or make the product the GPU count"
            )
        if self.dist == "hsdp" and self.parallel:
            raise ValueError(
                "hsdp beside --tp, --cp or --pp is not modelled: use --dist fsdp, whose mesh "
                "torchtitan builds the same way"
            )
        if self.tp > topology.GPUS_PER_NODE:
            raise ValueError(
                f"--tp {self.tp} spans nodes: tensor parallelism talks every layer, so keep it "
                f"inside one {topology.GPUS_PER_NODE}-GPU node (--tp 8 or less)"
            )

    @property
    def model_parallel(self) -> int:
        """GPUs one data-parallel rank spans: the tensor, context and pipeline degrees."""
        return self.tp * self.cp * self.pp

    @property
    def dp(self) -> int:
        """Data-parallel degree: what tp, cp and pp leave of the GPU count."""
        return self.gpus // self.model_parallel

    @property
    def dp_replicate(self) -> int:
        """Ranks holding the same shard of the model (DDP's and HSDP's replicas)."""
        if self.dist in ("ddp", "zero1"):
            return self.dp
        if self.dist == "hsdp":
            return self.nodes
        return 1

    @property
    def dp_shard(self) -> int:
        """Ranks FSDP2 shards the model's states over."""
        return self.dp // self.dp_replicate

    @property
    def parallel(self) -> bool:
        """Whether any model parallelism (tp, cp or pp) is asked for."""
        return self.model_parallel > 1

    def mesh(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """(shape, names) of the device mesh, dimensions of size 1 left out, outermost first."""
        sizes = dict(
            pp=self.pp, dp_replicate=self.dp_replicate, dp_shard=self.dp_shard, cp=self.cp,
            tp=self.tp,
        )  # fmt: skip
        kept = [(sizes[n], n) for n in MESH_ORDER if sizes[n] > 1]
        if not kept:
            return (1,), ("dp_shard",)
        return tuple(s for s, _ in kept), tuple(n for _, n in kept)

    def describe(self) -> str:
        """The layout in one phrase, as torchtitan's logs write it ("FSDP 8 x TP 8 x PP 8")."""
        parts = []
        if self.dp_replicate > 1:
            parts.append(f"DP {self.dp_replicate}")
        if self.dp_shard > 1:
            parts.append(f"FSDP {self.dp_shard}")
        parts += [f"{n.upper()} {d}" for n, d in (("cp", self.cp), ("tp", self.tp),
                                                   ("pp", self.pp)) if d > 1]  # fmt: skip
        return " x ".join(parts) or "one GPU"


def check_model(
    layout: Layout,
    *,
    heads: int | None,
    kv_heads: int | None,
    layers: int | None,
    seq_len: int | None,
    pp_stages_per_rank: int = 1,
) -> None:
    """Refuse, in one line, a layout the model's shape cannot take.

    Tensor parallelism splits attention by heads (ColwiseParallel on q, k and v), so tp divides
    the query and the key/value heads; each pipeline stage needs a layer; context parallelism's
    load-balanced ring gives each rank 2 chunks of the sequence (torch's
    `context_parallel`, `_cp_options.enable_load_balance`), so the sequence divides by 2 x cp.
    """
    if layout.tp > 1:
        for what, count in (("attention heads", heads), ("key/value heads", kv_heads)):
            if count is not None and count % layout.tp:
                raise ValueError(
                    f"--tp {layout.tp} does not divide the model's {count} {what}: "
                    f"pick a --tp that divides {count}"
                )
    stages = layout.pp * pp_stages_per_rank
    if layout.pp > 1 and layers is not None and stages > layers:
        raise ValueError(
            f"{stages} pipeline stages over {layers} layers: each stage needs a layer, so "
            f"use at most {layers // pp_stages_per_rank} for --pp"
        )
    if layout.cp > 1 and seq_len is not None and seq_len % (2 * layout.cp):
        raise ValueError(
            f"--cp {layout.cp} needs a sequence length divisible by {2 * layout.cp} (2 chunks "
            f"a rank, for the load-balanced ring); {seq_len} is not"
        )
