"""The layout a search chose, as code: torchtitan's `[parallelism]` job-config fragment and the
`init_device_mesh` line of its mesh.

Owns only the degrees and the mesh; the calls that apply tensor and pipeline parallelism to a
model are the tensor- and pipeline-parallel snippets' (memorymark/reporting/snippets.py). Must
not know how a layout is searched or simulated.
"""

from __future__ import annotations

from memorymark.distributed.layout import Layout
from memorymark.distributed.layout_costs import Candidate

TORCHTITAN_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved-1f1b": "Interleaved1F1B"}
"""`--pp-schedule` as torchtitan's `pipeline_parallel_schedule` names it (torch's
`get_schedule_class` names, `Schedule` dropped)."""


def torchtitan_parallelism(
    c: Candidate,
    local_batch: int | None = None,
    global_batch: int | None = None,
    microbatches: int | None = None,
) -> str:
    """The TOML fragment of a torchtitan job config for layout `c` (torchtitan's
    `config/job_config.py`, `Parallelism` and `Training`); a pipeline's microbatch size is
    the local batch over the `microbatches` simulated (torchtitan's default, 1, without)."""
    lay = c.layout
    lines = [
        "[parallelism]",
        f"data_parallel_replicate_degree = {lay.dp_replicate}",
        f"data_parallel_shard_degree = {lay.dp_shard}",
        f"tensor_parallel_degree = {lay.tp}",
        f"context_parallel_degree = {lay.cp}",
        f"pipeline_parallel_degree = {lay.pp}",
    ]
    if lay.pp > 1:
        lines.append(f'pipeline_parallel_schedule = "{TORCHTITAN_SCHEDULES[c.schedule]}"')
        size = local_batch // microbatches if local_batch and microbatches else 1
        lines.append(f"pipeline_parallel_microbatch_size = {size}")
    if lay.tp > 1:
        lines.append("enable_async_tensor_parallel = false")
    if local_batch is not None:
        lines += ["", "[training]", f"local_batch_size = {local_batch}"]
        if global_batch is not None:
            lines.append(f"global_batch_size = {global_batch}")
    return "\n".join(lines) + "\n"


def init_device_mesh_line(lay: Layout) -> str:
    """The `init_device_mesh` call of the layout's mesh (torchtitan's order, sizes of 1 left
    out), as `torch.distributed.device_mesh` takes it."""
    shape, names = lay.mesh()
    quoted = ", ".join(f'"{n}"' for n in names) + ("," if len(names) == 1 else "")
    return f'mesh = init_device_mesh("cuda", {shape}, mesh_dim_names=({quoted}))'
