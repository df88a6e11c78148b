"""Ready-to-paste training code for the configuration a report found.

Three dialects: Hugging Face `Trainer`, a Lightning `Trainer`, and a plain PyTorch loop. Each is
generated from the settings and the batch plan, never from hand-typed numbers, and carries every
setting that moved the measured answer: micro-batch and accumulation, precision, optimizer (down
to its foreach / fused implementation), gradient checkpointing, LoRA, quantized base weights
(`BitsAndBytesConfig`, `prepare_model_for_kbit_training`), gradient clipping, Liger's kernels
(`use_liger_kernel=True`), the attention implementation, a chunked loss, and the evaluation
pass's batch and accumulation (`per_device_eval_batch_size`, `eval_accumulation_steps`). The
test suite builds the Hugging Face and peft objects from the text and runs the PyTorch loop.

`model` and `dataset` in the code are the user's. This module writes text: it never imports torch
at import time; only a LoRA snippet asks `adapters` for the config, which builds the model on the
meta device to read it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from memorymark import models
from memorymark.reporting import checkpointing_code, pipeline_code
from memorymark.search.plan import TrainingPlan
from memorymark.settings import HF_OPTIM_NAMES, Settings
from memorymark.step import adapters

SNIPPET_FORMATS = ("hf", "lightning", "torch")

_AUTOCAST_DTYPE = {"bf16-mixed": "torch.bfloat16", "16-mixed": "torch.float16"}

# What MemoryMark's optimizers.build_optimizer builds, as code (lr does not move memory).
# adamw and sgd leave foreach unset: PyTorch then picks its foreach kernels on CUDA.
_OPTIMIZER_CODE = {
    "adamw": "torch.optim.AdamW(params, lr={lr})",
    "adamw-fused": "torch.optim.AdamW(params, lr={lr}, fused=True)",
    "adamw-forloop": "torch.optim.AdamW(params, lr={lr}, foreach=False)",
    "sgd": "torch.optim.SGD(params, lr={lr}, momentum=0.9)",
    "sgd-forloop": "torch.optim.SGD(params, lr={lr}, momentum=0.9, foreach=False)",
    # Adafactor's defaults (relative_step, scale_parameter) are what MemoryMark runs.
    "adafactor": "transformers.optimization.Adafactor(params, lr=None)",
    # bitsandbytes' own classes, as optimizers.py builds them (min_8bit_size=4096, blockwise).
    "adamw-8bit": "bnb.optim.AdamW8bit(params, lr={lr})",
    "paged-adamw-8bit": "bnb.optim.PagedAdamW8bit(params, lr={lr})",
    "paged-adamw-32bit": "bnb.optim.PagedAdamW32bit(params, lr={lr})",
    "lion-8bit": "bnb.optim.Lion8bit(params, lr={lr})",
}
_DEFAULT_LR = {"sgd": "1e-3", "sgd-forloop": "1e-3"}

# Trainer's own optimizer matches the measured one for these `optim` names. Not for SGD: its
# Trainer SGD has no momentum (only newer transformers read optim_args="momentum=0.9"), and the
# for-loop variants have no name, so those are handed to Trainer as an instance.
_HF_OPTIM = {k: v for k, v in HF_OPTIM_NAMES.items() if not k.startswith("sgd")}

# The others are built in the snippet and handed to Trainer, for this reason.
_HF_INSTANCE_WHY = {
    "sgd": "# Trainer's SGD has no momentum; the measured one keeps a momentum buffer: pass it.",
    "sgd-forloop": "# Trainer has no name for SGD's for-loop (foreach=False) kernels: pass it.",
    "adamw-forloop": "# Trainer has no name for AdamW's for-loop (foreach=False) kernels: pass it.",
}

_NO_OPTIMIZER = "# The measured step had no optimizer (inference-style): forward and backward only."


def snippet(fmt: str, settings: Settings, plan: TrainingPlan) -> str:
    """The code for one dialect (`hf`, `lightning` or `torch`)."""
    if settings.hardware.pp > 1 and fmt in SNIPPET_FORMATS:
        # Trainer and Lightning's strategies do not pipeline: the PyTorch calls do.
        if fmt == "torch":
            return pipeline_code.program(settings, plan)
        return (
            f"# {fmt}: no pipeline parallelism in its Trainer; see the torch snippet "
            "(torch.distributed.pipelining) or torchtitan:\n"
            + "".join(
                f"#   {line}".rstrip() + "\n"
                for line in pipeline_code.torchtitan_fragment(settings, plan).splitlines()
            )
        )
    if fmt == "hf":
        return _hf(settings, plan)
    if fmt == "lightning":
        return _lightning(settings, plan)
    if fmt == "torch":
        return _torch(settings, plan)
    raise ValueError(f"format must be one of {', '.join(SNIPPET_FORMATS)} (got {fmt!r})")


def _hf(settings: Settings, plan: TrainingPlan) -> str:
    lines = _about(settings) + _prepare_model(
        settings, weights=True, checkpointing=False, liger=False
    )
    if settings.workload.optimizer == "none":
        lines += [_NO_OPTIMIZER, "# Trainer always builds one: training needs more memory."]
    lines += ["", *_training_arguments(settings, plan)]
    trainer = "trainer = Trainer(model=model, args=args, train_dataset=dataset"
    if settings.workload.optimizer in _HF_INSTANCE_WHY:
        lines += [
            _HF_INSTANCE_WHY[settings.workload.optimizer],
            "params = [p for p in model.parameters() if p.requires_grad]",
            f"optimizer = {_optimizer_code(settings.workload.optimizer, lr='args.learning_rate')}",
        ]
        trainer += ", optimizers=(optimizer, None)"
    imports = ["from transformers import Trainer, TrainingArguments"]
    return _program(imports, lines + [trainer + ")", "trainer.train()"])


def _training_arguments(settings: Settings, plan: TrainingPlan) -> list[str]:
    lines = [
        "args = TrainingArguments(",
        '    output_dir="out",',
        f"    per_device_train_batch_size={plan.micro_batch},",
        f"    gradient_accumulation_steps={plan.accumulation_steps},",
        f"    bf16={settings.workload.precision == 'bf16-mixed'},",
        f"    fp16={settings.workload.precision == '16-mixed'},",
    ]
    if settings.workload.kernels == "liger":
        lines.append("    use_liger_kernel=True,  # pip install liger-kernel")
    lines += checkpointing_code.trainer_arguments(settings.workload.checkpointing)
    if settings.workload.optimizer in _HF_OPTIM:
        lines.append(f'    optim="{_HF_OPTIM[settings.workload.optimizer]}",')
    lines += _hf_distributed(settings)
    lines += _hf_evaluation(settings)
    if settings.workload.max_grad_norm is None:
        lines.append("    max_grad_norm=0.0,  # measured without clipping; Trainer clips at 1.0")
    else:
        lines.append(f"    max_grad_norm={settings.workload.max_grad_norm},")
    return [*lines, ")"]


def _hf_evaluation(settings: Settings) -> list[str]:
    """The evaluation pass measured between training steps: its batch, and how many batches'
    predictions stay on the GPU (unset, Trainer keeps every one until the eval set ends)."""
    if settings.workload.eval_batch is None:
        return []
    accumulation = f"    eval_accumulation_steps={settings.workload.eval_batches_kept},"
    if settings.workload.eval_accumulation is None:
        accumulation += "  # as measured; unset, every prediction stays on the GPU"
    return [
        f"    per_device_eval_batch_size={settings.workload.eval_batch},",
        accumulation,
        '    # eval_strategy="steps" and Trainer(eval_dataset=...) to evaluate as measured',
    ]


def _hf_distributed(settings: Settings) -> list[str]:
    """Trainer's FSDP2 arguments (launch with torchrun or accelerate launch, one process a GPU;
    DDP needs none)."""
    if settings.hardware.dist not in ("fsdp", "fsdp-no-reshard", "hsdp"):
        return []
    shard = "hybrid_shard" if settings.hardware.dist == "hsdp" else "full_shard"
    reshard = settings.hardware.dist != "fsdp-no-reshard"
    if settings.hardware.offload == "cpu":
        shard += " offload"
    return [
        f'    fsdp="{shard} auto_wrap",  # one process per GPU: torchrun or accelerate launch',
        f'    fsdp_config={{"fsdp_version": 2, "reshard_after_forward": {reshard}}},',
    ]


def _lightning(settings: Settings, plan: TrainingPlan) -> str:
    optimizer = settings.workload.optimizer != "none"
    # precision="bf16-true" converts the weights itself.
    lines = _about(settings) + _prepare_model(settings, weights=False, checkpointing=True)
    lines += [
        "",
        "",
        "class LitModel(L.LightningModule):",
        "    def __init__(self, model):",
        "        super().__init__()",
        "        self.model = model",
        "",
        "    def training_step(self, batch, batch_idx):",
        f"        return {_loss_code(settings, 'self.model')}",
        "",
        "    def configure_optimizers(self):",
    ]
    if not optimizer:
        lines += ["        " + _NO_OPTIMIZER, "        return None"]
    else:
        lines += [
            "        params = [p for p in self.parameters() if p.requires_grad]",
            f"        return {_optimizer_code(settings.workload.optimizer)}"
            if settings.hardware.dist != "zero1"
            else f"        return {_zero1_code(settings.workload.optimizer)}",
        ]
    lines += [
        "",
        "",
        f"loader = DataLoader(dataset, batch_size={plan.micro_batch}, shuffle=True)",
        "trainer = L.Trainer(",
        f'    precision="{settings.workload.precision}",',
        f"    accumulate_grad_batches={plan.accumulation_steps},",
    ]
    if settings.workload.max_grad_norm is not None:
        lines.append(f"    gradient_clip_val={settings.workload.max_grad_norm},")
    if settings.hardware.dist != "none" and settings.hardware.gpu_count:
        nodes = settings.hardware.node_count
        strategy = {"ddp": '"ddp"', "zero1": '"ddp"'}.get(settings.hardware.dist, '"fsdp"')
        lines += [
            f"    devices={settings.hardware.gpu_count // nodes},",
            f"    num_nodes={nodes},",
            f"    strategy={strategy},  # --dist {settings.hardware.dist}",
        ]
    imports = ["import lightning as L", "from torch.utils.data import DataLoader"]
    return _program(imports, lines + [")", "trainer.fit(LitModel(model), loader)"])


def _torch(settings: Settings, plan: TrainingPlan) -> str:
    optimizer = settings.workload.optimizer != "none"
    clip = optimizer and settings.workload.max_grad_norm is not None
    many = settings.hardware.dist != "none" or settings.hardware.tp * settings.hardware.cp > 1
    lines = _about(settings) + (["device = _local_device()"] if many else ['device = "cuda"'])
    if settings.workload.quantization == "none":
        lines.append("model = model.to(device)")
    else:
        lines.append("# from_pretrained put the quantized weights on the GPU; .to() would refuse.")
    lines += _prepare_model(settings, weights=True, checkpointing=True)
    lines += _spread(settings) if many else []
    sampler = ", sampler=DistributedSampler(dataset)" if many else ", shuffle=True"
    parallel = settings.hardware.tp * settings.hardware.cp > 1
    if parallel:  # the tp and cp ranks of one data-parallel rank share its batch
        dp = settings.hardware.layout(settings.hardware.gpu_count or 1).dp
        sampler = f", sampler=DistributedSampler(dataset, num_replicas={dp}, rank=dp_rank)"
    lines += [
        "",
        f"loader = DataLoader(dataset, batch_size={plan.micro_batch}{sampler})",
        f"accumulation_steps = {plan.accumulation_steps}",
    ]
    if clip:
        lines.append(f"max_grad_norm = {settings.workload.max_grad_norm}")
    if optimizer:
        lines.append("params = [p for p in model.parameters() if p.requires_grad]")
        optimizer_code = _optimizer_code(settings.workload.optimizer)
        if settings.hardware.dist == "zero1":
            optimizer_code = _zero1_code(settings.workload.optimizer)
        lines.append(f"optimizer = {optimizer_code}")
    else:
        lines.append(_NO_OPTIMIZER)
    if optimizer and settings.workload.precision == "16-mixed":
        lines.append("scaler = torch.amp.GradScaler(device)")
    mode = (
        "model.train()"
        if settings.workload.mode == "train"
        else "model.eval()  # measured in eval mode"
    )
    imports = ["from torch.utils.data import DataLoader"]
    if many:
        imports = [*imports, *_DIST_IMPORTS]
        if settings.hardware.dist in ("fsdp", "fsdp-no-reshard", "hsdp") or many:
            imports += [
                "from torch.distributed.device_mesh import init_device_mesh",
                "from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, "
                "fully_shard",
            ]
        if settings.hardware.dist == "zero1":
            imports.append("from torch.distributed.optim import ZeroRedundancyOptimizer")
        if settings.hardware.tp * settings.hardware.cp > 1:
            imports += _PARALLEL_IMPORTS
        lines = [*_LOCAL_DEVICE, "", *lines]
    loop = _torch_loop(settings, clip)
    if parallel:
        toml = torchtitan_toml(settings).splitlines()
        loop += ["", "# The same layout in a torchtitan job config:", *(f"# {t}" for t in toml)]
    return _program(imports, lines + [mode] + loop)


_DIST_IMPORTS = [
    "import os",
    "from torch.utils.data.distributed import DistributedSampler",
]
_LOCAL_DEVICE = [
    "def _local_device():",
    '    """One process per GPU, as torchrun starts them (it sets LOCAL_RANK)."""',
    '    torch.distributed.init_process_group("nccl")',
    '    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))',
    '    return "cuda"  # this process\'s GPU, the current device',
    "",
]


def _spread(settings: Settings) -> list[str]:
    """The model spread over the ranks as the simulation spreads it
    (memorymark/backends/sharding.py)."""
    n = settings.hardware.gpu_count or 1
    nodes = settings.hardware.node_count if settings.hardware.gpu_count else 1
    head = [
        f"# Run with: torchrun --nnodes {nodes} --nproc-per-node {n // nodes} train.py "
        f"(--dist {settings.hardware.dist})"
    ]
    if settings.hardware.tp * settings.hardware.cp > 1:
        return head + _parallel_spread(settings)
    if settings.hardware.dist in ("ddp", "zero1"):
        return head + [
            "model = torch.nn.parallel.DistributedDataParallel(",
            "    model, device_ids=[torch.cuda.current_device()]",
            ")",
        ]
    shape = f"({nodes}, {n // nodes})" if settings.hardware.dist == "hsdp" else f"({n},)"
    lines = head + [
        f'mesh = init_device_mesh("cuda", {shape})',
    ]
    kwargs = "mesh=mesh"
    dtype = _AUTOCAST_DTYPE.get(settings.workload.precision)
    if dtype and settings.hardware.mp_policy == "auto":
        lines.append(
            f"mp_policy = MixedPrecisionPolicy(param_dtype={dtype}, reduce_dtype=torch.float32)"
        )
        kwargs += ", mp_policy=mp_policy"
    if settings.hardware.offload == "cpu":
        kwargs += ", offload_policy=CPUOffloadPolicy()"
    if settings.hardware.dist == "fsdp-no-reshard":
        kwargs += ", reshard_after_forward=False"
    return lines + [
        "# Each transformer block, then the root, as torchtitan and Accelerate do.",
        "blocks = set(getattr(model, '_no_split_modules', None) or ())",
        "for block in [m for m in model.modules() if type(m).__name__ in blocks]:",
        f"    fully_shard(block, {kwargs})",
        f"fully_shard(model, {kwargs})",
    ]


_PARALLEL_IMPORTS = [
    "import contextlib",
    "from torch.distributed.tensor import Replicate, Shard",
    "from torch.distributed.tensor.experimental import context_parallel",
    "from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, "
    "RowwiseParallel, SequenceParallel, loss_parallel, parallelize_module",
]


def _parallel_spread(settings: Settings) -> list[str]:
    """Tensor and context parallelism, then FSDP2, as the simulation applies them
    (memorymark/backends/tensor_parallel.py, context_parallel.py, sharding.py)."""
    hw = settings.hardware
    layout = hw.layout(hw.gpu_count or hw.tp * hw.cp)
    shape, names = layout.mesh()
    lines = [
        f"# {layout.describe()}: torchtitan's mesh (pp, dp_replicate, dp_shard, cp, tp).",
        f'mesh = init_device_mesh("cuda", {shape}, mesh_dim_names={names})',
        'dp_rank = mesh["dp_shard"].get_local_rank() if "dp_shard" in mesh.mesh_dim_names else 0',
    ]
    if hw.tp > 1:
        lines += _tp_lines()
    lines += _train_context_lines(hw.tp > 1, hw.cp > 1)
    sharded = [n for n in ("dp_shard", "cp") if n in names]
    if not sharded:
        return lines
    if len(sharded) == 1:
        lines.append(f'dp_mesh = mesh["{sharded[0]}"]')
    else:  # the cp ranks hold the same weights: FSDP2 shards over dp_shard x cp (torchtitan)
        lines.append('dp_mesh = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")')
    kwargs = "mesh=dp_mesh"
    dtype = _AUTOCAST_DTYPE.get(settings.workload.precision)
    if dtype and hw.mp_policy == "auto":
        lines.append(
            f"mp_policy = MixedPrecisionPolicy(param_dtype={dtype}, reduce_dtype=torch.float32)"
        )
        kwargs += ", mp_policy=mp_policy"
    if hw.offload == "cpu":
        kwargs += ", offload_policy=CPUOffloadPolicy()"
    if hw.dist == "fsdp-no-reshard":
        kwargs += ", reshard_after_forward=False"
    return lines + [
        "for block in [m for m in model.modules() if type(m).__name__ in blocks]:",
        f"    fully_shard(block, {kwargs})",
        f"fully_shard(model, {kwargs})",
    ]


def _tp_lines() -> list[str]:
    """The model's own plan (config.base_model_tp_plan) applied as torchtitan applies its
    Llama plan: sequence-parallel norms, the residual stream split on the sequence."""
    return [
        "# Tensor parallelism with the model's own plan, as torchtitan applies its Llama plan.",
        'tp_mesh = mesh["tp"]',
        'plan = {k.split(".*.", 1)[1]: v for k, v in model.config.base_model_tp_plan.items()}',
        "styles = {",
        '    "colwise": ColwiseParallel,',
        '    "rowwise": lambda: RowwiseParallel(output_layouts=Shard(1), use_local_output=False),',
        '    "replicated_with_grad_allreduce": lambda: SequenceParallel(use_local_output=True),',
        "}",
        "blocks = set(getattr(model, '_no_split_modules', None) or ())",
        "for block in [m for m in model.modules() if type(m).__name__ in blocks]:",
        "    layer_plan = {name: styles[style]() for name, style in plan.items()}",
        "    for name, child in block.named_children():",
        '        if "Norm" in type(child).__name__:',
        "            layer_plan[name] = SequenceParallel()",
        '    layer_plan["self_attn"] = PrepareModuleInput(',
        '        input_kwarg_layouts={"hidden_states": Shard(1)},',
        '        desired_input_kwarg_layouts={"hidden_states": Replicate()},',
        "    )",
        '    layer_plan["mlp"] = PrepareModuleInput(',
        "        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)",
        "    )",
        "    parallelize_module(block, tp_mesh, layer_plan)",
        "# Logits stay split by vocabulary: the loss runs under loss_parallel().",
        "parallelize_module(model, tp_mesh, {",
        '    "model.embed_tokens": RowwiseParallel(',
        "        input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False",
        "    ),",
        '    "model.norm": SequenceParallel(),',
        '    "lm_head": ColwiseParallel(',
        "        input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False",
        "    ),",
        "})",
    ]


def _train_context_lines(tp: bool, cp: bool) -> list[str]:
    """`train_context(batch)`: what forward and backward run inside."""
    lines = [
        "",
        "",
        "def train_context(batch):",
        '    """loss_parallel for split logits; context parallelism shards the batch in place."""',
        "    stack = contextlib.ExitStack()",
    ]
    if tp:
        lines.append("    stack.enter_context(loss_parallel())")
    if cp:
        lines += [
            '    ids, labels = batch["input_ids"], batch["labels"]',
            "    stack.enter_context(context_parallel(",
            '        mesh["cp"], buffers=[ids, labels], buffer_seq_dims=[1, 1],',
            "        no_restore_buffers={ids, labels},",
            "    ))",
        ]
    lines += ["    return stack", "", ""]
    if not tp:
        lines.append("blocks = set(getattr(model, '_no_split_modules', None) or ())")
    return lines


def torchtitan_toml(settings: Settings) -> str:
    """The layout as a torchtitan job-config fragment (its `[parallelism]` section)."""
    hw = settings.hardware
    layout = hw.layout(hw.gpu_count or hw.model_parallel)
    return "\n".join(
        [
            "[parallelism]",
            f"data_parallel_replicate_degree = {layout.dp_replicate}",
            f"data_parallel_shard_degree = {layout.dp_shard}",
            f"tensor_parallel_degree = {hw.tp}",
            f"context_parallel_degree = {hw.cp}",
            f"pipeline_parallel_degree = {hw.pp}",
            f"disable_loss_parallel = {'false' if hw.tp > 1 else 'true'}",
        ]
    )


def _zero1_code(name: str) -> str:
    """zero1's optimizer: the measured one, its state partitioned over the ranks."""
    inner = _optimizer_code(name).split("(", 1)
    return (
        "ZeroRedundancyOptimizer("
        f"params, optimizer_class={inner[0]}, {inner[1].removeprefix('params, ')}"
    )


