"""A training script's own model, batch, step and optimizer, sized by MemoryMark.

    memorymark analyze --training examples/own_training.py:training --gpu a10
    memorymark measure --training examples/own_training.py:training --gpu t4 --batch-size 64

A small CNN with a custom loss, trained under bf16 autocast with gradient clipping, logging its
loss every step as real loops do: the simulation runs this code unchanged.
"""

import torch
from torch import nn

import memorymark as mm


class SmallCNN(nn.Module):
    """Two conv blocks and a classifier over 10 classes, for 224x224 images."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1),
            nn.BatchNorm2d(128),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.randn(batch_size, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 10, (batch_size,), device="cuda")
    return images, labels


def train_step(model: nn.Module, batch: tuple, optimizer: torch.optim.Optimizer) -> None:
    images, labels = batch
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(images)
        # Label smoothing plus a small logit penalty: a loss of the script's own.
        loss = nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)
        loss = loss + 1e-4 * logits.float().pow(2).mean()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"loss {loss.item():.4f}")


def training() -> mm.Training:
    """What `--training examples/own_training.py:training` loads."""
    return mm.Training(
        model=SmallCNN,
        batch=make_batch,
        step=train_step,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        name="small-cnn",
    )


if __name__ == "__main__":
    report = mm.Session(mm.Settings(gpu="a10"), training=training()).analyze()
    print(report.verdict())
