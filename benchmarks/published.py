"""Published peak GPU memory of real training steps, each beside MemoryMark's simulated prediction.

Each row is one figure a public source printed after training on a real GPU: the exact text, the
settings that reproduce that step in MemoryMark, and which quantity the figure is:

- allocated: `torch.cuda.max_memory_allocated()`, against the predicted allocated bytes;
- reserved: `torch.cuda.max_memory_reserved()`, against the predicted reserved bytes;
- device-used: what NVML / nvidia-smi report as used on the device, against the predicted
  reserved bytes plus the CUDA context: the source's own measurement of its context where it
  printed one, else MemoryMark's estimate for the GPU (`memorymark.gpus`).

Every prediction is simulated on fake tensors (no GPU), 3 to 35 s a row on 2 cores. This file owns
the rows and the comparison; it knows nothing of how the simulation works. Each row's `difference`
says what the source's run did that MemoryMark's step does not: read it before the error.

    PYTHONPATH=. python benchmarks/published.py [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memorymark.engine import Session
from memorymark.gpus import find_gpu
from memorymark.settings import Settings
from memorymark.units import GIB, MIB

QUANTITIES = ("allocated", "reserved", "device-used")
CONFIGS = Path(__file__).resolve().parent / "configs"


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRow:
    """One published measurement of a training step's peak GPU memory."""

    source: str
    """Where the figure is printed: a URL pinned to a commit."""
    quote: str
    """The source's exact text around the figure."""
    experiment: str
    """The source's own name for the run (a section title or a script)."""
    model: str
    """The model, for display."""
    gpu: str
    """Catalog name of the GPU the source trained on."""
    settings: dict[str, Any]
    """`Settings` keywords reproducing the step (backend and gpu are added)."""
    batch_size: int
    """Micro-batch size (samples per forward pass)."""
    measured_bytes: int
    """The published figure, in bytes."""
    quantity: str
    """allocated, reserved or device-used (see the module docstring)."""
    context_bytes: int | None = None
    """device-used only: the CUDA context the source measured; None takes MemoryMark's estimate."""
    difference: str = ""
    """What the source's run did that MemoryMark's step does not, in one line."""

    def __post_init__(self) -> None:
        if not self.source.startswith("https://"):
            raise ValueError(f"source must be a URL (got {self.source!r})")
        if not self.quote.strip():
            raise ValueError(f"{self.experiment}: the quote is empty")
        if self.quantity not in QUANTITIES:
            raise ValueError(f"quantity must be one of {', '.join(QUANTITIES)}")
        if self.batch_size < 1 or self.measured_bytes <= 0:
            raise ValueError(f"{self.experiment}: batch size and measured bytes must be positive")
        if self.context_bytes is not None and self.quantity != "device-used":
            raise ValueError(f"{self.experiment}: a context applies to device-used figures only")

    def to_settings(self) -> Settings:
        """The simulated run on the source's GPU."""
        return Settings(backend="sim", gpu=self.gpu, **self.settings)


# --- huggingface/transformers docs: "Efficient Training on a Single GPU" ----------------------
# bert-large-uncased (2 labels), 512 random tokens per sample, Trainer on a V100 16GB (the page's
# nvidia-smi: "Tesla V100-SXM2... 16160MiB"), `info.used//1024**2` from pynvml printed after
# trainer.train(): the CUDA context plus everything the caching allocator still holds.
HF_DOCS = (
    "https://github.com/huggingface/transformers/blob/0016acf7ef421c7fe8eff7945de52c71896c3b01/"
    "docs/source/en/perf_train_gpu_one.mdx"
)
# The page measures its context: "torch.ones((1, 1)).to("cuda")" then "GPU memory occupied: 1343
# MB.", of which 2 MiB is the caching allocator's segment holding that tensor.
HF_DOCS_CONTEXT_BYTES = (1343 - 2) * MIB
# Trainer of early 2022: optim "adamw_hf" (transformers' own AdamW, a loop over tensors; the page
# lists `--optim {adamw_hf,adamw_torch,...}`), max_grad_norm 1.0, fp16 via torch.cuda.amp; BERT
# then ran attention as matmul-softmax-dropout-matmul (no SDPA in that transformers).
_TRAINER_2022 = {
    "model": "bert-large",
    "seq_len": 512,
    "attention": "eager",
    "optimizer": "adamw-forloop",
    "max_grad_norm": 1.0,
}
_ZEROED_GRADS = (
    "Trainer's model.zero_grad() under torch 1.x zeroes gradients in place (set_to_none=False), "
    "so they stay allocated through every forward; MemoryMark's loop frees them after the step"
)


