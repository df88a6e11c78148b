"""A user's own training code (`memorymark.Training`): sized as written, from the API and the CLI.

Tiny models throughout; the GPU is a 1 GiB one (`gpu_memory_gib=1`) so answers land inside
`max_batch` and the breakdowns are real.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers
from torch import nn

import memorymark as mm
from memorymark.cli.parser import main
from memorymark.models.catalog import _config_dict
from memorymark.reporting.json_form import report_to_dict
from memorymark.units import GIB

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"gpu_memory_gib": 1, "max_batch": 4096}


# -- a custom CNN with a custom loss ------------------------------------------------------------
class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.norm = nn.BatchNorm2d(32)
        self.head = nn.Linear(32 * 16 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = nn.functional.max_pool2d(torch.relu(self.norm(self.conv(x))), 2)
        return self.head(pooled.flatten(1))


def cnn_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))


def focal_step(model: nn.Module, batch: tuple, optimizer: torch.optim.Optimizer) -> None:
    images, labels = batch
    logits = model(images)
    # A loss of the user's own: focal loss, gamma 2.
    ce = nn.functional.cross_entropy(logits, labels, reduction="none")
    loss = ((1 - torch.exp(-ce)) ** 2 * ce).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-3)


CNN = mm.Training(model=TinyCNN, batch=cnn_batch, step=focal_step, optimizer=adamw, name="cnn")


def test_a_custom_cnn_with_a_custom_loss_gets_a_report_like_a_catalog_model():
    report = mm.Session(mm.Settings(**SMALL), training=CNN).analyze()
    assert report.optimal is not None and not report.capped
    assert 16 < report.optimal.batch_size < SMALL["max_batch"]
    assert report.max_fit.batch_size >= report.optimal.batch_size
    b = report.optimal.breakdown
    params = sum(p.numel() * 4 for p in TinyCNN().parameters())
    buffers = sum(t.numel() * t.element_size() for t in TinyCNN().buffers())
    assert b.parameters == params + buffers
    assert b.optimizer_state >= 2 * params  # AdamW's two moments
    assert b.activations > b.parameters
    data = report_to_dict(report)
    assert data["model_name"] == data["model_display_name"] == "cnn"
    assert data["training"] is True and data["value_reads"] == []
    assert data["memory_source"] == "simulated"


def test_the_bigger_the_batch_the_more_it_needs():
    session = mm.Session(mm.Settings(**SMALL), training=CNN)
    small, large = session.measure(8), session.measure(64)
    assert small.fits and large.fits
    assert large.breakdown.activations > 4 * small.breakdown.activations


# -- what a GPU does that the CPU would not: autocast, foreach, cuda devices ----------------------
def autocast_step(model, batch, optimizer):
    images, labels = batch
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_the_users_cuda_autocast_runs_as_on_a_gpu():
    plain = mm.Session(mm.Settings(**SMALL), training=CNN).measure(32)
    mixed_job = mm.Training(model=TinyCNN, batch=cnn_batch, step=autocast_step, optimizer=adamw)
    mixed = mm.Session(mm.Settings(**SMALL), training=mixed_job).measure(32)
    # Under CUDA's autocast the convolution and linear layers save bf16 inputs: less memory.
    assert mixed.fits and mixed.breakdown.activations < plain.breakdown.activations


def test_a_cuda_grad_scaler_scales_as_on_a_gpu():
    def fp16_step(model, batch, optimizer):
        scaler = torch.amp.GradScaler("cuda")
        images, labels = batch
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        assert scaler.is_enabled()  # not disabled for want of CUDA
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    job = mm.Training(model=TinyCNN, batch=cnn_batch, step=fp16_step, optimizer=adamw)
    assert mm.Session(mm.Settings(**SMALL), training=job).measure(16).fits


def test_the_users_optimizer_takes_cudas_default_foreach_implementation():
    seen = []

    def step(model, batch, optimizer):
        seen.append(optimizer.param_groups[0]["foreach"])
        focal_step(model, batch, optimizer)

    job = mm.Training(model=TinyCNN, batch=cnn_batch, step=step, optimizer=adamw)
    mm.Session(mm.Settings(**SMALL), training=job).measure(8)
    assert seen == [True]


class CudaCNN(TinyCNN):
    def __init__(self) -> None:
        super().__init__()
        self.cuda()  # hard-coded, as scripts written for one GPU do


def cuda_batch(n):
    return torch.randn(n, 3, 32, 32, device="cuda"), torch.randint(0, 10, (n,)).to("cuda:0")


def cuda_step(model, batch, optimizer):
    focal_step(model, batch, optimizer)
    torch.cuda.synchronize()
    assert mm.simulating()


@pytest.mark.parametrize("backend", ["sim", "cpu"])
def test_hard_coded_cuda_devices_run_on_the_backends_own(backend):
    job = mm.Training(model=CudaCNN, batch=cuda_batch, step=focal_step, optimizer=adamw)
    m = mm.Session(mm.Settings(backend=backend, **SMALL), training=job).measure(8)
    assert m.fits and m.backend == backend


def test_simulating_says_when_the_step_is_on_fake_tensors():
    seen = []

    def step(model, batch, optimizer):
        seen.append(mm.simulating())
        focal_step(model, batch, optimizer)

    job = mm.Training(model=TinyCNN, batch=cnn_batch, step=step, optimizer=adamw)
    mm.Session(mm.Settings(backend="sim", **SMALL), training=job).measure(4)
    mm.Session(mm.Settings(backend="cpu", **SMALL), training=job).measure(4)
    assert seen == [True, False]
    assert not mm.simulating()


def test_a_cuda_call_with_no_host_equivalent_is_one_line_naming_the_users_line():
    def step(model, batch, optimizer):
        torch.cuda.current_device()

    job = mm.Training(model=TinyCNN, batch=cnn_batch, step=step, optimizer=adamw)
    with pytest.raises(mm.SimulationError) as info:
        mm.Session(mm.Settings(**SMALL), training=job).measure(4)
    message = str(info.value)
    assert "\n" not in message and f"{__file__}:" in message
    assert "torch.cuda.current_device()" in message


# -- a GAN: two optimizers, two backward passes ---------------------------------------------------
class TinyGAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))
        self.discriminator = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))


def gan_optimizers(model: nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    return (
        torch.optim.Adam(model.generator.parameters(), lr=2e-4),
        torch.optim.Adam(model.discriminator.parameters(), lr=2e-4),
    )


def gan_step(model, batch, optimizers):
    opt_g, opt_d = optimizers
    noise, real = batch
    bce = nn.functional.binary_cross_entropy_with_logits
    fake = model.generator(noise)
    d_real, d_fake = model.discriminator(real), model.discriminator(fake.detach())
    d_loss = bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))
    d_loss.backward()
    opt_d.step()
    opt_d.zero_grad(set_to_none=True)
    g_out = model.discriminator(fake)
    g_loss = bce(g_out, torch.ones_like(g_out))
    g_loss.backward()
    opt_g.step()
    opt_g.zero_grad(set_to_none=True)
    opt_d.zero_grad(set_to_none=True)


def test_a_gan_with_two_optimizers_and_two_backward_passes():
    job = mm.Training(
        model=TinyGAN,
        batch=lambda n: (torch.randn(n, 16), torch.randn(n, 32)),
        step=gan_step,
        optimizer=gan_optimizers,
    )
    session = mm.Session(mm.Settings(**SMALL), training=job)
    m = session.measure(64)
    params = sum(p.numel() * 4 for p in TinyGAN().parameters())
    assert m.fits
    # Both optimizers' moments (and their step counts) are primed and counted.
    assert 2 * params <= m.breakdown.optimizer_state < 2 * params + 1024
    report = session.analyze()
    assert report.optimal is not None and report.optimal.batch_size > 64


# -- the same step through a second front door ----------------------------------------------------
def test_a_user_written_bert_gets_the_catalogs_answer():
    config = dict(_config_dict("tiny-bert.json"))
    config.pop("model_type")

    def make_model():
        return transformers.BertForSequenceClassification(
            transformers.BertConfig(**config, num_labels=2)
        )

    def make_batch(n):
        return {
            "input_ids": torch.randint(0, 1000, (n, 128)),
            "labels": torch.randint(0, 2, (n,)),
        }

    def step(model, batch, optimizer):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    job = mm.Training(model=make_model, batch=make_batch, step=step, optimizer=adamw)
    user = mm.Session(mm.Settings(**SMALL), training=job).analyze()
    catalog = mm.Session(mm.Settings(model="tiny-bert", seq_len=128, **SMALL)).analyze()
    assert user.optimal.batch_size == catalog.optimal.batch_size
    assert user.max_fit.batch_size == catalog.max_fit.batch_size
    u, c = user.optimal, catalog.optimal
    # The user's loop keeps its batch dict alive through backward; the catalog's drops it.
    assert abs(u.peak_bytes - c.peak_bytes) <= 8 * u.batch_size
    assert u.breakdown.optimizer_state == c.breakdown.optimizer_state


# -- what fake tensors cannot know ---------------------------------------------------------------
def logging_step(model, batch, optimizer):
    focal_step(model, batch, optimizer)
    loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
    print(f"loss {loss.item():.3f}")  # LOGGED


def test_a_step_that_logs_loss_item_runs_and_its_report_lists_the_read(capsys):
    job = mm.Training(model=TinyCNN, batch=cnn_batch, step=logging_step, optimizer=adamw)
    report = mm.Session(mm.Settings(**SMALL), training=job).analyze()
    assert report.optimal is not None
    line = next(i for i, text in enumerate(inspect.getsource(sys.modules[__name__]).splitlines(), 1)
                if text.strip().endswith("# LOGGED"))  # fmt: skip
    assert [(r.file, r.line) for r in report.value_reads] == [(__file__, line)]
    assert report_to_dict(report)["value_reads"] == [
        {
            "file": __file__,
            "line": line,
            "op": 'print(f"loss {loss.item():.3f}")  # LOGGED',
            "library": None,
        }
    ]
    assert "loss 0.000" in capsys.readouterr().out  # the read got zero


class MaskingModel(TinyCNN):
    def forward(self, x):
        logits = super().forward(x)
        return logits[logits > 0]  # MASKED


def test_a_boolean_mask_is_one_line_naming_the_users_file_and_line():
    def step(model, batch, optimizer):
        model(batch[0]).sum().backward()

    job = mm.Training(model=MaskingModel, batch=cnn_batch, step=step, optimizer=adamw)
    with pytest.raises(mm.SimulationError) as info:
        mm.Session(mm.Settings(**SMALL), training=job).measure(4)
    message = str(info.value)
    assert isinstance(info.value, ValueError) and "\n" not in message
    assert f"{__file__}:" in message and "logits[logits > 0]" in message
    assert "memorymark.simulating()" in message


def test_a_jobs_real_step_on_the_cpu_backend():
    job = mm.Training(model=TinyCNN, batch=cnn_batch, step=logging_step, optimizer=adamw)
    session = mm.Session(mm.Settings(backend="cpu", **SMALL), training=job)
    m = session.measure(8)
    assert m.fits and m.backend == "cpu" and m.value_reads == ()  # real values: nothing to report
    sim = mm.Session(mm.Settings(backend="sim", **SMALL), training=job).measure(8)
    # Real CPU kernels and fake tensors with CPU's... the same step, close to the byte.
    assert abs(m.breakdown.parameters - sim.breakdown.parameters) == 0
    assert m.breakdown.optimizer_state == sim.breakdown.optimizer_state


# -- what the settings may say beside a job -------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"precision": "bf16-mixed"}, "--precision describes the model or its step"),
        ({"lora_rank": 8, "model": "gpt2"}, "--lora-rank describes"),
        ({"grad_checkpointing": True, "optimizer": "sgd"}, "--optimizer, --checkpointing"),
        ({"dist": "ddp", "gpus": "2"}, "sized on one GPU for now"),
        ({"target_batch": 256}, "drop --target-batch"),
    ],
)
def test_settings_that_the_jobs_code_says_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message.replace("-", r"\-")):
        mm.Session(mm.Settings(**settings), training=CNN)


def test_what_only_a_catalog_model_can_do_is_refused_in_one_line():
    session = mm.Session(mm.Settings(**SMALL), training=CNN)
    with pytest.raises(ValueError, match="comparing GPUs is for catalog models for now"):
        session.compare()
    with pytest.raises(ValueError, match="backward-pass proof is for catalog models"):
        next(session.proof(4))


def test_bad_callables_are_one_line_errors():
    with pytest.raises(ValueError, match="not a built one"):
        mm.Training(model=TinyCNN(), batch=cnn_batch, step=focal_step)
    job = mm.Training(model=lambda: "not a module", batch=cnn_batch, step=focal_step)
    with pytest.raises(ValueError, match="must return a torch.nn.Module"):
        mm.Session(mm.Settings(**SMALL), training=job).measure(1)
    with pytest.raises(ValueError, match="must be a memorymark.Training"):
        mm.Session(mm.Settings(), training=CNN.model)


# -- the command line ------------------------------------------------------------------------------
TRAINING_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn
    import memorymark as mm

    def step(model, batch, optimizer):
        x, y = batch
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print("loss", loss.item())

    def training():
        return mm.Training(
            model=lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4)),
            batch=lambda n: (torch.randn(n, 64), torch.randint(0, 4, (n,))),
            step=step,
            optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
            name="mlp",
        )

    def not_a_training():
        return 42

    def masked_step(model, batch, optimizer):
        x, y = batch
        out = model(x)
        out[out > 0].sum().backward()

    def masked():
        return mm.Training(model=lambda: nn.Linear(64, 4), batch=training().batch,
                           step=masked_step, optimizer=training().optimizer)
    """
)


