"""Training code written for a GPU, as people write it, sized on a machine without one: setup
that asks the machine about its GPU (`memorymark.target_gpu`), a GradScaler made before sizing,
EMA weights made beside the model, and `torch.compile`, refused in one line until modelled.

Tiny MLPs on a simulated 1 GiB GPU; the figures are exact byte counts of their weights.
"""

from __future__ import annotations

import copy
import json
import textwrap

import pytest
import torch
from torch import nn

import memorymark as mm
from memorymark.cli.parser import main

SMALL = {"gpu_memory_gib": 1, "max_batch": 4096}


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(256, 1024)
        self.b = nn.Linear(1024, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


WEIGHT_BYTES = (256 * 1024 + 1024 + 1024 * 10 + 10) * 4
"""The MLP's parameters in fp32."""


def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 256), torch.randint(0, 10, (n,))


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-3)


def plain_step(model, data, optimizer):
    x, y = data
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(job: mm.Training, batch_size: int = 64) -> mm.Measurement:
    return mm.Session(mm.Settings(**SMALL), training=job).measure(batch_size)


@pytest.fixture(scope="module")
def plain() -> mm.Measurement:
    """The MLP's step with nothing beside it."""
    return measure(mm.Training(model=MLP, batch=batch, step=plain_step, optimizer=adamw))


# -- a GradScaler made before sizing -----------------------------------------------------------
def scaled_step(scaler: torch.amp.GradScaler):
    def step(model, data, optimizer):
        x, y = data
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return step


def test_a_grad_scaler_made_before_sizing_runs_as_pytorch_disabled_it():
    # nanoGPT's train.py makes it at module level: with no CUDA, PyTorch disables it (and says
    # so), and a disabled scaler only steps the optimizer.
    with pytest.warns(UserWarning, match="CUDA is not available"):
        scaler = torch.amp.GradScaler("cuda")
    assert not scaler.is_enabled()
    m = measure(mm.Training(model=MLP, batch=batch, step=scaled_step(scaler), optimizer=adamw))
    assert m.fits and m.breakdown.parameters == WEIGHT_BYTES


def test_a_grad_scaler_made_under_target_gpu_scales_as_on_the_gpu():
    with mm.target_gpu("a10"):
        scaler = torch.amp.GradScaler("cuda")
    assert scaler.is_enabled()
    m = measure(mm.Training(model=MLP, batch=batch, step=scaled_step(scaler), optimizer=adamw))
    assert m.fits and m.breakdown.parameters == WEIGHT_BYTES
    assert scaler._scale is not None  # it scaled the loss: its scale exists now


def test_target_gpu_answers_for_that_gpu_only_in_the_block():
    with mm.target_gpu("t4"):  # compute capability 7.5: no bf16
        assert torch.amp.GradScaler("cuda").is_enabled()
    with pytest.warns(UserWarning, match="CUDA is not available"):
        assert not torch.amp.GradScaler("cuda").is_enabled()
    with pytest.raises(ValueError, match="unknown GPU"):
        with mm.target_gpu("no-such-gpu"):
            pass


# -- EMA weights made in the model function ----------------------------------------------------
def ema_job(kind: str) -> tuple[mm.Training, dict]:
    held: dict = {}

    def make_model() -> nn.Module:
        model = MLP()
        if kind == "deepcopy":  # a diffusers-style training script
            held["ema"] = copy.deepcopy(model).requires_grad_(False)
        else:
            held["ema"] = torch.optim.swa_utils.AveragedModel(
                model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.999)
            )
        return model

    def step(model, data, optimizer):
        plain_step(model, data, optimizer)
        ema = held["ema"]
        if isinstance(ema, torch.optim.swa_utils.AveragedModel):
            ema.update_parameters(model)
        else:
            with torch.no_grad():
                torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.001)

    return mm.Training(model=make_model, batch=batch, step=step, optimizer=adamw), held


@pytest.mark.parametrize(
    ("kind", "extra"),
    [("deepcopy", WEIGHT_BYTES), ("averaged", WEIGHT_BYTES + 8)],  # + AveragedModel's count
)
def test_ema_weights_made_in_the_model_function_are_weights_in_the_peak(kind, extra, plain):
    job, held = ema_job(kind)
    m = measure(job)
    assert m.fits
    assert m.breakdown.parameters == plain.breakdown.parameters + extra
    assert m.peak_bytes == plain.peak_bytes + extra
    # the allocator replay holds them from before step 1 (blocks round up to 512 bytes); the
    # reserved segments may have room for them already, so reserved only may not shrink
    assert m.predicted_allocated_bytes >= plain.predicted_allocated_bytes + extra
    assert m.required_bytes >= plain.required_bytes
    # the user's EMA is now a fake tensor of the simulation, updated by the step
    assert all(type(p).__name__ == "FakeTensor" for p in held["ema"].parameters())


def test_a_model_functions_own_temporaries_are_not_counted(plain):
    def make_model() -> nn.Module:
        model = MLP()
        scratch = torch.zeros(1024, 1024)  # freed when the function returns
        del scratch
        return model

    m = measure(mm.Training(model=make_model, batch=batch, step=plain_step, optimizer=adamw))
    assert m.breakdown == plain.breakdown and m.peak_bytes == plain.peak_bytes


# -- torch.compile, refused in one line ----------------------------------------------------------
FIRST_COMPILE = "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
"""torch.compile's first use imports torch._dynamo, whose own imports warn so (torch 2.13)."""


@pytest.mark.filterwarnings(FIRST_COMPILE)
def test_a_compiled_model_is_refused_in_one_line():
    job = mm.Training(model=lambda: torch.compile(MLP()), batch=batch, step=plain_step)
    with pytest.raises(mm.SimulationError, match=r"torch.compile is not modelled yet \(the model "):
        measure(job)