def _hf_row(experiment: str, quote: str, mib: int, batch: int, **settings: Any) -> PublishedRow:
    accumulates = settings.get("grad_accum", 1) > 1  # then gradients are alive in both loops
    return PublishedRow(
        source=HF_DOCS,
        quote=quote,
        experiment=experiment,
        model="BERT-large",
        gpu="V100 16GB",
        settings={**_TRAINER_2022, **settings},
        batch_size=batch,
        measured_bytes=mib * MIB,
        quantity="device-used",
        context_bytes=HF_DOCS_CONTEXT_BYTES,
        difference="" if accumulates else _ZEROED_GRADS,
    )


# --- rasbt/pytorch-memory-optim (Sebastian Raschka, June 2023) --------------------------------
# torchvision's vit_l_16 with a 10-class head, CIFAR-10 resized to 224 px, torch.optim.Adam (lr
# 5e-5; foreach on CUDA), torch 2.1.0.dev20230623+cu118, Lightning Fabric on one GPU; each script
# prints `torch.cuda.max_memory_reserved() / 1e9` after training. logs.md holds the outputs.
# The GPU is not named; bf16 ran, so Ampere or newer: an A100 is assumed, whose sm80 attention
# kernels are what the prediction depends on.
RASBT = (
    "https://github.com/rasbt/pytorch-memory-optim/blob/f6eddcd28c40770a097ffd9f18797a043457a2d0"
)
_VIT_L16 = str(CONFIGS / "vit-large-patch16-224.json")
_TORCHVISION = "transformers' ViT-L/16 stands in for torchvision's vit_l_16 (same shapes)"
_ZERO_GRAD_AFTER_FORWARD = (
    "the script calls zero_grad() after the forward, so last step's gradients are alive through it"
)


def _rasbt_row(script: str, quote: str, gb: float, batch: int, **settings: Any) -> PublishedRow:
    accumulates = settings.get("grad_accum", 1) > 1  # its loop zeroes after the step then
    late_zero = "" if accumulates else f"; {_ZERO_GRAD_AFTER_FORWARD}"
    return PublishedRow(
        source=f"{RASBT}/logs.md",
        quote=quote,
        experiment=script,
        model="ViT-L/16",
        gpu="A100 40GB",
        settings={"model": f"file:{_VIT_L16}", "image_size": 224, "optimizer": "adamw", **settings},
        batch_size=batch,
        measured_bytes=round(gb * 1e9),
        quantity="reserved",
        difference=_TORCHVISION + late_zero,
    )


