"""``single``: one GPU (or the CPU), a plain training loop.

Example:
    >>> from ray_saturn.strategies import get_strategy
    >>> get_strategy("single").applies(task=None, gpus=2)
    'single runs on at most 1 GPU(s), not 2'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ray_saturn.spec import Task
from ray_saturn.strategies.base import Runner, Strategy, WorkerContext
from ray_saturn.strategies.data_parallel import DataParallelRunner


class Single(Strategy):
    """Plain one-process training; the reference the exact strategies are tested against."""

    name = "single"
    max_gpus = 1

    def prepare(
        self, model: torch.nn.Module, task: Task, knobs: Mapping[str, Any], ctx: WorkerContext
    ) -> Runner:
        model = model.to(ctx.device)
        optimizer = task.optimizer(model.parameters(), task.hparams)
        return DataParallelRunner(
            model, model, optimizer, task.loss, WorkerContext(0, 1, ctx.device)
        )
