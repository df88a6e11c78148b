"""The Hugging Face integration: a transformers Trainer sized as `Trainer.train()` runs it (its
model copied, its optimizer, its `compute_loss`, its collator over its longest samples, its
arguments' checkpointing and accumulation), and the answer written back into its arguments.
Tiny BERTs on a simulated 1 GiB GPU, so every answer lies well inside `max_batch`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import memorymark
from memorymark import Session, Settings
from memorymark.integrations import hf

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)

SEARCH = {"gpu_memory_gib": 1, "max_batch": 256}
"""A GPU small enough that a 512-token tiny BERT's answer (~100) is neither 1 nor max_batch."""

LENGTHS = (8, 16, 24, 512, 32, 12)
"""Sample lengths in tokens: the longest is not first, and not within the first three."""

GLOBAL_BATCH = 128
"""The arguments' batch (128 x 1): too large for one step without checkpointing, not with it."""


def _pad(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Dynamic padding, as DataCollatorWithPadding does, with no tokenizer to load."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = [s["input_ids"] + [0] * (longest - len(s["input_ids"])) for s in samples]
    mask = [[1] * len(s["input_ids"]) + [0] * (longest - len(s["input_ids"])) for s in samples]
    return {
        "input_ids": torch.tensor(ids),
        "attention_mask": torch.tensor(mask),
        "labels": torch.tensor([s["labels"] for s in samples]),
    }


class CountingTrainer(Trainer):
    """A Trainer whose `compute_loss` override records each call: its input shape and whether
    it ran on fake tensors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shapes: list[tuple[int, ...]] = []
        self.simulated: list[bool] = []

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        self.shapes.append(tuple(inputs["input_ids"].shape))
        self.simulated.append(memorymark.simulating())
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def _trainer(
    output_dir: Path, *, trainer_class: type[Trainer] = CountingTrainer, **arguments: Any
) -> Trainer:
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=1000,
        max_position_embeddings=512,
    )
    arguments = {"per_device_train_batch_size": GLOBAL_BATCH, **arguments}
    return trainer_class(
        model=BertForSequenceClassification(config),
        args=TrainingArguments(output_dir=str(output_dir), report_to=[], use_cpu=True, **arguments),
        train_dataset=[{"input_ids": [1] * n, "labels": n % 2} for n in LENGTHS],
        data_collator=_pad,
    )


@pytest.fixture(scope="module")
def sized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Trainer, hf.TrainerBatch]]:
    """The same Trainer without and with activation checkpointing, then with bf16 too, each
    sized once."""
    runs = {}
    for name, arguments in (
        ("plain", {}),
        ("checkpointed", {"activation_checkpointing": True}),
        ("bf16", {"activation_checkpointing": True, "bf16": True}),
    ):
        trainer = _trainer(tmp_path_factory.mktemp(name), **arguments)
        runs[name] = trainer, hf.find_batch_size(trainer, **SEARCH)
    return runs


def _optimal(result: hf.TrainerBatch) -> int:
    assert result.report.optimal is not None
    return result.report.optimal.batch_size


def test_checkpointing_trains_a_larger_batch(sized: dict) -> None:
    plain, checkpointed = _optimal(sized["plain"][1]), _optimal(sized["checkpointed"][1])
    assert 16 <= plain < checkpointed < SEARCH["max_batch"]
    # recomputing each layer's activations in backward keeps one layer's at a time, not two
    assert checkpointed >= 1.3 * plain


def test_bf16_trains_a_larger_batch_than_float32(sized: dict) -> None:
    # activations in bf16 under autocast: about half the bytes per sample
    assert _optimal(sized["checkpointed"][1]) < _optimal(sized["bf16"][1]) < SEARCH["max_batch"]


def test_a_compute_loss_override_runs_on_fake_tensors(sized: dict) -> None:
    trainer, result = sized["plain"]
    assert trainer.shapes and all(trainer.simulated)
    # every batch the override saw was padded to the longest sample, the fourth
    assert {shape[1] for shape in trainer.shapes} == {max(LENGTHS)}
    traced = {m.batch_size for m in result.report.measurements if not m.replayed}
    assert traced <= {s[0] for s in trainer.shapes}
    # the symbolic search replays the user's step at other batch sizes without calling it
    assert any(m.replayed for m in result.report.measurements)


def test_the_plan_keeps_the_global_batch(sized: dict) -> None:
    plain = sized["plain"][1]
    assert _optimal(plain) < GLOBAL_BATCH
    # the largest divisor of 128 that fits, accumulated up to 128
    expected = max(
        d for d in range(1, GLOBAL_BATCH + 1) if GLOBAL_BATCH % d == 0 and d <= _optimal(plain)
    )
    assert (plain.per_device_train_batch_size, plain.gradient_accumulation_steps) == (
        expected,
        GLOBAL_BATCH // expected,
    )
    checkpointed = sized["checkpointed"][1]
    # the whole global batch fits in one step: no accumulation, and no larger batch than asked
    assert _optimal(checkpointed) >= GLOBAL_BATCH
    assert (checkpointed.per_device_train_batch_size, checkpointed.gradient_accumulation_steps) == (
        GLOBAL_BATCH,
        1,
    )


def test_apply_sets_the_arguments(sized: dict, tmp_path: Path) -> None:
    result = sized["plain"][1]
    trainer = _trainer(tmp_path)
    result.apply(trainer)
    assert trainer.args.per_device_train_batch_size == result.per_device_train_batch_size
    assert trainer.args.gradient_accumulation_steps == result.gradient_accumulation_steps
    assert trainer.get_total_train_batch_size(trainer.args) == GLOBAL_BATCH


def test_the_users_trainer_is_left_as_it_was(sized: dict) -> None:
    trainer, _ = sized["checkpointed"]
    assert trainer.optimizer is None
    assert all(p.device.type == "cpu" for p in trainer.model.parameters())
    assert not trainer.model.bert.encoder.layer[0].gradient_checkpointing
    assert "forward" not in vars(trainer.model)
    assert trainer.args.per_device_train_batch_size == GLOBAL_BATCH


def test_the_batch_is_the_collator_over_the_longest_samples(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    assert hf.as_training(trainer).batch(3)["input_ids"].shape == (3, max(LENGTHS))
    # more samples than the dataset holds: the longest ones again
    assert hf.as_training(trainer).batch(9)["input_ids"].shape == (9, max(LENGTHS))
    # the scan stops at scan_samples: the longest of the first three is 24 tokens
    assert hf.as_training(trainer, scan_samples=3).batch(5)["input_ids"].shape == (5, 24)


def test_the_optimizer_is_create_optimizers_over_the_copy(tmp_path: Path) -> None:
    arguments = {"optim": "adafactor", "weight_decay": 0.1}
    trainer = _trainer(tmp_path / "a", **arguments)
    job = hf.as_training(trainer)
    model = job.model()
    optimizer = job.optimizer(model)
    reference = _trainer(tmp_path / "b", **arguments).create_optimizer()
    assert type(optimizer) is type(reference) is transformers.optimization.Adafactor
    assert [(len(g["params"]), g["weight_decay"]) for g in optimizer.param_groups] == [
        (len(g["params"]), g["weight_decay"]) for g in reference.param_groups
    ]
    copied = {id(p) for p in model.parameters()}
    assert all(id(p) in copied for g in optimizer.param_groups for p in g["params"])
    assert trainer.optimizer is None


def test_a_given_optimizer_is_rebuilt_over_the_copy(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    # AdamW: its defaults hold a key its constructor does not take (torch 2.13)
    given = torch.optim.AdamW(trainer.model.parameters(), lr=0.1, weight_decay=0.05)
    trainer.optimizer = given  # as Trainer(optimizers=(given, None)) stores it
    job = hf.as_training(trainer)
    model = job.model()
    optimizer = job.optimizer(model)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["weight_decay"] == 0.05
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == [
        id(p) for p in model.parameters()
    ]
    assert trainer.optimizer is given


def test_the_step_runs_for_real_as_training_step_does(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, gradient_accumulation_steps=4, max_grad_norm=0.5)
    job = hf.as_training(trainer)
    model = job.model()
    before = [p.detach().clone() for p in model.parameters()]
    job.step(model, job.batch(2), job.optimizer(model))
    # two micro-batches stand for four; the optimizer stepped and the gradients were freed
    assert trainer.shapes == [(2, max(LENGTHS))] * 2 and trainer.simulated == [False, False]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("not a trainer", "takes a transformers.Trainer, got BertForSequenceClassification"),
        ("no dataset", "no train_dataset: build it with Trainer"),
        ("no collator", "no data_collator: build it with Trainer"),
    ],
)
def test_what_cannot_be_sized_is_one_line(tmp_path: Path, change: str, message: str) -> None:
    trainer: Any = _trainer(tmp_path)
    if change == "not a trainer":
        trainer = trainer.model
    elif change == "no dataset":
        trainer.train_dataset = None
    else:
        trainer.data_collator = None
    with pytest.raises(ValueError, match=message) as raised:
        hf.find_batch_size(trainer, **SEARCH)
    assert "\n" not in str(raised.value)


def test_nothing_to_apply_when_nothing_fits(sized: dict, tmp_path: Path) -> None:
    nothing = hf.TrainerBatch(sized["plain"][1].report, None, None)
    with pytest.raises(ValueError, match="nothing fits, not even batch 1"):
        nothing.apply(_trainer(tmp_path))


def test_a_bf16_trainer_built_on_a_cpu_only_machine_is_sized_as_on_its_gpu(
    sized: dict, tmp_path: Path
) -> None:
    arguments = {"activation_checkpointing": True, "bf16": True}
    with pytest.raises(ValueError, match="Your setup doesn't support bf16/gpu"):
        TrainingArguments(output_dir=str(tmp_path), report_to=[], **arguments)
    # As run_glue.py builds it: no use_cpu, which would train on the CPU on the GPU too.
    with hf.target_gpu("a10"):
        args = TrainingArguments(output_dir=str(tmp_path), report_to=[], **arguments)
    assert args.bf16 and args.device.type == "cpu"  # nothing touched CUDA
    trainer = _trainer(tmp_path)
    trainer.args = args
    trainer.args.per_device_train_batch_size = GLOBAL_BATCH
    result = hf.find_batch_size(trainer, **SEARCH)
    assert _optimal(result) == _optimal(sized["bf16"][1])  # as with use_cpu=True
    assert result.report.set_up_for == "A10"
    assert "Set up as on the A10, not as on this machine" in result.report.setup_note
    # sized for a GPU without bf16, the arguments could not exist: one line
    with pytest.raises(
        ValueError, match=r"set up as on the A10 .* sized for the T4, which has none"
    ):
        hf.find_batch_size(trainer, gpu="t4")


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_torch_compile_true_sizes_the_compiled_model(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, torch_compile=True)
    backend = Session(Settings(gpu="a10", compile=True), training=hf.as_training(trainer))
    compiled = backend.open_backend().measure(8)
    eager = Session(Settings(gpu="a10"), training=hf.as_training(_trainer(tmp_path)))
    assert compiled.peak_bytes < eager.open_backend().measure(8).peak_bytes
    assert compiled.graph_breaks == ()


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_a_model_compiled_before_the_trainer_is_refused(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    trainer.model = torch.compile(trainer.model)
    with pytest.raises(memorymark.SimulationError, match=r"the model is torch.compile'd\): size"):
        hf.find_batch_size(trainer, **SEARCH)


def test_torch_empty_cache_steps_1_flushes_after_the_loss_every_step(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, torch_empty_cache_steps=1)
    backend = Session(Settings(gpu="a10"), training=hf.as_training(trainer)).open_backend()
    backend.measure(4)
    assert backend._tracker.events.count(None) == 1  # allocator.EMPTY_CACHE
    unset = _trainer(tmp_path)  # the default (None): no flush, as Trainer runs it
    backend = Session(Settings(gpu="a10"), training=hf.as_training(unset)).open_backend()
    backend.measure(4)
    assert None not in backend._tracker.events
