"""Prints what sizing a user's own code costs, beside the catalog's same step, in one run.

The same BERT-base (a two-label classifier, sequence 128, AdamW, fp32) on a simulated A10, four
ways: the catalog's `bert`, a user-written `memorymark.Training`, an HF `Trainer` through
`memorymark.integrations.hf`, and a `LightningModule` through `memorymark.integrations.lightning`
(skipped when Lightning is not installed). Each line gives the optimal and max batch (they should
all agree with the catalog's), the seconds, and the ratio to the catalog's sweep timed right
before it: this machine is shared and noisy, so only ratios within one run compare. A fifth
line times the command line, `memorymark analyze --training examples/own_training.py:training`,
as a whole process, beside `memorymark analyze bert` as a whole process.

    PYTHONPATH=. python benchmarks/own_code.py [--repeats 2] [--gpu a10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

import memorymark as mm
from memorymark.report import Report

ROOT = Path(mm.__file__).resolve().parents[1]
SEQ_LEN = 128


def bert() -> transformers.BertForSequenceClassification:
    """BERT-base as a user builds it from its config: transformers' defaults are BERT-base's."""
    return transformers.BertForSequenceClassification(transformers.BertConfig(num_labels=2))


def user_job() -> mm.Training:
    """The catalog's step, written by a user: forward with labels, backward, AdamW."""

    def batch(n: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": torch.randint(0, 30522, (n, SEQ_LEN)),
            "labels": torch.randint(0, 2, (n,)),
        }

    def step(model, batch, optimizer) -> None:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return mm.Training(
        model=bert,
        batch=batch,
        step=step,
        optimizer=lambda params: torch.optim.AdamW(params, lr=2e-5),
        name="user-bert",
    )


def hf_form(gpu: str) -> Callable[[], Report] | None:
    """An HF Trainer over BERT-base and fixed-length samples, sized by the integration."""
    try:
        from memorymark.integrations import hf
    except ImportError:
        return None
    samples = [{"input_ids": [0] * SEQ_LEN, "labels": 0} for _ in range(64)]
    # optim="adamw_torch": the catalog's AdamW (foreach). Trainer's default, adamw_torch_fused,
    # is the catalog's `--optimizer adamw-fused`, whose fewer temporaries fit a larger batch.
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        report_to=[],
        per_device_train_batch_size=16,
        optim="adamw_torch",
    )
    trainer = transformers.Trainer(model=bert(), args=args, train_dataset=samples)
    return lambda: hf.find_batch_size(trainer, gpu=gpu).report


def lightning_form(gpu: str) -> Callable[[], Report] | None:
    """A LightningModule over BERT-base, sized by the integration."""
    try:
        import lightning as L

        from memorymark.integrations import lightning as mm_lightning
    except ImportError:
        return None

    class BertModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = bert()
            self.batch_size = 16

        def training_step(self, batch, batch_idx):
            return self.model(input_ids=batch[0], labels=batch[1]).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=2e-5)

        def train_dataloader(self):
            data = torch.utils.data.TensorDataset(
                torch.zeros(256, SEQ_LEN, dtype=torch.long), torch.zeros(256, dtype=torch.long)
            )
            return torch.utils.data.DataLoader(data, batch_size=self.batch_size)

    module = BertModule()
    return lambda: mm_lightning.find_batch_size(module, gpu=gpu).report


def timed(run: Callable[[], Report]) -> tuple[Report, float]:
    start = time.perf_counter()
    report = run()
    return report, time.perf_counter() - start


def process_seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "memorymark", *argv, "--json", "--no-save"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--gpu", default="a10")
    args = parser.parse_args()

    settings = mm.Settings(gpu=args.gpu)

    def catalog() -> Report:
        return mm.Session(mm.Settings(model="bert", seq_len=SEQ_LEN, gpu=args.gpu)).analyze()

    forms: dict[str, Callable[[], Report] | None] = {
        "Training (API)": lambda: mm.Session(settings, training=user_job()).analyze(),
        "HF Trainer": hf_form(args.gpu),
        "LightningModule": lightning_form(args.gpu),
    }
    timed(catalog)  # pays the one-off imports and kernel registrations
    reference, _ = timed(catalog)
    print(f"BERT-base, seq {SEQ_LEN}, AdamW, fp32, simulated {args.gpu}; {args.repeats} repeats")
    print(f"{'form':<18} {'optimal':>7} {'max':>5} {'seconds':>8} {'x catalog':>9}")
    print(
        f"{'catalog bert':<18} {reference.optimal.batch_size:>7} {reference.max_fit.batch_size:>5}"
    )
    for name, run in forms.items():
        if run is None:
            print(f"{name:<18} skipped: not installed")
            continue
        ratios, seconds = [], []
        for _ in range(args.repeats):
            _, base = timed(catalog)
            report, took = timed(run)
            ratios.append(took / base)
            seconds.append(took)
        same = (report.optimal.batch_size, report.max_fit.batch_size) == (
            reference.optimal.batch_size,
            reference.max_fit.batch_size,
        )
        print(
            f"{name:<18} {report.optimal.batch_size:>7} {report.max_fit.batch_size:>5} "
            f"{statistics.median(seconds):>8.1f} {statistics.median(ratios):>8.2f}x"
            + ("" if same else "  (differs from the catalog's)")
        )
    cli = ["analyze", "--training", "examples/own_training.py:training", "--gpu", args.gpu]
    ratios = []
    for _ in range(args.repeats):
        base = process_seconds(["analyze", "bert", "--gpu", args.gpu])
        ratios.append(process_seconds(cli) / base)
    print(
        f"{'CLI --training':<18} (examples/own_training.py, a whole process) "
        f"{statistics.median(ratios):.2f}x `memorymark analyze bert` as a process"
    )


if __name__ == "__main__":
    main()