@pytest.fixture
def training_file(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TRAINING_FILE)
    return path


def test_cli_analyze_training_json_is_one_object_though_the_step_prints(capsys, training_file):
    argv = ["analyze", "--training", f"{training_file}:training", "--gpu", "t4", "--json"]
    status = main([*argv, "--max-batch", "512", "--no-save"])
    out, err = capsys.readouterr()
    assert status == 0, err
    data = json.loads(out)
    assert data["model_name"] == "mlp" and data["training"] is True
    assert data["optimal_batch_size"] == 512 and data["capped_at_max_batch"]
    assert data["value_reads"][0]["file"] == str(training_file)
    assert data["value_reads"][0]["op"] == 'print("loss", loss.item())'
    assert "loss 0.0" in err  # the step's own print, kept off stdout


def test_cli_measure_training_text(capsys, training_file):
    status = main(["measure", "--training", f"{training_file}:training", "--batch-size", "32"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.startswith("batch 32: fits")
    assert f"value read as 0 (simulated): {training_file}:" in out


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{file}", "takes path/to/file.py:function"),
        ("{file}:nothing_here", "defines no function nothing_here()"),
        ("{file}:not_a_training", "must return memorymark.Training"),
        ("/no/such/file.py:training", "is not a Python file here"),
        ("{file}:masked", "train.py:29 (out[out > 0].sum().backward())"),
    ],
)
def test_cli_bad_training_specs_are_one_line(training_file, spec, message):
    proc = subprocess.run(
        [sys.executable, "-m", "memorymark", "measure", "--batch-size", "4", "--training",
         spec.format(file=training_file)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""


def test_cli_refuses_a_model_beside_a_training_and_user_code_when_hosted(
    capsys, training_file, monkeypatch
):
    spec = f"{training_file}:training"
    assert main(["measure", "bert", "--training", spec, "--batch-size", "4"]) == 2
    assert "not two" in capsys.readouterr().err
    assert main(["analyze", "--training", spec, "--format", "hf"]) == 2
    assert "writes settings for a catalog model" in capsys.readouterr().err
    monkeypatch.setenv("MEMORYMARK_HOSTED", "true")
    assert main(["measure", "--training", spec, "--batch-size", "4"]) == 2
    assert "never runs user code" in capsys.readouterr().err


def test_the_example_training_file_sizes_from_the_cli():
    proc = subprocess.run(
        [sys.executable, "-m", "memorymark", "measure", "--training",
         "examples/own_training.py:training", "--gpu", "t4", "--batch-size", "16", "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["success"] and data["peak_bytes"] < 16 * GIB
    assert data["value_reads"] and data["value_reads"][0]["line"] > 0


def test_a_job_on_a_real_device_runs_its_step_as_written_and_reads_the_devices_peak():
    from types import SimpleNamespace

    from memorymark.backends.device import DeviceBackend
    from memorymark.fit import FitPolicy
    from memorymark.step.user_step import UserStep

    # torch.cuda's memory API on CPU: the real-device path's logic, with no GPU.
    cuda = SimpleNamespace(
        reset_peak_memory_stats=lambda: None,
        max_memory_allocated=lambda: 1234,
        max_memory_reserved=lambda: 4096,
        memory_stats=lambda: {"num_alloc_retries": 0, "num_ooms": 0},
        synchronize=lambda: None,
        empty_cache=lambda: None,
    )
    steps = []

    def step(model, batch, optimizer):
        steps.append(mm.simulating())
        logging_step(model, batch, optimizer)

    job = mm.Training(model=TinyCNN, batch=cnn_batch, step=step, optimizer=adamw)
    backend = DeviceBackend(
        UserStep(job, mm.Settings()),
        policy=FitPolicy(capacity_bytes=GIB),
        name="cpu",
        device_module=cuda,
        peak_stats=True,
        timed_steps=2,
    )
    m = backend.measure(4)
    assert (m.peak_bytes, m.reserved_bytes, m.measured, m.fits) == (1234, 4096, True, True)
    assert m.throughput_source == "measured" and m.value_reads == ()
    assert steps == [False] * (1 + 1 + 2)  # the tracked step, a warm-up, two timed steps