# --- Lightning-AI/litgpt: tutorials/resource-tables.md (October 2023) -------------------------
# finetune/lora.py on one A100-SXM4-40GB, torch 2.1.0, bitsandbytes 0.41.1, precision bf16-true;
# LoRA r=8, alpha 16, dropout 0.05 on the query and value projections (4,194,304 trainable
# parameters for Llama 2 7B, as peft's default targets give); micro-batch 1; the first iteration
# forces the longest Alpaca sample, 1304 Llama 2 tokens; no activation checkpointing. With
# --quantize bnb.* the script builds bnb.optim.PagedAdamW (32-bit, paged), else torch's AdamW.
# "Max GPU RAM" is the script's `torch.cuda.max_memory_allocated() / 1e9` after training
# (finetune/lora.py at cc190152, "Memory used: ... GB").
LITGPT = (
    "https://github.com/Lightning-AI/litgpt/blob/b73298666d31691e0c639d3f47b0d0829ba44dab/"
    "tutorials/resource-tables.md"
)
_LLAMA2_7B = str(CONFIGS / "llama-2-7b.json")
_LITGPT_DIFFERENCE = (
    "LitGPT's own Llama and QLoRA: lora_dropout 0.05 (a dropped copy of each adapted input, "
    "which MemoryMark's dropout-free LoRA lacks), a 128-row chunked lm_head and loss"
)
_LITGPT_QUANTIZED = (
    "; Lightning's bnb plugin also quantizes lm_head and keeps the embedding bf16, where "
    "peft's prepare_model_for_kbit_training (simulated) casts both to fp32: +0.72 GB here"
)


def _litgpt_row(quantize: str, gb: float, **settings: Any) -> PublishedRow:
    quote = (
        f"| 7 B   | Llama 2        | {quantize:<12} | 1               | 4,194,304            | "
        f"{gb:.2f} GB    |"
    )
    return PublishedRow(
        source=LITGPT,
        quote=quote,
        experiment=f"LoRA, Llama 2 7B, {quantize}",
        model="Llama-2-7B",
        gpu="A100 40GB",
        settings={
            "model": f"file:{_LLAMA2_7B}",
            "seq_len": 1304,
            "precision": "bf16-true",
            "lora_rank": 8,
            **settings,
        },
        batch_size=1,
        measured_bytes=round(gb * 1e9),
        quantity="allocated",
        difference=_LITGPT_DIFFERENCE + (_LITGPT_QUANTIZED if quantize != "None" else ""),
    )


