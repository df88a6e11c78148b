"""The sidebar's "where" widgets for many GPUs: strategy, GPU count, nodes, offload, policy.

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
            return {"gpus": "1", "nodes": None, "offload": "none"}
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
        if chosen in topology.SHARDED:
            st.selectbox(
                "Offload", topology.OFFLOADS, key=key("offload"),
                help="cpu: FSDP2's CPUOffloadPolicy (states in host memory)",
            )  # fmt: skip
            st.selectbox(
                "Mixed-precision policy", topology.MP_POLICIES, key=key("mp_policy"),
                help="auto: compute in the precision's dtype, reduce gradients in fp32",
            )  # fmt: skip
            return {}
        return {"offload": "none"}