def _torch_loop(settings: Settings, clip: bool) -> list[str]:
    """The loop as Workload.run_step runs it: micro-batches, then clip, step and zero_grad."""
    dtype = _AUTOCAST_DTYPE.get(settings.workload.precision)
    optimizer = settings.workload.optimizer != "none"
    scaler = optimizer and settings.workload.precision == "16-mixed"
    loss = f"loss = {_loss_code(settings, 'model')} / accumulation_steps"
    lines = ["for i, batch in enumerate(loader):"] + _to_device(settings)
    step: list[str] = []
    if dtype:  # autocast around forward and loss only, as the PyTorch AMP recipe does
        step += [f"    with torch.autocast(device, dtype={dtype}):", f"        {loss}"]
    else:
        step.append(f"    {loss}")
    step.append("    scaler.scale(loss).backward()" if scaler else "    loss.backward()")
    if settings.hardware.tp * settings.hardware.cp > 1:
        # loss_parallel and context parallelism hold over forward and backward both.
        step = ["    with train_context(batch):", *("    " + line for line in step)]
    lines += step
    lines.append("    if (i + 1) % accumulation_steps == 0:")
    if not optimizer:
        return lines + ["        model.zero_grad(set_to_none=True)"]
    if clip and scaler:
        lines.append("        scaler.unscale_(optimizer)  # clip the true gradients")
    if clip:
        lines.append("        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)")
    if scaler:
        lines += ["        scaler.step(optimizer)", "        scaler.update()"]
    else:
        lines.append("        optimizer.step()")
    return lines + ["        optimizer.zero_grad(set_to_none=True)"]