ROWS: tuple[PublishedRow, ...] = (
    _hf_row(
        "Vanilla Training",
        "Time: 57.82\nSamples/second: 8.86\nGPU memory occupied: 14949 MB.",
        14949,
        4,
    ),
    _hf_row(
        "Gradient Accumulation",
        "Time: 66.03\nSamples/second: 7.75\nGPU memory occupied: 8681 MB.",
        8681,
        1,
        grad_accum=4,
    ),
    _hf_row(
        "Gradient Checkpointing",
        "Time: 85.47\nSamples/second: 5.99\nGPU memory occupied: 6775 MB.",
        6775,
        1,
        grad_accum=4,
        grad_checkpointing=True,
    ),
    _hf_row(
        "FP16 Training",
        "Time: 27.46\nSamples/second: 18.64\nGPU memory occupied: 13939 MB.",
        13939,
        4,
        precision="16-mixed",
    ),
    _hf_row(
        "FP16 + accum + checkpointing",
        "Time: 50.76\nSamples/second: 10.09\nGPU memory occupied: 7275 MB.",
        7275,
        1,
        grad_accum=4,
        grad_checkpointing=True,
        precision="16-mixed",
    ),
    _hf_row(
        "Adafactor",
        "Time: 64.31\nSamples/second: 7.96\nGPU memory occupied: 12295 MB.",
        12295,
        4,
        optimizer="adafactor",
    ),
    _hf_row(
        "Adafactor + accum + ckpt + FP16",
        "Time: 56.54\nSamples/second: 9.06\nGPU memory occupied: 4847 MB.",
        4847,
        1,
        grad_accum=4,
        grad_checkpointing=True,
        precision="16-mixed",
        optimizer="adafactor",
    ),
    _rasbt_row("01_pytorch-vit.py", "Time elapsed 17.94 min\nMemory used: 26.79 GB", 26.79, 64),
    _rasbt_row(
        "02_mixed-precision.py",
        "Time elapsed 3.45 min\nMemory used: 18.21 GB",
        18.21,
        64,
        precision="16-mixed",
    ),
    _rasbt_row(
        "03_bfloat16.py",
        "Time elapsed 2.88 min\nMemory used: 13.82 GB",
        13.82,
        64,
        precision="bf16-true",
    ),
    _rasbt_row(
        "04_lower-batchsize.py",
        "Time elapsed 3.96 min\nMemory used: 5.69 GB",
        5.69,
        16,
        precision="bf16-true",
    ),
    _rasbt_row(
        "05_gradient-accum.py",
        "Time elapsed 12.91 min\nMemory used: 3.91 GB",
        3.91,
        4,
        precision="bf16-true",
        grad_accum=4,
    ),
    # torch.optim.SGD(lr=0.01) has no momentum: no state, and its step updates in place, which
    # in memory is optimizer "none" (MemoryMark's sgd is momentum 0.9).
    _rasbt_row(
        "06_sgd-with-scheduler.py",
        "Time elapsed 12.89 min\nMemory used: 2.02 GB",
        2.02,
        4,
        precision="bf16-true",
        grad_accum=4,
        optimizer="none",
    ),
    # bnb.optim.Adam8bit with Trainer's hyperparameters (the page's code): the same state as
    # AdamW8bit; bitsandbytes of early 2022 was already blockwise with min_8bit_size 4096.
    _hf_row(
        "8-bit Adam",
        "Time: 55.95\nSamples/second: 9.15\nGPU memory occupied: 13085 MB.",
        13085,
        4,
        optimizer="adamw-8bit",
    ),
    _hf_row(
        "8-bit Adam + accum + ckpt + FP16",
        "Time: 49.46\nSamples/second: 10.35\nGPU memory occupied: 5363 MB.",
        5363,
        1,
        grad_accum=4,
        grad_checkpointing=True,
        precision="16-mixed",
        optimizer="adamw-8bit",
    ),
    _litgpt_row("None", 21.30, optimizer="adamw"),
    _litgpt_row("bnb.nf4", 14.14, optimizer="paged-adamw-32bit", quantization="nf4"),
    _litgpt_row(
        "bnb.nf4-dq",
        13.84,
        optimizer="paged-adamw-32bit",
        quantization="nf4",
        double_quant=True,
    ),
)


# --- pytorch/torchtune README: "Memory and training speed" (Llama 3.1) ---------------------------
# "batch size 2 (without gradient accumulation), a dataset packed to sequence length 2048, and
# torch compile enabled"; recipe lora_finetune_single_device with its llama3_1/8B_lora_single_device
# config: bf16 weights, LoRA rank 8 on q, v, output projections and the MLP, activation
# checkpointing, fused AdamW, and CEWithChunkedOutputLoss (8 output chunks).
TORCHTUNE = (
    "https://github.com/pytorch/torchtune/blob/0031bfb080bd35ec533c412df883cf2bf7bf7fe4/README.md"
)
_TORCHTUNE_LORA = {
    "model": "llama-3.1-8b",
    "seq_len": 2048,
    "precision": "bf16-true",
    "lora_rank": 8,
    "lora_targets": "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
    "grad_checkpointing": True,
    "optimizer": "adamw-fused",
    "loss_chunks": 8,
}
TORCHTUNE_ROWS: tuple[PublishedRow, ...] = (
    PublishedRow(
        source=TORCHTUNE,
        quote="| Llama 3.1 8B | LoRA | 1x 4090 |  16.2 GiB | 3083 |",
        experiment="Llama 3.1 8B LoRA, 1x 4090",
        model="Llama-3.1-8B",
        gpu="RTX 4090",
        settings=_TORCHTUNE_LORA,
        batch_size=2,
        measured_bytes=round(16.2 * GIB),
        quantity="allocated",
        difference="torch.compile on, which also compiles the chunked loss: a compiled "
        "cross-entropy keeps each chunk's bf16 logits, not its fp32 log-probabilities (2 GiB "
        "here); torchtune's own Llama; 'Peak Memory per GPU' does not say allocated, active or "
        "reserved (allocated assumed)",
    ),
)
ROWS = ROWS + TORCHTUNE_ROWS


