"""The sidebar's "where" widgets for many GPUs: strategy, GPU count, nodes, tensor and context
parallel degrees, offload, policy, and the pipeline's degree, schedule, microbatches and virtual
stages.

Each widget writes its `Settings` field's session-state key (`mm_<field>`), as the other
sidebar widgets do. Must not know how a sweep runs or how results are drawn; imports no torch.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from memorymark.distributed import layout, topology
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
            return {"gpus": "1", "nodes": None, "offload": "none", "tp": 1, "cp": 1,
                    **_NO_PIPELINE}  # fmt: skip
        st.text_input(
            "GPUs (a number, or auto)",
            key=key("gpus"),
            help="auto: the fewest GPUs a cluster offers (1-8 in a node, then whole 8-GPU "
            "nodes up to 1024) on which batch 1 fits, margin kept",
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
        pipeline = pipeline_inputs() if chosen == "fsdp" else dict(_NO_PIPELINE)
        if chosen in topology.SHARDED:
            st.selectbox(
                "Offload", topology.OFFLOADS, key=key("offload"),
                help="cpu: FSDP2's CPUOffloadPolicy (states in host memory)",
            )  # fmt: skip
            st.selectbox(
                "Mixed-precision policy", topology.MP_POLICIES, key=key("mp_policy"),
                help="auto: compute in the precision's dtype, reduce gradients in fp32",
            )  # fmt: skip
            return {"tp": 1, "cp": 1, **pipeline} if chosen == "hsdp" else pipeline
        return {"offload": "none", "tp": 1, "cp": 1, **pipeline}


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


_NO_PIPELINE = {"pp": 1, "virtual_stages": 1}
"""What the settings hold where the pipeline widgets are not shown."""


def pipeline_inputs() -> dict[str, Any]:
    """The pipeline widgets (beside FSDP, as torchtitan composes them); return overrides."""
    pp = st.number_input(
        "Pipeline stages (PP degree)", min_value=1, max_value=topology.MAX_GPUS, key=key("pp"),
        help="The blocks split into this many stages on different GPUs (torch.distributed."
        "pipelining); every distinct stage is simulated and the worst one decides. 1: none",
    )  # fmt: skip
    if pp <= 1:
        return dict(_NO_PIPELINE)
    schedule = st.selectbox(
        "Pipeline schedule", layout.PP_SCHEDULES, key=key("pp_schedule"),
        help="1f1b: a backward after each forward once the pipeline is full; gpipe: every "
        "forward first (all microbatches' activations held); interleaved-1f1b: several "
        "smaller stages a GPU",
    )  # fmt: skip
    st.number_input(
        "Microbatches", min_value=1, max_value=4096, value=None, key=key("microbatches"),
        placeholder="one per stage",
        help="The local batch splits into this many; the batch must be a multiple of it",
    )  # fmt: skip
    if schedule != "interleaved-1f1b":
        return {"virtual_stages": 1}
    if st.session_state.get(key("virtual_stages"), 1) < 2:
        st.session_state[key("virtual_stages")] = 2  # interleaving holds 2 stages a GPU at least
    st.number_input(
        "Virtual stages a GPU", min_value=2, max_value=64, key=key("virtual_stages"),
        help="interleaved-1f1b: stages r, r + pp, ... on GPU r",
    )  # fmt: skip
    return {}
