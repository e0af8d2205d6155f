"""The runner shared by the data-parallel strategies (single, ddp, ddp-compressed, fsdp).

Each worker takes its equal slice of the global batch, runs forward and
backward through the wrapped model (whose wrapper averages the gradients
across workers), and steps the optimizer. Because every slice has the same
number of rows and the loss is a mean, the averaged gradient is the gradient
of the whole batch: the same maths as one-process training.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ray_saturn.strategies.base import Runner, WorkerContext
from ray_saturn.strategies.batching import model_input, shard_batch, to_device

__all__ = ["DataParallelRunner", "mean_across_workers"]


def mean_across_workers(value: torch.Tensor, ctx: WorkerContext) -> float:
    """The mean of a scalar over all workers (the value itself on one worker)."""
    value = value.detach().float().reshape(1)
    if ctx.distributed:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= ctx.world_size
    return float(value.item())


class DataParallelRunner(Runner):
    """One optimizer step per global batch for a data-parallel wrapped model.

    ``wrapped`` is called on the input (a DDP or FSDP module, or the model);
    ``module`` is the unwrapped model whose state dict is checkpointed.
    """

    def __init__(
        self,
        wrapped: torch.nn.Module,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        ctx: WorkerContext,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.wrapped = wrapped
        self.module = module
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.ctx = ctx
        self._on_close = on_close

    def step(self, batch: Any) -> float:
        local = to_device(shard_batch(batch, self.ctx.rank, self.ctx.world_size), self.ctx.device)
        self.zero_grad()
        out = self.wrapped(model_input(local))
        loss = self.loss_fn(out, local)
        loss.backward()
        self.optimizer_step()
        return mean_across_workers(loss, self.ctx)

    def zero_grad(self) -> None:
        """Drop the previous step's gradients (a wrapper that owns them overrides this)."""
        self.optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self) -> None:
        """Apply the averaged gradients (a sharded optimizer overrides this)."""
        self.optimizer.step()

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
