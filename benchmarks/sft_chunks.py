"""Prints what sizing TRL's SFTTrainer costs here against a plain Trainer of the same model:
issue 31's target is within 3x.

The model has TinyLlama-1.1B's dimensions (random weights, built from the config: no hub), with
LoRA (rank 16 on the attention projections), 512-token samples, bf16, sized for an A10 through
the Hugging Face integration (`hf.find_batch_size`). Each case runs in a fresh process (imports,
building the Trainer and the sweep, as a user's script pays them), twice by default; the
figures are whole-process seconds, the sweep's own seconds, and the SFT case as a multiple of
the plain one. It needs trl (and its `datasets`) importable: `pip install trl` (TRL before 1.0,
e.g. 0.24, logs the entropy of the logits in chunks of 128 rows; 1.x projects the LM head in
tiles of 4096 rows instead).

    PYTHONPATH=. python benchmarks/sft_chunks.py [--repeat 2] [--layers 22]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from big_models import timed_python

_CHILD = """
import json, sys, tempfile, time, warnings
warnings.filterwarnings("ignore")
import datasets, torch
from peft import LoraConfig, get_peft_model
from tokenizers import Tokenizer, models
from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Trainer,
                          TrainingArguments)
from memorymark.integrations import hf

kind, layers, checkpointing = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "on"
TOKENS = 512
config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                     num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                     max_position_embeddings=2048)  # TinyLlama-1.1B's config.json
lora = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
rows = [[1] * TOKENS] * 16
out = tempfile.mkdtemp()
with hf.target_gpu("a10"):
    if kind == "sft":
        import trl
        vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
            pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
        args = trl.SFTConfig(output_dir=out, report_to=[], bf16=True, max_length=TOKENS,
                             per_device_train_batch_size=8)
        trainer = trl.SFTTrainer(model=LlamaForCausalLM(config), args=args, peft_config=lora,
                                 train_dataset=datasets.Dataset.from_dict({"input_ids": rows}),
                                 processing_class=tokenizer)
    else:
        args = TrainingArguments(output_dir=out, report_to=[], bf16=True,
                                 per_device_train_batch_size=8,
                                 gradient_checkpointing=checkpointing)
        data = datasets.Dataset.from_dict({"input_ids": rows, "labels": rows})
        trainer = Trainer(model=get_peft_model(LlamaForCausalLM(config), lora), args=args,
                          train_dataset=data)
start = time.perf_counter()
report = hf.find_batch_size(trainer, gpu="a10").report
print(json.dumps({
    "sweep_seconds": time.perf_counter() - start,
    "optimal": report.optimal and report.optimal.batch_size,
    "traced": sum(not m.replayed for m in report.measurements),
    "replayed": sum(m.replayed for m in report.measurements),
    "search_note": report.search_note,
    "checkpointing": trainer.args.gradient_checkpointing,
    "trl": sys.modules["trl"].__version__ if "trl" in sys.modules else None,
}))
"""


def _case(kind: str, layers: int, checkpointing: str) -> tuple[float, dict[str, object]]:
    """Whole-process seconds of one sizing (`checkpointing` "on" or "off" for the plain
    Trainer; the SFT one keeps its config's), and what its child printed."""
    seconds, out = timed_python(["-c", _CHILD, kind, str(layers), checkpointing], kind)
    return seconds, json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--layers", type=int, default=22, help="TinyLlama-1.1B has 22")
    parser.add_argument(
        "--plain-checkpointing",
        choices=("same", "off"),
        default="same",
        help="the plain Trainer's gradient checkpointing: as SFTConfig chose (default), or "
        "that and off as well",
    )
    args = parser.parse_args()
    for run in range(args.repeat):
        times: dict[str, tuple[float, float]] = {}
        seconds, sft = _case("sft", args.layers, "")
        times["sft"] = (seconds, float(sft["sweep_seconds"]))  # type: ignore[arg-type]
        _print(run, "sft", seconds, sft)
        same = "on" if sft["checkpointing"] else "off"
        other = "off" if args.plain_checkpointing == "off" else same
        for checkpointing in dict.fromkeys((same, other)):
            kind = f"plain, checkpointing {checkpointing}"
            seconds, plain = _case("plain", args.layers, checkpointing)
            times[kind] = (seconds, float(plain["sweep_seconds"]))  # type: ignore[arg-type]
            _print(run, kind, seconds, plain)
        for kind, (whole, sweep) in times.items():
            if kind != "sft":
                print(
                    f"  run {run + 1} SFTTrainer / Trainer ({kind}): "
                    f"{times['sft'][0] / whole:.1f}x whole process, "
                    f"{times['sft'][1] / sweep:.1f}x sweep",
                    flush=True,
                )


def _print(run: int, kind: str, seconds: float, child: dict[str, object]) -> None:
    """One case's line: its times, answer, traces, and the search's note."""
    print(
        f"  run {run + 1} {kind}: {seconds:6.1f} s whole process "
        f"({child['sweep_seconds']:.1f} s sweep), optimal {child['optimal']}, "
        f"{child['traced']} traced, {child['replayed']} replayed"
        + (f" (trl {child['trl']})" if child["trl"] else ""),
        flush=True,
    )
    print(f"      {child['search_note']}", flush=True)


if __name__ == "__main__":
    main()
