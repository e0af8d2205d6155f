"""``pipeline``: pipeline parallelism with ``torch.distributed.pipelining`` (GPipe schedule).

The model must be an ``nn.Sequential``; worker ``i`` holds stage ``i``, a
run of consecutive children kept under their original names (so checkpoints
use the model's own parameter names). Every worker reads the same global
batch; stage 0 feeds its input in micro-batches, the last stage computes
``task.loss`` on each micro-batch's rows and the schedule averages the
gradients over micro-batches, which is the gradient of the whole batch.

Knobs:

* ``microbatches`` (int): micro-batches per step; must divide the batch rows.
* ``split``: ``"params"`` (balance parameter counts, the default),
  ``"layers"`` (balance child counts) or explicit child indices where stages
  2, 3, ... start, e.g. ``[3]`` for two stages split before child 3.

Example:
    >>> from torch import nn
    >>> stage_bounds(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)), 2, "layers")
    [0, 2, 3]
    >>> four = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Linear(4, 4))
    >>> stage_bounds(four, 3, "params")
    [0, 2, 3, 4]
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from ray_saturn.spec import Task
from ray_saturn.strategies.base import KnobError, Runner, Strategy, WorkerContext
from ray_saturn.strategies.batching import batch_rows, model_input, slice_batch, to_device

__all__ = ["Pipeline", "stage_bounds"]


def stage_bounds(model: nn.Sequential, stages: int, split: Any) -> list[int]:
    """Child index bounds ``[0, b1, ..., n]`` of ``stages`` stages of a sequential model.

    Every stage starts at a child that holds parameters (so every stage has
    some to train); parameter-free children (activations) stay with the stage
    before them.
    """
    n = len(model)
    has_params = [any(True for _ in child.parameters()) for child in model]
    starts = [i for i in range(1, n) if has_params[i]]
    if isinstance(split, (list, tuple)):
        bounds = [0, *(int(b) for b in split), n]
        if len(bounds) != stages + 1 or any(b >= c for b, c in itertools.pairwise(bounds)):
            raise KnobError(
                f"pipeline: split {list(split)} must be {stages - 1} increasing child indices in 1..{n - 1}"
            )
    elif split in ("layers", "params"):
        if len(starts) < stages - 1:
            raise KnobError(
                f"pipeline: {stages} stages need {stages} layers with parameters; "
                f"the model has {len(starts) + int(has_params[0]) if n else 0}"
            )
        weights = [1] * n if split == "layers" else [sum(p.numel() for p in c.parameters()) for c in model]
        total = sum(weights) or 1
        cum = list(itertools.accumulate(weights))
        bounds = [0]
        for k in range(1, stages):
            # the first allowed start at or after stage k's share, leaving one start per later stage
            allowed = [b for b in starts if b > bounds[-1]][: len(starts)]
            allowed = allowed[: len(allowed) - (stages - 1 - k)]
            target = total * k / stages
            bounds.append(min(allowed, key=lambda b: abs(cum[b - 1] - target)))
        bounds.append(n)
    else:
        raise KnobError(f"pipeline: split is {split!r}; use 'params', 'layers' or a list of child indices")
    for a, b in itertools.pairwise(bounds):
        if not any(has_params[a:b]):
            raise KnobError(f"pipeline: stage of children {a}..{b - 1} has no parameters; split elsewhere")
    return bounds


class _PipelineRunner(Runner):
    def __init__(
        self, stage_module, schedule, optimizer, loss_holder, ctx: WorkerContext, microbatches: int = 1
    ) -> None:
        self.module = stage_module
        self.schedule = schedule
        self.optimizer = optimizer
        self._loss = loss_holder
        self.ctx = ctx
        self.microbatches = microbatches

    def step(self, batch: Any) -> float:
        ctx = self.ctx
        rows, mb = batch_rows(batch), self.microbatches
        if rows % mb:  # unequal micro-batches would weigh rows unequally in the averaged gradient
            raise KnobError(f"pipeline: {mb} micro-batches do not split a batch of {rows} rows evenly")
        batch = to_device(batch, ctx.device)
        self._loss["batch"] = batch
        self.optimizer.zero_grad(set_to_none=True)
        first, last = ctx.rank == 0, ctx.rank == ctx.world_size - 1
        losses: list[torch.Tensor] = []
        if first:
            self.schedule.step(model_input(batch))
        elif last:
            idx = torch.arange(batch_rows(batch), device=ctx.device)
            self.schedule.step(target=idx, losses=losses)
        else:
            self.schedule.step()
        self.optimizer.step()
        mean = (
            torch.stack([x.detach().float() for x in losses]).mean().reshape(1)
            if last
            else (torch.zeros(1, device=ctx.device))
        )
        dist.broadcast(mean, src=ctx.world_size - 1)
        return float(mean.item())


class Pipeline(Strategy):
    """GPipe-scheduled pipeline over ``nn.Sequential`` children (exact)."""

    name = "pipeline"
    min_gpus = 2
    knob_defaults: ClassVar[dict[str, Any]] = {"microbatches": 2, "split": "params"}

    def batch_ways(self, gpus: int) -> int:
        return 1

    def applies(self, task: Task | None, gpus: int) -> str | None:
        reason = super().applies(task, gpus)
        if reason or task is None:
            return reason
        from ray_saturn.strategies.introspect import meta_model, sequential_reason

        model = meta_model(task)
        reason = sequential_reason("pipeline", task, model)
        if reason:
            return reason
        if len(model) < gpus:
            return f"pipeline: {gpus} stages need {gpus} layers; task {task.name!r}'s model has {len(model)}"
        return None

    def check_knobs(self, knobs: Mapping[str, Any] | None) -> dict[str, Any]:
        k = super().check_knobs(knobs)
        if isinstance(k["microbatches"], bool) or int(k["microbatches"]) < 1:
            raise KnobError(f"pipeline: microbatches is {k['microbatches']!r}; use a whole number >= 1")
        return k

    def knob_space(self, task: Task, gpus: int) -> Sequence[Mapping[str, Any]]:
        from ray_saturn.strategies.introspect import first_batch_rows, meta_model

        rows = task.batch_size or first_batch_rows(task)
        model = meta_model(task)
        splits, seen = [], set()
        for split in ("params", "layers"):  # the two rules often agree; measure each split once
            try:
                bounds = tuple(stage_bounds(model, gpus, split))
            except KnobError:
                continue
            if bounds not in seen:
                seen.add(bounds)
                splits.append(split)
        mbs = [m for m in (1, 2, 4, 8) if rows % m == 0] or [1]
        return [self.check_knobs({"microbatches": m, "split": s}) for m in mbs for s in splits]

    def prepare(self, model: nn.Module, task: Task, knobs: Mapping[str, Any], ctx: WorkerContext) -> Runner:
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        knobs = self.check_knobs(knobs)
        if not isinstance(model, nn.Sequential):
            raise KnobError(f"pipeline needs an nn.Sequential model, got {type(model).__name__}")
        bounds = stage_bounds(model, ctx.world_size, knobs["split"])
        names = list(model._modules)
        lo, hi = bounds[ctx.rank], bounds[ctx.rank + 1]
        stage_module = nn.Sequential(OrderedDict((names[i], model[i]) for i in range(lo, hi))).to(ctx.device)
        del model
        stage = PipelineStage(stage_module, ctx.rank, ctx.world_size, ctx.device)
        holder: dict[str, Any] = {}

        def loss_fn(output: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            rows = slice_batch(holder["batch"], int(idx[0]), int(idx[-1]) + 1)
            return task.loss(output, rows)

        mb = int(knobs["microbatches"])
        # every stage gets the loss function: without it a schedule runs forward only
        schedule = ScheduleGPipe(stage, n_microbatches=mb, loss_fn=loss_fn)
        optimizer = task.optimizer(stage_module.parameters(), task.hparams)
        return _PipelineRunner(stage_module, schedule, optimizer, holder, ctx, mb)
