"""The sidebar's "where" widgets for many GPUs: strategy, GPU count, nodes, tensor and context
parallel degrees, offload, policy.

Each widget writes its `Settings` field's session-state key (`mm_<field>`), as the other
sidebar widgets do. Must not know how a sweep runs or how results are drawn; imports no torch.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from memorymark.distributed import topology
from memorymark.ui.state_keys import key

DIST_HELP = (
    "none: one GPU. ddp: DistributedDataParallel (ZeRO stage 0). zero1: DDP + "
    "ZeroRedundancyOptimizer (ZeRO-1). fsdp-no-reshard: FSDP2 keeping parameters gathered "
    "from forward to backward (~ZeRO-2). fsdp: FSDP2 (~ZeRO-3). hsdp: FSDP2 inside a node, "
    "replicated across nodes. Simulated with PyTorch's own code on a fake process group."
)


def distribution_inputs(sb: Any) -> dict[str, Any]:
    """Draw the many-GPU widgets; return values that override their state."""
    with sb.expander("Many GPUs", expanded=st.session_state.get(key("dist"), "none") != "none"):
        chosen = st.selectbox(
            "Distributed strategy", topology.DIST_STRATEGIES, key=key("dist"), help=DIST_HELP
        )
        if chosen == "none":
            return {"gpus": "1", "nodes": None, "offload": "none", "tp": 1, "cp": 1}
        st.text_input(
            "GPUs (a number, or auto)",
            key=key("gpus"),
            help="auto: the fewest GPUs a cluster offers (1-8 in a node, then whole 8-GPU "
            "nodes up to 1024) on which batch 1 trains",
        )
        st.number_input(
            "Nodes (optional)",
            min_value=1,
            max_value=topology.MAX_NODES,
            value=None,
            key=key("nodes"),
            placeholder="8 GPUs a node",
        )
        if chosen in ("fsdp", "fsdp-no-reshard"):
            _parallel_inputs()
        if chosen in topology.SHARDED:
            st.selectbox(
                "Offload", topology.OFFLOADS, key=key("offload"),
                help="cpu: FSDP2's CPUOffloadPolicy (states in host memory)",
            )  # fmt: skip
            st.selectbox(
                "Mixed-precision policy", topology.MP_POLICIES, key=key("mp_policy"),
                help="auto: compute in the precision's dtype, reduce gradients in fp32",
            )  # fmt: skip
            return {"tp": 1, "cp": 1} if chosen == "hsdp" else {}
        return {"offload": "none", "tp": 1, "cp": 1}


def _parallel_inputs() -> None:
    """Tensor and context parallel degrees beside FSDP2 (torchtitan's mesh; the GPU count is
    their product times the data-parallel degree)."""
    left, right = st.columns(2)
    left.number_input(
        "Tensor parallel (TP)", min_value=1, max_value=topology.GPUS_PER_NODE, step=1,
        key=key("tp"),
        help="Each block's attention and MLP split over this many GPUs of a node "
        "(parallelize_module with the model's plan, sequence-parallel norms, loss parallel); "
        "it divides the heads and the GPU count",
    )  # fmt: skip
    right.number_input(
        "Context parallel (CP)", min_value=1, max_value=topology.MAX_GPUS, step=1, key=key("cp"),
        help="The sequence split over this many GPUs, attention as a ring (torch's context "
        "parallelism); the sequence length divides by 2 x CP",
    )  # fmt: skip
