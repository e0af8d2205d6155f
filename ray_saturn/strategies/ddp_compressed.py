"""``ddp-compressed``: DDP whose gradients travel compressed in a communication hook.

Two methods, chosen by the ``method`` knob:

* ``quantize``: bucket-wise 8- or 4-bit quantisation with per-chunk scaling
  and stochastic rounding (:mod:`ray_saturn.strategies.compression`, in the
  spirit of CGX). Knobs ``bits`` (8 or 4) and ``bucket_size``.
* ``powersgd``: torch's PowerSGD low-rank compression with error feedback.
  Knob ``rank``; ``start_iter`` steps of plain all-reduce come first.

Not exact: the loss follows the exact run within a margin (see the tests).
The solver can pick it where communication dominates the step time.

Example:
    >>> from ray_saturn.strategies import get_strategy
    >>> get_strategy("ddp-compressed").check_knobs({"method": "quantize", "bits": 4})["bits"]
    4
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from ray_saturn.spec import Task
from ray_saturn.strategies.base import KnobError, Runner, Strategy, WorkerContext
from ray_saturn.strategies.compression import QuantHookState, quantized_allreduce_hook
from ray_saturn.strategies.data_parallel import DataParallelRunner
from ray_saturn.strategies.ddp import wrap_ddp


class DDPCompressed(Strategy):
    """DDP with 8/4-bit bucket-wise quantisation or PowerSGD in a comm hook."""

    name = "ddp-compressed"
    exact = False
    min_gpus = 2
    knob_defaults: ClassVar[dict[str, Any]] = {
        "method": "quantize",
        "bits": 8,
        "bucket_size": 512,
        "rank": 2,
        "start_iter": 2,
    }

    def check_knobs(self, knobs: Mapping[str, Any] | None) -> dict[str, Any]:
        k = super().check_knobs(knobs)
        if k["method"] not in ("quantize", "powersgd"):
            raise KnobError(f"{self.name}: method is {k['method']!r}; use 'quantize' or 'powersgd'")
        if k["method"] == "quantize" and k["bits"] not in (8, 4):
            raise KnobError(f"{self.name}: bits is {k['bits']!r}; use 8 or 4")
        if int(k["rank"]) < 1 or int(k["bucket_size"]) < 1 or int(k["start_iter"]) < 2:
            raise KnobError(f"{self.name}: rank and bucket_size must be >= 1 and start_iter >= 2")
        return k

    def knob_space(self, task: Task, gpus: int) -> Sequence[Mapping[str, Any]]:
        return [
            self.check_knobs({"method": "quantize", "bits": 8}),
            self.check_knobs({"method": "quantize", "bits": 4}),
            self.check_knobs({"method": "powersgd", "rank": 1}),
            self.check_knobs({"method": "powersgd", "rank": 4}),
        ]

    def prepare(
        self, model: torch.nn.Module, task: Task, knobs: Mapping[str, Any], ctx: WorkerContext
    ) -> Runner:
        knobs = self.check_knobs(knobs)
        ddp = wrap_ddp(model, ctx)
        if knobs["method"] == "quantize":
            gen = torch.Generator(device=ctx.device)
            gen.manual_seed(int(task.hparams.get("seed", 0)) * 7919 + ctx.rank)
            ddp.register_comm_hook(
                QuantHookState(int(knobs["bits"]), int(knobs["bucket_size"]), gen),
                quantized_allreduce_hook,
            )
        else:
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

            state = powerSGD_hook.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=int(knobs["rank"]),
                start_powerSGD_iter=int(knobs["start_iter"]),
                random_seed=int(task.hparams.get("seed", 0)),
            )
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        optimizer = task.optimizer(ddp.module.parameters(), task.hparams)
        return DataParallelRunner(ddp, ddp.module, optimizer, task.loss, ctx)