def _about(settings: Settings) -> list[str]:
    """Comments on what the batch size holds for: the input size, and eager attention."""
    if models.find_model(settings.workload.model).input_kind == "image":
        size = f"{settings.workload.image_size}x{settings.workload.image_size} images"
    else:
        size = f"{settings.workload.seq_len} tokens per sample"
    lines = [f"# Measured for {settings.workload.model} at {size}: larger inputs need more memory."]
    if settings.workload.attention in ("eager", "flash_attention_2"):
        name = "eager attention" if settings.workload.attention == "eager" else "FlashAttention-2"
        lines.append(
            f"# Measured with {name}: load with "
            f'attn_implementation="{settings.workload.attention}".'
        )
    if settings.workload.loss_chunks:
        lines += [
            f"# Measured with the output layer and loss in {settings.workload.loss_chunks} chunks: "
            "torchtune's",
            "# CEWithChunkedOutputLoss with the model's "
            f"num_output_chunks={settings.workload.loss_chunks}.",
        ]
    return lines


def _prepare_model(
    settings: Settings, *, weights: bool, checkpointing: bool, liger: bool = True
) -> list[str]:
    """Quantized loading, bf16 weights, Liger, LoRA, then checkpointing: the order
    Workload.build_model applies them in. `weights` / `checkpointing` / `liger`: the code
    converts / checkpoints / patches the model itself (Trainer does the last two from its
    arguments, full checkpointing only: the other modes are set on the model)."""
    lines = _quantized_loading(settings)
    if (
        weights
        and settings.workload.precision == "bf16-true"
        and settings.workload.quantization != "none"
    ):
        lines.append("# bf16-true: load with from_pretrained(..., dtype=torch.bfloat16).")
    elif weights and settings.workload.precision == "bf16-true":
        lines += [
            "# bf16-true: weights, gradients and optimizer state in bf16, no autocast (or load",
            "# the model with from_pretrained(..., dtype=torch.bfloat16); torch_dtype= before v5).",
            "model = model.to(torch.bfloat16)",
        ]
    if liger and settings.workload.kernels == "liger":
        # What Trainer's use_liger_kernel=True calls (liger-kernel), before LoRA wraps the model.
        lines.append("_apply_liger_kernel_to_instance(model=model)")
    if settings.workload.lora_rank:
        kwargs = adapters.lora_config_for(
            settings.workload.model,
            settings.workload.resolved_task,
            settings.workload.lora_rank,
            settings.workload.lora_targets,
        )
        lines.append("lora_config = LoraConfig(")
        lines += [f"    {key}={_literal(value)}," for key, value in kwargs.items()]
        lines += [")", "model = get_peft_model(model, lora_config)"]
    lines += _float8_code(settings)
    lines += checkpointing_code.model_code(
        settings.workload.checkpointing, trainer=not checkpointing
    )
    return lines + _compile_code(settings)


