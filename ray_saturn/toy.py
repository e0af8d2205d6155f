"""Small, deterministic tasks for tests, demos and the GPU check (no downloads).

The factories are module-level functions bound with ``functools.partial``, so
tasks pickle by reference (``torch.multiprocessing`` spawn, Ray).

Example:
    >>> task = mlp_task("mlp-a", lr=0.01, max_steps=10)
    >>> task.batch_size, task.total_steps
    (16, 10)
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
from torch import nn

from ray_saturn.spec import Task

__all__ = ["faulty_task", "mlp_task"]


def _mlp(hp: dict[str, Any], *, features: int, width: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(features, width), nn.Tanh()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), nn.Tanh()]
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def _regression(hp: dict[str, Any], *, features: int, batch_size: int, batches: int) -> list[tuple]:
    g = torch.Generator().manual_seed(int(hp.get("data_seed", 1234)))
    w = torch.randn(features, 1, generator=g)
    out = []
    for _ in range(batches):
        x = torch.randn(batch_size, features, generator=g)
        y = torch.sin(x @ w) + 0.05 * torch.randn(batch_size, 1, generator=g)
        out.append((x, y))
    return out


def _mse(output: torch.Tensor, batch: tuple) -> torch.Tensor:
    return nn.functional.mse_loss(output, batch[1].to(output.device))


def _optimizer(params, hp: dict[str, Any], *, kind: str):
    if kind == "adam":
        return torch.optim.Adam(params, lr=hp["lr"])
    return torch.optim.SGD(params, lr=hp["lr"], momentum=0.9)


def mlp_task(
    name: str = "mlp",
    *,
    lr: float = 0.01,
    seed: int = 0,
    features: int = 16,
    width: int = 32,
    depth: int = 4,
    batch_size: int = 16,
    batches: int = 8,
    max_steps: int = 100,
    optimizer: str = "adam",
) -> Task:
    """A ``depth``-layer tanh MLP regressing a fixed random function.

    The data is the same for every lr and seed.
    """
    return Task(
        name=name,
        model=functools.partial(_mlp, features=features, width=width, depth=depth),
        data=functools.partial(
            _regression, features=features, batch_size=batch_size, batches=batches
        ),
        loss=_mse,
        optimizer=functools.partial(_optimizer, kind=optimizer),
        hparams={"lr": lr, "seed": seed},
        max_steps=max_steps,
        batch_size=batch_size,
    )


class _Faulty(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.lin = nn.Linear(16, 1)

    def extra_repr(self) -> str:
        return f"mode={self.mode}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "raise":
            raise RuntimeError("toy model failure")
        if self.mode == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB (toy)")
        if self.mode == "hang":
            time.sleep(3600)
        return self.lin(x)


def _faulty(hp: dict[str, Any], *, mode: str) -> nn.Module:
    return _Faulty(mode)


def faulty_task(name: str, mode: str, max_steps: int = 100) -> Task:
    """A task whose forward raises (``raise``), runs out of memory (``oom``) or hangs (``hang``)."""
    return Task(
        name=name,
        model=functools.partial(_faulty, mode=mode),
        data=functools.partial(_regression, features=16, batch_size=16, batches=2),
        loss=_mse,
        optimizer=functools.partial(_optimizer, kind="sgd"),
        hparams={"lr": 0.1},
        max_steps=max_steps,
        batch_size=16,
    )