@pytest.mark.filterwarnings(FIRST_COMPILE)
def test_compiled_code_in_the_step_is_refused_at_once_naming_the_users_line():
    @torch.compile
    def loss_of(logits, labels):
        return nn.functional.cross_entropy(logits, labels)

    def step(model, data, optimizer):
        x, y = data
        loss_of(model(x), y).backward()

    from torch._dynamo.utils import counters  # loaded by torch.compile above

    job = mm.Training(model=MLP, batch=batch, step=step)
    frames = counters["frames"]["total"]
    with pytest.raises(mm.SimulationError) as raised:
        measure(job)
    message = str(raised.value)
    assert message.startswith("torch.compile is not modelled yet (compiled code ran at ")
    assert "loss_of(model(x), y).backward()" in message
    assert "memorymark.simulating()" in message and "\n" not in message
    # refused before dynamo traced a frame (tracing fake tensors fails, tens of seconds on)
    assert counters["frames"]["total"] == frames


# -- the command line: a file set up at import, as on the GPU it is sized for ----------------------
TRAINING_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn
    from transformers import TrainingArguments

    import memorymark as mm

    ARGS = TrainingArguments(output_dir={out!r}, bf16=True, report_to=[])
    SCALER = torch.amp.GradScaler("cuda")  # as nanoGPT's train.py, at import


    def step(model, batch, optimizer):
        x, y = batch
        with torch.autocast("cuda", dtype=torch.bfloat16 if ARGS.bf16 else torch.float16):
            loss = nn.functional.cross_entropy(model(x), y)
        SCALER.scale(loss).backward()
        SCALER.step(optimizer)
        SCALER.update()
        optimizer.zero_grad(set_to_none=True)


    def training():
        return mm.Training(
            model=lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)),
            batch=lambda n: (torch.randn(n, 64), torch.randint(0, 10, (n,))),
            step=step,
            optimizer=lambda params: torch.optim.AdamW(params),
            name="bf16-job",
        )


    def compiled():
        job = training()
        return mm.Training(model=lambda: torch.compile(job.model()), batch=job.batch,
                           step=step, optimizer=job.optimizer)
    """
)


@pytest.fixture
def set_up_file(tmp_path):
    path = tmp_path / "train_bf16.py"
    path.write_text(TRAINING_FILE.format(out=str(tmp_path / "out")))
    return path


def test_cli_a_file_that_sets_up_bf16_at_import_is_sized_as_on_the_gpu(capsys, set_up_file):
    argv = ["analyze", "--training", f"{set_up_file}:training", "--gpu", "a10", "--json"]
    status = main([*argv, "--max-batch", "64", "--no-save"])
    out, err = capsys.readouterr()
    assert status == 0, err
    data = json.loads(out)
    assert data["set_up_for"] == "A10" and data["optimal_batch_size"] == 64
    assert data["setup_note"].startswith("Set up as on the A10, not as on this machine")
    status = main(["analyze", "--training", f"{set_up_file}:training", "--max-batch", "64"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "note: Set up as on the A10" in out  # the default simulated GPU
    status = main(["measure", "--training", f"{set_up_file}:training", "--gpu", "a10",
                   "--batch-size", "8", "--json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert status == 0, err
    assert json.loads(out)["setup_note"].endswith("and it is sized for the A10.")


def test_cli_a_file_set_up_for_bf16_on_a_gpu_without_it_fails_as_there(capsys, set_up_file):
    status = main(["measure", "--training", f"{set_up_file}:training", "--gpu", "t4",
                   "--batch-size", "8"])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "failed to run: ValueError: Your setup doesn't support bf16/gpu" in err


@pytest.mark.filterwarnings(FIRST_COMPILE)
def test_cli_a_compiled_model_is_one_line(capsys, set_up_file):
    status = main(["measure", "--training", f"{set_up_file}:compiled", "--gpu", "a10",
                   "--batch-size", "8"])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "torch.compile is not modelled yet (the model is torch.compile'd" in err


HF_FILE = textwrap.dedent(
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer
    from transformers import TrainingArguments

    from memorymark.integrations import hf


    def pad(samples):
        longest = max(len(s["input_ids"]) for s in samples)
        ids = [s["input_ids"] + [0] * (longest - len(s["input_ids"])) for s in samples]
        return {"input_ids": torch.tensor(ids),
                "labels": torch.tensor([s["labels"] for s in samples])}


    # As transformers' run_glue.py sets it up, at import, for a GPU with bf16.
    ARGS = TrainingArguments(output_dir=OUT, bf16=True, report_to=[],
                             per_device_train_batch_size=8)
    CONFIG = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, vocab_size=100)
    TRAINER = Trainer(model=BertForSequenceClassification(CONFIG), args=ARGS,
                      train_dataset=[{"input_ids": [1] * 16, "labels": 0}] * 4,
                      data_collator=pad)


    def trainer_job():
        return hf.as_training(TRAINER)
    """
)


def test_cli_a_trainer_built_with_bf16_at_import(capsys, tmp_path):
    path = tmp_path / "run_glue_like.py"
    path.write_text(HF_FILE.replace("OUT", repr(str(tmp_path / "out"))))
    argv = ["analyze", "--training", f"{path}:trainer_job", "--gpu", "a10", "--json"]
    status = main([*argv, "--max-batch", "16", "--no-save"])
    out, err = capsys.readouterr()
    assert status == 0, err
    data = json.loads(out)
    assert data["model_name"] == "BertForSequenceClassification"
    assert data["set_up_for"] == "A10" and data["optimal_batch_size"] == 16
