"""How a step is spread over many GPUs, in numbers: strategies, GPU counts, NCCL memory, traffic.

Owns the names of the distributed strategies (`--dist`) and what each keeps on every rank, the
GPU counts a cluster offers (`--gpus auto` searches them), the memory NCCL holds outside the
caching allocator on each rank, and the bytes each strategy moves per optimizer step with the
time that takes over the interconnect (an estimate). Pure arithmetic: no torch, no devices, no
I/O; the simulation (memorymark/backends/dist_sim.py) runs PyTorch's own DDP, ZeRO and FSDP2
code and this module never knows how.

ZeRO stages, as docs/many-gpus.md maps them: ZeRO-1 (optimizer state sharded) is PyTorch's
`ZeroRedundancyOptimizer` under DDP (`zero1`); ZeRO-2 (gradients sharded too) is FSDP2 with
`reshard_after_forward=False` (`fsdp-no-reshard`: parameters stay gathered between forward and
backward, as ZeRO-2 keeps whole parameters); ZeRO-3 (parameters sharded too) is FSDP2
(`fsdp`). `hsdp` shards within a node and replicates across nodes (a 2-D mesh).
"""

from __future__ import annotations

from dataclasses import dataclass

from memorymark.units import MIB

DIST_STRATEGIES = ("none", "ddp", "zero1", "fsdp", "fsdp-no-reshard", "hsdp")
"""`--dist` choices: one GPU, then PyTorch's data-parallel strategies."""
SHARDED = ("fsdp", "fsdp-no-reshard", "hsdp")
"""Strategies run by FSDP2's `fully_shard`."""
ZERO_STAGE = {"zero1": 1, "fsdp-no-reshard": 2, "fsdp": 3, "hsdp": 3}
"""The DeepSpeed ZeRO stage each strategy stands for (see the module docstring)."""
OFFLOADS = ("none", "cpu")
"""`--offload`: cpu is FSDP2's `CPUOffloadPolicy` (sharded parameters, gradients and optimizer
state in host memory, the optimizer step on the CPU)."""
MP_POLICIES = ("auto", "none")
"""`--mp-policy`: auto gives FSDP2 a `MixedPrecisionPolicy` from `--precision` (bf16-mixed:
bf16 parameters for compute, fp32 gradient reduction; 16-mixed: fp16 likewise); none keeps
fp32 parameters and autocast alone, as on one GPU."""

GPUS_PER_NODE = 8
"""GPUs in one node of the clusters searched (DGX/HGX H100 and A100 hold 8)."""
MAX_GPUS = 1024
"""The most GPUs `--gpus` accepts and `--gpus auto` searches: 128 eight-GPU nodes."""
MAX_NODES = MAX_GPUS


def cluster_counts(max_gpus: int = MAX_GPUS, per_node: int = GPUS_PER_NODE) -> tuple[int, ...]:
    """GPU counts a cluster offers: 1 to `per_node` in one node, then whole nodes."""
    inside = tuple(range(1, min(per_node, max_gpus) + 1))
    return inside + tuple(range(2 * per_node, max_gpus + 1, per_node))