# Short names for the table, each with what its runs had in common beyond the settings.
SOURCES = {
    "HF docs": (
        HF_DOCS,
        "HF Trainer, early 2022 (nvidia-smi dated Jan 11 2022): torch 1.x, transformers 4.1x",
    ),
    "LitGPT": (
        LITGPT,
        "LitGPT finetune/lora.py, Oct 2023: torch 2.1.0+cu121, bitsandbytes 0.41.1, A100 40GB",
    ),
    "torchtune": (
        TORCHTUNE,
        "torchtune's single-device LoRA recipe, torch.compile on, packed 2048-token samples",
    ),
    "rasbt": (
        f"{RASBT}/logs.md",
        "Lightning Fabric (01: plain PyTorch), torch 2.1.0.dev20230623+cu118; "
        "GPU not named, A100 assumed",
    ),
}


@dataclass(frozen=True, slots=True)
class Comparison:
    """A row and MemoryMark's prediction of the same quantity."""

    row: PublishedRow
    predicted_bytes: int
    fits: bool
    """False when the simulated step did not fit the GPU (the prediction is still reported)."""
    context_bytes: int = 0
    """The CUDA context added to reserved bytes for a device-used figure."""
    seconds: float = field(default=0.0, compare=False)

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_bytes - self.row.measured_bytes) / self.row.measured_bytes


def predict(row: PublishedRow) -> Comparison:
    """Simulate the row's step and return the prediction of the quantity it published."""
    start = time.perf_counter()
    m = Session(row.to_settings()).measure(row.batch_size)
    context = 0
    if row.quantity == "allocated":
        predicted = m.predicted_allocated_bytes
    else:
        # Over the whole run, as max_memory_reserved (or what the device holds after training)
        # is: the loop's reserved peak, not step 1's.
        predicted = m.loop_reserved_bytes or m.predicted_reserved_bytes
        if row.quantity == "device-used":
            context = row.context_bytes or find_gpu(row.gpu).context_bytes
            predicted += context
    return Comparison(row, predicted, m.fits, context, time.perf_counter() - start)


_SHOWN = ("precision", "optimizer", "grad_accum", "grad_checkpointing")


def describe(settings: dict[str, Any]) -> str:
    """Precision, optimizer, accumulation and checkpointing: what varies between rows, short."""
    s = Settings(**settings)
    parts = [
        s.workload.precision,
        "none (no state)" if s.workload.optimizer == "none" else s.workload.optimizer,
    ]
    if s.workload.grad_accum > 1:
        parts.append(f"accum {s.workload.grad_accum}")
    if s.workload.grad_checkpointing:
        parts.append("ckpt")
    return ", ".join(parts)


def common_settings(rows: list[PublishedRow]) -> str:
    """The settings every row of one source shares, beyond the model and what `describe` shows."""
    shared = dict(rows[0].settings)
    for row in rows[1:]:
        shared = {k: v for k, v in shared.items() if row.settings.get(k) == v}
    return ", ".join(f"{k}={v}" for k, v in shared.items() if k not in ("model", *_SHOWN))


def _source_name(row: PublishedRow) -> str:
    return next(name for name, (url, _) in SOURCES.items() if url == row.source)


def gib(num_bytes: int) -> str:
    """Bytes as GiB (2^30) for display: the one conversion in this script."""
    return f"{num_bytes / GIB:.2f}"


def _context_notes(comparisons: list[Comparison]) -> list[str]:
    """One line per CUDA context added to device-used rows: which rows, how much, whose figure."""
    rows_by_context: dict[tuple[int, bool], list[int]] = {}
    for i, c in enumerate(comparisons, 1):
        if c.row.quantity == "device-used":
            key = (c.context_bytes, c.row.context_bytes is not None)
            rows_by_context.setdefault(key, []).append(i)
    return [
        f"rows {', '.join(map(str, rows))}: {context / MIB:.0f} MiB, "
        + ("measured by the source" if measured else "MemoryMark's estimate for the GPU")
        for (context, measured), rows in rows_by_context.items()
    ]


