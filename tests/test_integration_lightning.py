"""The Lightning integration: a LightningModule sized as Lightning's fit loop runs it, its batch
size set where Lightning's BatchSizeFinder sets it, by a function and by a callback in a real
Trainer. Tiny models on a simulated 1 GiB GPU, so every answer lies inside `max_batch`."""

from __future__ import annotations

import importlib
import sys

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.compile import from_compiled
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from memorymark import SimulationError
from memorymark.integrations import lightning_batches
from memorymark.integrations.lightning import (
    MemoryMarkBatchSizeFinder,
    as_training,
    find_batch_size,
)

SEARCH = {"gpu_memory_gib": 1, "max_batch": 4096}
"""A GPU small enough that the conv net's answer (~560) is neither 1 nor max_batch."""


def _images(count: int) -> TensorDataset:
    return TensorDataset(torch.randn(count, 3, 64, 64), torch.randint(0, 10, (count,)))


class ConvNet(pl.LightningModule):
    """Automatic optimization, the batch size in hparams, the loss in a dict, a scheduler
    whose length comes from the Trainer."""

    def __init__(self, batch_size: int = 8, samples: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, 10),
        )
        self.data = _images(samples)
        self.rows_trained: list[int] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> dict:
        x, y = batch
        self.rows_trained.append(x.shape[0])
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return {"loss": loss}

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        total_steps = self.trainer.estimated_stepping_batches  # read from the Trainer, if any
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 1.0, total_steps=total_steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.hparams.batch_size)


class Gan(pl.LightningModule):
    """Manual optimization with two optimizers, as Lightning's GAN example steps them."""

    def __init__(self, batch_size: int = 4, width: int = 8192) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 1024))
        self.critic = nn.Sequential(nn.Linear(1024, width), nn.ReLU(), nn.Linear(width, 1))
        self.data = TensorDataset(torch.randn(8, 1024))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        (real,) = batch
        g_opt, c_opt = self.optimizers()
        fake = self.generator(torch.randn(real.shape[0], 16, device=self.device))
        g_loss = nn.functional.softplus(-self.critic(fake)).mean()
        g_opt.zero_grad()
        self.manual_backward(g_loss)
        g_opt.step()
        c_loss = (
            nn.functional.softplus(self.critic(fake.detach())).mean()
            + nn.functional.softplus(-self.critic(real)).mean()
        )
        c_opt.zero_grad()
        self.manual_backward(c_loss)
        self.clip_gradients(c_opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        c_opt.step()
        self.log_dict({"g_loss": g_loss, "c_loss": c_loss})

    def configure_optimizers(self) -> tuple[list, list]:
        return [
            torch.optim.Adam(self.generator.parameters()),
            torch.optim.Adam(self.critic.parameters()),
        ], []

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size)


class NoBatchSize(ConvNet):
    """A module whose loader the datamodule owns: no batch size of its own."""

    def __init__(self) -> None:
        super().__init__()
        del self.hparams["batch_size"]

    def train_dataloader(self) -> DataLoader:
        raise AssertionError("the datamodule's loader is the one read")


class Images(pl.LightningDataModule):
    def __init__(self, batch_size: int = 8) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.set_up: list[str] = []

    def setup(self, stage: str) -> None:
        self.set_up.append(stage)
        self.data = _images(16)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size)


def test_automatic_optimization_sets_the_batch_size_to_the_answer() -> None:
    module = ConvNet()
    result = find_batch_size(module, **SEARCH)
    optimal = result.report.optimal
    assert 16 < optimal.batch_size < SEARCH["max_batch"]
    assert module.hparams.batch_size == result.batch_size == optimal.batch_size
    assert result.report.settings.search.current_batch == 8  # the module's own value, compared with
    assert result.report.training == "ConvNet"
    # The step ran on a copy (the module itself never ran), SGD's momentum counted.
    assert module.rows_trained == []
    assert optimal.breakdown.optimizer_state == sum(p.numel() * 4 for p in module.parameters())


@pytest.fixture(scope="module")
def fp32_answer() -> int:
    return find_batch_size(ConvNet(), **SEARCH).batch_size


@pytest.mark.parametrize("precision", ["16-true", "bf16-mixed"])
def test_half_precision_fits_about_twice_the_rows(precision: str, fp32_answer: int) -> None:
    # The conv net's bytes are activations: half-precision ones cost half as much a row, and
    # 16-true halves the weights and optimizer state beside them too.
    half = find_batch_size(ConvNet(), precision=precision, **SEARCH).batch_size
    assert 1.7 * fp32_answer < half < 2.4 * fp32_answer