def _float8_code(settings: Settings) -> list[str]:
    """torchao's conversion as memorymark/step/float8.py applies it (torchtitan's filter)."""
    recipe = settings.workload.float8
    if recipe == "none":
        return []
    return [
        "# Float8 linear layers (pip install torchao), the output layer kept in high precision.",
        "convert_to_float8_training(",
        "    model,",
        f'    config=Float8LinearConfig.from_recipe_name("{recipe}"),',
        '    module_filter_fn=lambda mod, fqn: fqn.split(".")[-1]',
        '    not in ("output", "lm_head", "classifier", "score")',
        "    and mod.in_features % 16 == 0 and mod.out_features % 16 == 0,",
        ")",
    ]


def _compile_code(settings: Settings) -> list[str]:
    """torch.compile on each block in place, as measured (torchtitan's per-block compile)."""
    w = settings.workload
    if not w.compile:
        return []
    lines = []
    if w.activation_memory_budget != 1.0:
        lines.append(
            f"torch._functorch.config.activation_memory_budget = {w.activation_memory_budget}"
        )
    return [
        *lines,
        "# torch.compile each transformer block in place (the whole model if it has none).",
        "blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]",
        "for block in blocks or [model]:",
        "    block.compile()",
    ]


_COMPUTE_DTYPE = {"bf16-mixed": "torch.bfloat16", "bf16-true": "torch.bfloat16"}


