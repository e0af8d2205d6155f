"""``zero``: ZeRO stage 2 with fairscale: optimizer state and gradients sharded, parameters replicated.

Every worker keeps the whole model, as in DDP, but fairscale's ``OSS``
gives each parameter tensor to one worker (greedily, balancing their sizes),
which alone holds its optimizer state and steps it; ``ShardedDataParallel``
*reduces* each gradient to its owner (not all-reduce), so the other workers
drop it after backward. After the step every owner broadcasts its updated
parameters. So it runs at about DDP's speed with 1/g of DDP's optimizer
state and (unbucketed) gradients per worker: for models whose Adam state does
not fit beside a full replica. The maths is one-process training's (gradients
are averaged over equal slices of the global batch), so it is exact.

Knobs:

* ``reduce_buffer_size`` (elements): ShardedDataParallel packs the gradients
  of small parameters into one buffer per owner of up to this many elements
  and reduces it with one collective (fewer, larger messages) instead of one
  reduce per parameter; bucketed gradients are not freed after backward, so 0
  shards gradients fully. The search tries 0, 2**20 and 2**23 (fairscale's
  default), each capped at the model's size and measured once.
* ``broadcast_buffers`` (bool): broadcast module buffers (e.g. BatchNorm
  statistics) from rank 0 before every forward, as DDP does.

fairscale 0.4.13's ``OSS(broadcast_buffer_size=...)`` is deprecated and
ignored (it broadcasts one flat buffer per owner), so it is no knob here;
``broadcast_fp16`` and ``reduce_fp16`` change the maths and are not offered.

Checkpoints: the runner's ``optimizer`` is this worker's shard of the
optimizer (fairscale's ``OSS.optim``), whose state is keyed by the model's
own parameter names in the DCP checkpoint (see :mod:`ray_saturn.strategies.checkpoint`):
each owner writes the state of its parameters, so together the workers
write every parameter's state once, and any strategy on any worker count
reads it; ``zero`` reads anyone's checkpoint the same way (each worker loads
the state of the parameters it owns).

Example:
    >>> from ray_saturn.strategies import get_strategy
    >>> get_strategy("zero").check_knobs({"reduce_buffer_size": 0})
    {'reduce_buffer_size': 0, 'broadcast_buffers': True}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from ray_saturn.spec import Task
from ray_saturn.strategies.base import KnobError, Runner, Strategy, StrategyError, WorkerContext
from ray_saturn.strategies.data_parallel import DataParallelRunner

__all__ = ["Zero", "sharded_optimizer"]

#: ShardedDataParallel's reduce buffer sizes the search tries (elements).
REDUCE_BUFFER_SIZES = (0, 2**20, 2**23)


def sharded_optimizer(task: Task, model: nn.Module) -> Any:
    """fairscale ``OSS`` around the task's own optimizer: same class, groups and settings.

    The task's optimizer factory is called once on the whole model (nothing is
    allocated: optimizer state is lazy) to learn its class, parameter groups
    and defaults; ``OSS`` then builds that class on this worker's shard.
    """
    from fairscale.optim import OSS

    probe = task.optimizer(model.parameters(), task.hparams)
    if not isinstance(probe, torch.optim.Optimizer):
        raise StrategyError(
            f"task {task.name!r}: zero needs a torch.optim.Optimizer from the optimizer factory, "
            f"got {type(probe).__name__}"
        )
    cls = type(probe)
    groups = [dict(g) for g in probe.param_groups]
    defaults = dict(probe.defaults)
    del probe
    try:
        return OSS(groups, optim=cls, **defaults)
    except TypeError as exc:
        raise StrategyError(
            f"task {task.name!r}: zero rebuilds the optimizer on each shard as "
            f"{cls.__name__}(params, **defaults), which failed ({exc}); use ddp or fsdp for this optimizer"
        ) from None


class _ZeroRunner(DataParallelRunner):
    """DataParallelRunner whose wrapper owns the gradients and whose optimizer is sharded.

    ``optimizer`` (what checkpoints save and load) is this worker's shard;
    ``sharded`` (the OSS wrapper) steps it and broadcasts the new parameters.
    """

    def __init__(self, sdp: nn.Module, module: nn.Module, sharded: Any, loss_fn, ctx: WorkerContext) -> None:
        super().__init__(sdp, module, sharded.optim, loss_fn, ctx)
        self.sharded = sharded

    def zero_grad(self) -> None:
        # ShardedDataParallel's zero_grad keeps the bucketed gradients as views of their buffers
        self.wrapped.zero_grad(set_to_none=True)

    def optimizer_step(self) -> None:
        self.sharded.step()


class Zero(Strategy):
    """ZeRO-2 with fairscale OSS + ShardedDataParallel (exact). Knobs: reduce_buffer_size, broadcast_buffers."""

    name = "zero"
    min_gpus = 2
    knob_defaults: ClassVar[dict[str, Any]] = {"reduce_buffer_size": 2**23, "broadcast_buffers": True}

    def check_knobs(self, knobs: Mapping[str, Any] | None) -> dict[str, Any]:
        k = super().check_knobs(knobs)
        size = k["reduce_buffer_size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise KnobError(f"zero: reduce_buffer_size is {size!r}; use a whole number of elements >= 0")
        if not isinstance(k["broadcast_buffers"], bool):
            raise KnobError(f"zero: broadcast_buffers is {k['broadcast_buffers']!r}; use true or false")
        return k

    def knob_space(self, task: Task, gpus: int) -> Sequence[Mapping[str, Any]]:
        from ray_saturn.strategies.introspect import meta_model

        size = sum(p.numel() for p in meta_model(task).parameters())
        space, seen = [], set()
        for b in REDUCE_BUFFER_SIZES:  # sizes above the model's are the same setting
            effective = min(b, size)
            if effective not in seen:
                seen.add(effective)
                space.append(self.check_knobs({"reduce_buffer_size": b}))
        return space

    def prepare(self, model: nn.Module, task: Task, knobs: Mapping[str, Any], ctx: WorkerContext) -> Runner:
        from fairscale.nn.data_parallel import ShardedDataParallel

        knobs = self.check_knobs(knobs)
        model = model.to(ctx.device)
        oss = sharded_optimizer(task, model)
        sdp = ShardedDataParallel(
            model,
            oss,
            broadcast_buffers=knobs["broadcast_buffers"],
            reduce_buffer_size=int(knobs["reduce_buffer_size"]),
            warn_on_trainable_params_changed=False,
        )
        return _ZeroRunner(sdp, model, oss, task.loss, ctx)