@pytest.mark.parametrize("clip", [None, 1e-3])
def test_gradients_are_clipped_as_the_trainer_s_gradient_clip_val_says(clip: float | None) -> None:
    # Eager, on real CPU tensors: the copy's step as the fit loop runs it, once.
    training = as_training(ConvNet(), gradient_clip_val=clip)
    copy = training.model()
    optimizers = training.optimizer(copy)
    training.step(copy, training.batch(4), optimizers)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in copy.parameters()]))
    assert (norm <= 1.001e-3) == (clip is not None)


def test_manual_optimization_with_two_optimizers() -> None:
    module = Gan()
    result = find_batch_size(module, **SEARCH)
    optimal = result.report.optimal
    assert 4 < optimal.batch_size < SEARCH["max_batch"]
    assert module.batch_size == optimal.batch_size
    # Both Adams' state (two fp32 moments a parameter) is on the simulated GPU.
    moments_bytes = 2 * 4 * sum(p.numel() for p in module.parameters())
    assert optimal.breakdown.optimizer_state == pytest.approx(moments_bytes, rel=0.01)


def test_batch_size_on_the_datamodule() -> None:
    module, data = NoBatchSize(), Images()
    result = find_batch_size(module, datamodule=data, **SEARCH)
    assert data.batch_size == result.batch_size > 16
    assert data.set_up == ["fit"]  # as trainer.fit would before reading its loader
    assert "batch_size" not in module.hparams


# Lightning 2.6's combined_loader.py builds a `LeafSpec`, which torch 2.13 deprecates; and it
# suggests more loader workers, which a 700-sample test has no use for.
@pytest.mark.filterwarnings(
    "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"
)
@pytest.mark.filterwarnings("ignore:The 'train_dataloader' does not have many workers")
def test_the_callback_sets_the_batch_size_before_training() -> None:
    module = ConvNet(samples=700)  # more samples than the answer: the first batch is full
    finder = MemoryMarkBatchSizeFinder(**SEARCH)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[finder],
    )
    trainer.fit(module)
    assert 16 < finder.optimal_batch_size < 700
    assert module.hparams.batch_size == finder.optimal_batch_size
    assert module.rows_trained == [finder.optimal_batch_size]
    assert finder.report.optimal.batch_size == finder.optimal_batch_size


def test_without_lightning_the_import_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "lightning", None)  # what a missing package looks like
    monkeypatch.delitem(sys.modules, "memorymark.integrations.lightning")
    with pytest.raises(ImportError, match=r"pip install lightning") as caught:
        importlib.import_module("memorymark.integrations.lightning")
    assert "\n" not in str(caught.value)
    assert "memorymark[lightning]" in str(caught.value)


def test_not_a_lightning_module() -> None:
    with pytest.raises(ValueError, match=r"takes a lightning.pytorch.LightningModule, got Linear"):
        find_batch_size(nn.Linear(2, 2))


def test_no_batch_size_anywhere() -> None:
    with pytest.raises(ValueError, match=r"no 'batch_size' on NoBatchSize.*batch_arg_name="):
        find_batch_size(NoBatchSize(), **SEARCH)


def test_a_loader_that_ignores_the_batch_size() -> None:
    module = ConvNet()
    module.train_dataloader = lambda: DataLoader(module.data, batch_size=4)
    with pytest.raises(ValueError, match=r"same batch whatever 'batch_size' is"):
        find_batch_size(module, **SEARCH)
    assert module.hparams.batch_size == 8  # set back after each read


def test_the_batch_grows_every_row_and_keeps_the_rest() -> None:
    small = {"x": torch.zeros(2, 5), "ids": ["a", "b"], "scale": torch.ones(4)}
    large = {"x": torch.arange(15.0).reshape(3, 5), "ids": ["a", "b", "c"], "scale": torch.ones(4)}
    grown = lightning_batches.grow(small, large, 7)
    assert grown["x"].shape == (7, 5) and grown["x"].is_contiguous()
    assert torch.equal(grown["x"][3], large["x"][0])
    assert grown["ids"] == ["a", "b", "c", "a", "b", "c", "a"]
    assert grown["scale"].shape == (4,)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_a_compiled_module_is_refused_in_one_line() -> None:
    with pytest.raises(SimulationError, match=r"not modelled yet \(the module is torch.compile'd"):
        find_batch_size(torch.compile(ConvNet()), **SEARCH)
    # as Trainer.fit(torch.compile(module)) hands it to callbacks: its forward compiled
    module = from_compiled(torch.compile(ConvNet()))
    with pytest.raises(SimulationError, match=r"\(the module's forward is compiled\)"):
        find_batch_size(module, **SEARCH)