def _quantized_loading(settings: Settings) -> list[str]:
    """`BitsAndBytesConfig` for from_pretrained, then peft's k-bit preparation, as
    memorymark/step/quantization.py builds the measured model."""
    method = settings.workload.quantization
    if method == "none":
        return []
    if method == "int8":
        config = ["    load_in_8bit=True,"]
    else:
        dtype = _COMPUTE_DTYPE.get(settings.workload.precision, "torch.float16")
        if settings.workload.precision == "32-true":
            dtype = "torch.float32"
        config = [
            "    load_in_4bit=True,",
            f'    bnb_4bit_quant_type="{method}",',
            f"    bnb_4bit_use_double_quant={settings.workload.double_quant},",
            f"    bnb_4bit_compute_dtype={dtype},",
        ]
    return [
        f"# Base weights measured as bitsandbytes {method}: load the model with",
        "# from_pretrained(MODEL_ID, quantization_config=bnb_config).",
        "bnb_config = BitsAndBytesConfig(",
        *config,
        ")",
        "# Freezes the base, casts the other weights (embeddings, head, norms) to fp32.",
        "model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)",
    ]


def _optimizer_code(name: str, lr: str | None = None) -> str:
    return _OPTIMIZER_CODE[name].format(lr=lr or _DEFAULT_LR.get(name, "1e-4"))


