"""MLP regression tasks built from a Tune-style config ``{"lr": ..., "width": ...}``.

Example:
    >>> task = regression_task({"lr": 0.1, "width": 32}, max_steps=10)
    >>> task.name, task.total_steps
    ('mlp-w32-lr0.1', 10)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from ray_saturn.spec import Task

__all__ = ["regression_task"]


def _model(hp: Mapping[str, Any], *, width: int, features: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(features, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))


def _data(hp: Mapping[str, Any], *, features: int, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(int(hp.get("data_seed", 7)))
    w = torch.randn(features, 1, generator=g)
    out = []
    for _ in range(8):
        x = torch.randn(batch_size, features, generator=g)
        out.append((x, torch.sin(x @ w)))
    return out


def _loss(out: torch.Tensor, batch: tuple) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, batch[1].to(out.device))


def _sgd(params, hp: Mapping[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=float(hp["lr"]), momentum=0.9)


def regression_task(config: Mapping[str, Any], *, max_steps: int = 100, features: int = 8,
                    batch_size: int = 16) -> Task:
    """A Task for one Tune config: an MLP of ``config["width"]`` trained with SGD at ``config["lr"]``."""
    width, lr = int(config.get("width", 32)), float(config["lr"])
    return Task(
        name=f"mlp-w{width}-lr{lr:g}",
        model=functools.partial(_model, width=width, features=features),
        data=functools.partial(_data, features=features, batch_size=batch_size),
        loss=_loss,
        optimizer=_sgd,
        hparams={"lr": lr, "seed": int(config.get("seed", 0))},
        max_steps=max_steps,
        batch_size=batch_size,
    )