def nodes_for(gpus: int, nodes: int | None = None, per_node: int = GPUS_PER_NODE) -> int:
    """Nodes `gpus` GPUs span: `nodes` when given, else as few as hold them."""
    return nodes if nodes is not None else max(1, -(-gpus // per_node))


# --- Memory NCCL holds outside PyTorch's caching allocator ------------------------------------
# NCCL_BUFFSIZE: "the size of the buffer used by NCCL when communicating data between pairs of
# GPUs. Default is 4194304 (4 MiB)" (NCCL user guide, Environment Variables, read 2026). NCCL
# allocates one such buffer per channel, per peer it talks to, per protocol, with cudaMalloc,
# not through PyTorch's allocator, so `memory_reserved()` never shows it. A ring has two peers
# (send, receive). The channel count is NCCL's own choice per topology; 16 is an assumption
# (unverified here: NCCL_DEBUG=INFO prints the count NCCL chose), and two protocols (Simple,
# LL128) hold about a buffer each. So about 16 x 2 x 2 x 4 MiB = 256 MiB per communicator:
# an estimate, listed in the report's overheads, subtracted from the capacity.
NCCL_BUFFSIZE_BYTES = 4 * MIB
NCCL_CHANNELS_ASSUMED = 16
NCCL_RING_PEERS = 2
NCCL_PROTOCOL_BUFFERS = 2


def communicators(dist: str, gpus: int, nodes: int) -> int:
    """NCCL communicators a rank joins: one per process group the strategy talks over."""
    if dist == "none":
        return 0
    if dist == "hsdp" and nodes > 1:
        return 2  # the shard group (inside a node) and the replicate group (across nodes)
    return 1


def nccl_bytes(dist: str, gpus: int, nodes: int, model_groups: int = 0) -> int:
    """Estimated bytes NCCL allocates on each rank outside the caching allocator;
    `model_groups`: the tensor and context parallel groups a rank also talks over (one
    communicator each, as every mesh dimension has its own process group)."""
    per_communicator = (
        NCCL_CHANNELS_ASSUMED * NCCL_RING_PEERS * NCCL_PROTOCOL_BUFFERS * NCCL_BUFFSIZE_BYTES
    )
    return (communicators(dist, gpus, nodes) + model_groups) * per_communicator


# --- Traffic and its time (estimated) ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Traffic:
    """Bytes one rank sends per optimizer step, split by the link they cross."""

    intra_node_bytes: float
    inter_node_bytes: float


def step_traffic(
    dist: str, gpus: int, nodes: int, param_count: int, param_bytes: int, grad_bytes: int
) -> Traffic:
    """Bytes each rank sends per optimizer step, with ring collectives as nccl-tests' bus
    bandwidth model counts them (NVIDIA/nccl-tests doc/PERFORMANCE.md): an all-reduce of S
    bytes sends 2(n-1)/n x S, an all-gather or reduce-scatter (n-1)/n x S.

    `param_bytes` and `grad_bytes` are bytes per element of what is gathered (the compute
    dtype) and of what is reduced. ddp/zero1 all-reduce gradients (zero1 also gathers updated
    parameters); fsdp gathers parameters in forward and again in backward and reduce-scatters
    gradients; fsdp-no-reshard gathers once; hsdp does fsdp's inside a node and all-reduces its
    gradient shard across nodes."""
    if dist == "none" or gpus <= 1:
        return Traffic(0.0, 0.0)
    n = gpus
    params, grads = param_count * param_bytes, param_count * grad_bytes
    if dist in ("ddp", "zero1"):
        total = 2 * (n - 1) / n * grads
        if dist == "zero1":
            total += (n - 1) / n * params  # broadcast of each rank's updated partition
        return _split(total, nodes, n)
    if dist == "hsdp" and nodes > 1:
        shard = n // nodes
        inside = (2 * params + grads) * (shard - 1) / shard
        across = 2 * (nodes - 1) / nodes * grads / shard
        return Traffic(inside, across)
    gathers = 1 if dist == "fsdp-no-reshard" else 2
    total = (gathers * params + grads) * (n - 1) / n
    return _split(total, nodes, n)


def _split(total: float, nodes: int, n: int) -> Traffic:
    # A ring over several nodes is as slow as its slowest hop: count it all on the network.
    return Traffic(0.0, total) if nodes > 1 else Traffic(total, 0.0)


def comm_seconds(
    traffic: Traffic, intra_bytes_per_s: float, inter_bytes_per_s: float | None
) -> float:
    """Seconds the traffic takes at the links' bandwidths (per direction, per GPU)."""
    seconds = traffic.intra_node_bytes / intra_bytes_per_s
    if traffic.inter_node_bytes:
        if not inter_bytes_per_s:
            raise ValueError("this GPU has no network bandwidth in the catalog")
        seconds += traffic.inter_node_bytes / inter_bytes_per_s
    return seconds
