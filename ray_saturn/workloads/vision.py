"""Small CNNs classifying generated images of shapes (no downloads).

Images are ``1 x size x size`` with one of four shapes (filled square,
ring, cross, diagonal bar) at a random position and scale, plus noise; the
label is the shape. Deterministic given ``hparams["data_seed"]``.

Example:
    >>> task = cnn_task(channels=8, lr=0.01, max_steps=5)
    >>> x, y = task.data(task.hparams)[0]
    >>> tuple(x.shape), int(y.max()) < 4
    ((32, 1, 24, 24), True)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ray_saturn.spec import Task

__all__ = ["SHAPES", "cnn_task", "shapes_batch"]

SHAPES = ("square", "ring", "cross", "bar")


def shapes_batch(n: int, size: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` generated images ``(n, 1, size, size)`` and their labels ``(n,)``."""
    yy, xx = torch.meshgrid(torch.arange(size, dtype=torch.float32), torch.arange(size, dtype=torch.float32),
                            indexing="ij")
    labels = torch.randint(0, len(SHAPES), (n,), generator=g)
    images = torch.zeros(n, 1, size, size)
    for i in range(n):
        r = float(torch.randint(size // 6, size // 3, (1,), generator=g))
        cx, cy = (float(v) for v in torch.randint(int(r), size - int(r), (2,), generator=g))
        dx, dy = xx - cx, yy - cy
        kind = SHAPES[int(labels[i])]
        if kind == "square":
            img = (dx.abs() <= r) & (dy.abs() <= r)
        elif kind == "ring":
            d = (dx**2 + dy**2).sqrt()
            img = (d <= r) & (d >= r - 1.5)
        elif kind == "cross":
            img = ((dx.abs() <= 1) & (dy.abs() <= r)) | ((dy.abs() <= 1) & (dx.abs() <= r))
        else:
            img = ((dx - dy).abs() <= 1.2) & (dx.abs() <= r)
        images[i, 0] = img.float()
    images += 0.2 * torch.randn(images.shape, generator=g)
    return images, labels


def _model(hp: Mapping[str, Any], *, channels: int, classes: int) -> nn.Module:
    c = channels
    return nn.Sequential(
        nn.Conv2d(1, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(2 * c, 2 * c, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(2 * c, classes),
    )


def _data(hp: Mapping[str, Any], *, size: int, batch_size: int, batches: int) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(int(hp.get("data_seed", 4321)))
    return [shapes_batch(batch_size, size, g) for _ in range(batches)]


def _loss(logits: torch.Tensor, batch: tuple) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, batch[1].to(logits.device))


def _adam(params, hp: Mapping[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=float(hp["lr"]))


def cnn_task(
    *,
    channels: int = 16,
    lr: float = 3e-3,
    size: int = 24,
    batch_size: int = 32,
    max_steps: int = 200,
    batches: int = 32,
    seed: int = 0,
    name: str | None = None,
    strategies: tuple[str, ...] | None = None,
) -> Task:
    """A shape-classification task for a 3-layer CNN with ``channels`` base channels."""
    return Task(
        name=name or f"cnn-c{channels}-lr{lr:g}",
        model=functools.partial(_model, channels=channels, classes=len(SHAPES)),
        data=functools.partial(_data, size=size, batch_size=batch_size, batches=batches),
        loss=_loss,
        optimizer=_adam,
        hparams={"lr": lr, "seed": seed, "channels": channels},
        max_steps=max_steps,
        batch_size=batch_size,
        strategies=strategies,
    )
