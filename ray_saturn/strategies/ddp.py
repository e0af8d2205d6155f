"""``ddp``: torch DistributedDataParallel, one replica per GPU.

Example:
    >>> from ray_saturn.strategies import get_strategy
    >>> get_strategy("ddp").exact
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch.nn.parallel import DistributedDataParallel

from ray_saturn.spec import Task
from ray_saturn.strategies.base import Runner, Strategy, WorkerContext
from ray_saturn.strategies.data_parallel import DataParallelRunner


def wrap_ddp(
    model: torch.nn.Module, ctx: WorkerContext, bucket_cap_mb: float = 25.0
) -> DistributedDataParallel:
    """Move ``model`` to this worker's device and wrap it in DDP."""
    model = model.to(ctx.device)
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_cap_mb)


class DDP(Strategy):
    """Data parallel with gradient all-reduce (exact). Knob: ``bucket_cap_mb``."""

    name = "ddp"
    min_gpus = 2
    knob_defaults: ClassVar[dict[str, Any]] = {"bucket_cap_mb": 25.0}

    def prepare(
        self, model: torch.nn.Module, task: Task, knobs: Mapping[str, Any], ctx: WorkerContext
    ) -> Runner:
        ddp = wrap_ddp(model, ctx, float(knobs["bucket_cap_mb"]))
        optimizer = task.optimizer(ddp.module.parameters(), task.hparams)
        return DataParallelRunner(ddp, ddp.module, optimizer, task.loss, ctx)