def print_table(comparisons: list[Comparison]) -> None:
    """The aligned table and its summary."""
    head = f"{'#':>2}  {'source':<7}  {'experiment':<31}  {'model':<10}  {'GPU':<9}  {'batch':>5}"
    print(f"{head}  {'settings':<37}  {'quantity':<11}  {'measured':>8}  {'predicted':>9}  error")
    for i, c in enumerate(comparisons, 1):
        r = c.row
        mark = "" if c.fits else " *"
        print(
            f"{i:>2}  {_source_name(r):<7}  {r.experiment:<31}  {r.model:<10}  {r.gpu:<9}  "
            f"{r.batch_size:>5}  {describe(r.settings):<37}  {r.quantity:<11}  "
            f"{gib(r.measured_bytes):>8}  {gib(c.predicted_bytes):>9}  {c.error * 100:+6.1f}%{mark}"
        )
    print("GiB = 2^30 bytes. Sources, and the settings all their rows share:")
    for name in dict.fromkeys(_source_name(c.row) for c in comparisons):
        url, note = SOURCES[name]
        rows = [c.row for c in comparisons if _source_name(c.row) == name]
        print(f"  {name}: {url}\n    {note}; {common_settings(rows)}")
    print("device-used: predicted = predicted reserved + CUDA context, here")
    for line in _context_notes(comparisons):
        print(f"  {line}")
    if not all(c.fits for c in comparisons):
        print("* the simulated step did not fit the GPU; the prediction is still the step's need.")
    print("What each source's run did that MemoryMark's step does not:")
    for i, c in enumerate(comparisons, 1):
        if c.row.difference:
            print(f"  {i:>2}. {c.row.difference}")
    errors = [abs(c.error) for c in comparisons]
    worst = max(comparisons, key=lambda c: abs(c.error))
    print(
        f"{len(comparisons)} rows: mean absolute error {sum(errors) / len(errors) * 100:.1f}%, "
        f"{sum(e <= 0.05 for e in errors)} within 5%, {sum(e <= 0.10 for e in errors)} within "
        f"10%; worst: row {comparisons.index(worst) + 1} ({worst.row.experiment}) "
        f"{worst.error * 100:+.1f}%"
    )


def to_json(c: Comparison) -> dict[str, Any]:
    """One row of `--json`."""
    return {
        "source": c.row.source,
        "quote": c.row.quote,
        "experiment": c.row.experiment,
        "model": c.row.model,
        "gpu": c.row.gpu,
        "settings": c.row.settings,
        "batch_size": c.row.batch_size,
        "quantity": c.row.quantity,
        "measured_bytes": c.row.measured_bytes,
        "predicted_bytes": c.predicted_bytes,
        "context_bytes": c.context_bytes,
        "error": round(c.error, 4),
        "fits": c.fits,
        "difference": c.row.difference,
    }


def main() -> None:
    """Simulate every row and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument(
        "--rows", nargs="+", type=int, metavar="N", help="only these rows (1-based, as numbered)"
    )
    args = parser.parse_args()
    start = time.perf_counter()
    comparisons = []
    rows = [ROWS[n - 1] for n in args.rows] if args.rows else list(ROWS)
    for row in rows:
        comparisons.append(predict(row))
        if not args.json:
            print(f"simulated {row.experiment} ({comparisons[-1].seconds:.0f} s)", flush=True)
    if args.json:
        print(json.dumps([to_json(c) for c in comparisons], indent=2))
        return
    print()
    print_table(comparisons)
    print(f"{time.perf_counter() - start:.0f} s for {len(rows)} simulated steps")


if __name__ == "__main__":
    main()