def _loss_code(settings: Settings, model: str) -> str:
    if settings.workload.loss == "logits-mean":
        return f"{model}(**batch).logits.mean()"
    return f"{model}(**batch).loss"


def _to_device(settings: Settings) -> list[str]:
    if settings.workload.precision == "bf16-true":
        # Pixels must match the bf16 weights, as Lightning's bf16-true plugin converts inputs.
        return [
            "    batch = {",
            "        k: v.to(device, torch.bfloat16) if v.is_floating_point() else v.to(device)",
            "        for k, v in batch.items()",
            "    }",
        ]
    return ["    batch = {k: v.to(device) for k, v in batch.items()}"]


def _literal(value: Any) -> str:
    """Python source for a config value, with double-quoted strings as ruff formats them."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


def _merged_froms(imports: list[str]) -> list[str]:
    """One `from M import ...` per module, names ordered as ruff's isort orders them (classes
    before functions, each alphabetical)."""
    names: dict[str, set[str]] = {}
    for line in imports:
        module, _, listed = line[len("from ") :].partition(" import ")
        names.setdefault(module, set()).update(n.strip() for n in listed.split(","))
    return [
        f"from {module} import {', '.join(sorted(names[module], key=_isort_key))}"
        for module in sorted(names)
    ]


def _isort_key(name: str) -> tuple[int, str]:
    return (0 if name[:1].isupper() else 1, name)


def _program(imports: list[str], body: list[str]) -> str:
    """`body` under its imports: the ones given, and those its code uses, sorted as isort does."""
    code = "\n".join(line.split("#")[0] for line in body)  # comments import nothing
    for module in ("torch", "transformers"):
        if re.search(rf"\b{module}\.", code):
            imports = [*imports, f"import {module}"]
    if re.search(r"\bbnb\.", code):
        imports = [*imports, "import bitsandbytes as bnb"]
    if "BitsAndBytesConfig(" in code:
        imports = [*imports, "from transformers import BitsAndBytesConfig"]
    if "_apply_liger_kernel_to_instance(" in code:
        imports = [
            *imports,
            "from liger_kernel.transformers import _apply_liger_kernel_to_instance",
        ]
    imports = [*imports, *checkpointing_code.imports_for(code)]
    if "GradientCheckpointingLayer)" in code:
        imports = [*imports, "from transformers.modeling_layers import GradientCheckpointingLayer"]
    if "convert_to_float8_training(" in code:
        imports = [
            *imports,
            "from torchao.float8 import Float8LinearConfig, convert_to_float8_training",
        ]
    peft_names = [n for n in ("LoraConfig", "get_peft_model") if f"{n}(" in code]
    if "prepare_model_for_kbit_training(" in code:
        peft_names.append("prepare_model_for_kbit_training")
    if peft_names:
        imports = [*imports, f"from peft import {', '.join(peft_names)}"]
    plain = sorted(i for i in imports if i.startswith("import "))
    froms = _merged_froms([i for i in imports if i.startswith("from ")])
    return "\n".join([*plain, *froms, "", *body]) + "\n"
