"""Ready-to-paste code for a pipeline-parallel layout: the split, the mesh and the schedule.

Written from the settings as memorymark/step/pipeline.py and memorymark/backends/pipeline_sim.py
run them: torchtitan's mesh (pp outermost, then the data-parallel dimension), each stage a run of
a decoder's layers (the first with the embeddings, the last with the norm, head and loss),
FSDP2 on each stage with parameters kept gathered from forward to backward (torchtitan's default
under PP), and the schedule over the local batch's microbatches. Also the same layout as a
torchtitan job config's `[parallelism]` section. Writes text only: no torch.
"""

from __future__ import annotations

from memorymark.search.plan import TrainingPlan
from memorymark.settings import Settings

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
"""torchtitan's `pipeline_parallel_schedule` names (and torch's `Schedule<name>` classes)."""

_AUTOCAST_DTYPE = {"bf16-mixed": "torch.bfloat16", "16-mixed": "torch.float16"}


def torchtitan_fragment(settings: Settings, plan: TrainingPlan) -> str:
    """The layout as a torchtitan TOML job config's `[parallelism]` (and local batch)."""
    h = settings.hardware
    layout = h.layout()
    microbatches = h.pipeline_microbatches
    lines = [
        "[training]",
        f"local_batch_size = {plan.micro_batch}",
        f"seq_len = {settings.workload.seq_len}",
        "",
        "[parallelism]",
        f"data_parallel_shard_degree = {layout.dp_shard}",
        f"pipeline_parallel_degree = {h.pp}",
        f'pipeline_parallel_schedule = "{SCHEDULES[h.pp_schedule]}"',
        f"pipeline_parallel_microbatch_size = {max(1, plan.micro_batch // microbatches)}",
    ]
    return "\n".join(lines) + "\n"


def program(settings: Settings, plan: TrainingPlan) -> str:
    """A torchrun script that splits the model into this rank's stages and runs the schedule."""
    h = settings.hardware
    layout = h.layout()
    shape, names = layout.mesh()
    microbatches = h.pipeline_microbatches
    schedule = f"Schedule{SCHEDULES[h.pp_schedule]}"
    dtype = _AUTOCAST_DTYPE.get(settings.workload.precision)
    sharded = layout.dp_shard > 1
    quoted = ", ".join(f'"{name}"' for name in names) + ("," if len(names) == 1 else "")
    mp = f"MixedPrecisionPolicy(param_dtype={dtype}, reduce_dtype=torch.float32)" if dtype else ""
    lines = [
        f"# Measured for {settings.workload.model} at {settings.workload.seq_len} tokens per "
        f"sample: {layout.describe()}, {h.pp_schedule}, {microbatches} microbatches.",
        f"# Run with: torchrun --nnodes {max(1, layout.gpus // 8)} --nproc-per-node "
        f"{min(8, layout.gpus)} train.py",
        "# torchtitan's job config for the same layout:",
        *(
            f"#   {line}" if line else "#"
            for line in torchtitan_fragment(settings, plan).split("\n")[:-1]
        ),
        "import copy",
        "import os",
        "",
        "import torch",
        "from torch import nn",
        "from torch.distributed.device_mesh import init_device_mesh",
        "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard",
        f"from torch.distributed.pipelining import PipelineStage, {schedule}",
        "",
        'torch.distributed.init_process_group("nccl")',
        'torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))',
        f'mesh = init_device_mesh("cuda", {shape}, mesh_dim_names=({quoted}))',
        'pp_rank = mesh["pp"].get_local_rank()',
        f"pp, stages_per_rank = {h.pp}, {h.virtual_stages}",
        "n_stages = pp * stages_per_rank",
        "",
        "",
        "class Stage(nn.Module):",
        '    """A run of a decoder\'s layers; the first embeds, the last norms and projects."""',
        "",
        "    def __init__(self, model, index):",
        "        super().__init__()",
        "        layers = model.model.layers",
        "        share, extra = divmod(len(layers), n_stages)",
        "        start = index * share + min(index, extra)",
        "        end = start + share + (index < extra)",
        "        self.embed = model.model.embed_tokens if index == 0 else None",
        "        self.layers = nn.ModuleList(layers[start:end])",
        "        self.rotary = model.model.rotary_emb",
        "        last = index == n_stages - 1",
        "        self.norm = model.model.norm if last else None",
        "        self.head = model.lm_head if last else None",
        "",
        "    def forward(self, x):",
        "        h = self.embed(x) if self.embed is not None else x",
        "        positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)",
        "        rotary = self.rotary(h, positions)",
        "        for layer in self.layers:",
        "            h = layer(h, position_embeddings=rotary, position_ids=positions)",
        "        return self.head(self.norm(h)) if self.head is not None else h",
        "",
        "",
        "def loss_fn(logits, labels):",
        "    return model.loss_function(logits, labels, vocab_size=logits.shape[-1])",
        "",
        "",
        "# This rank's stages: pp_rank, pp_rank + pp, ... (torchtitan builds them on the meta",
        "# device and materialises only these; deepcopy stands for that here).",
        "indices = [pp_rank + pp * k for k in range(stages_per_rank)]",
        'parts = [Stage(copy.deepcopy(model), i).to("cuda") for i in indices]',
    ]
    if sharded:
        lines += [
            f"mp_policy = {mp}" if mp else "mp_policy = MixedPrecisionPolicy()",
            "for part in parts:  # FSDP2 per stage, parameters gathered forward to backward",
            "    for layer in part.layers:",
            '        fully_shard(layer, mesh=mesh["dp_shard"], mp_policy=mp_policy,',
            "                    reshard_after_forward=False)",
            '    fully_shard(part, mesh=mesh["dp_shard"], mp_policy=mp_policy,',
            "                reshard_after_forward=False)",
        ]
    stages = "stages" if h.pp_schedule == "interleaved-1f1b" else "stages[0]"
    lines += [
        "stages = [",
        '    PipelineStage(part, i, n_stages, torch.device("cuda"), group=mesh["pp"].get_group())',
        "    for part, i in zip(parts, indices)",
        "]",
        f"schedule = {schedule}({stages}, n_microbatches={microbatches}, loss_fn=loss_fn)",
        "params = [p for part in parts for p in part.parameters()]",
        "optimizer = torch.optim.AdamW(params, lr=1e-4)",
        "",
        f"for batch in loader:  # local batch {plan.micro_batch} a data-parallel rank",
        '    x, y = batch["input_ids"].cuda(), batch["labels"].cuda()',
        "    if 0 in indices:",
        "        schedule.step(x, target=y if n_stages - 1 in indices else None)",
        "    elif n_stages - 1 in indices:",
        "        schedule.step(target=y)",
        "    else:",
        "        schedule.step()",
        "    optimizer.step()",
        "    optimizer.zero_grad(set_to_none=True)",
    ]
    return "\n".join(lines) + "\n"
