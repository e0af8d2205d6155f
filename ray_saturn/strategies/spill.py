"""``spill``: train a model larger than one GPU by spilling layer shards to an offload device.

The parameters (and their gradients and optimizer state) live on the offload
device (CPU memory). The model's ``nn.Sequential`` children are cut into
``shards`` runs of consecutive layers. Forward moves one shard at a time onto
the compute device, runs it without keeping its activations, and moves it
back; backward walks the shards in reverse, moves each one in again,
recomputes its forward with autograd and back-propagates through it, and
moves the gradients out. So at most one shard's parameters and one shard's
activations are on the compute device at a time. This is what fairscale's
``OffloadModel`` does; fairscale's version needs CUDA, this one also runs
(and is tested) with both devices being the CPU, where each move is a real
copy into a separate tensor.

The maths equals one-process training (recomputation is deterministic for
deterministic layers). Knob: ``shards``.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    >>> spilled = SpilledSequential(model, shards=2, compute=torch.device("cpu"))
    >>> spilled(torch.ones(3, 4)).shape
    torch.Size([3, 1])
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from ray_saturn.spec import Task
from ray_saturn.strategies.base import KnobError, Runner, Strategy, WorkerContext
from ray_saturn.strategies.data_parallel import DataParallelRunner

__all__ = ["Spill", "SpilledSequential"]


class _Shard:
    """A run of layers whose parameters move between the offload and compute devices."""

    def __init__(
        self, layers: nn.Sequential, compute: torch.device, owner: SpilledSequential
    ) -> None:
        self.layers = layers
        self.compute = compute
        self.owner = owner
        self.params = [p for p in layers.parameters()]
        self._home: list[torch.Tensor] | None = None

    def fetch(self) -> None:
        """Copy the parameters onto the compute device (a new tensor even on the same device)."""
        self._home = [p.data for p in self.params]
        for p in self.params:
            p.data = p.data.to(self.compute, copy=True)
        self.owner.resident += 1
        self.owner.peak_resident = max(self.owner.peak_resident, self.owner.resident)
        self.owner.moves += 1

    def evict(self) -> None:
        """Point the parameters back at their offload-device storage."""
        assert self._home is not None
        for p, home in zip(self.params, self._home, strict=True):
            p.data = home
        self._home = None
        self.owner.resident -= 1


class _ShardFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard: _Shard, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.shard = shard
        ctx.save_for_backward(x)
        shard.fetch()
        try:
            with torch.no_grad():
                y = shard.layers(x.to(shard.compute))
        finally:
            shard.evict()
        return y

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        shard: _Shard = ctx.shard
        (x,) = ctx.saved_tensors
        shard.fetch()
        try:
            with torch.enable_grad():
                xin = x.detach().requires_grad_(x.requires_grad)
                y = shard.layers(xin)
                wanted = [p for p in shard.params if p.requires_grad]
                inputs = ([xin] if x.requires_grad else []) + wanted
                grads = torch.autograd.grad(y, inputs, grad_out) if inputs else ()
        finally:
            shard.evict()
        grads = list(grads)
        gx = grads.pop(0) if x.requires_grad else None
        by_param = dict(zip([id(p) for p in wanted], grads, strict=True))
        homes = [p.device for p in shard.params]
        gparams = [
            by_param[id(p)].to(dev) if id(p) in by_param else None
            for p, dev in zip(shard.params, homes, strict=True)
        ]
        return (None, gx, *gparams)


class SpilledSequential(nn.Module):
    """An ``nn.Sequential`` run shard by shard, parameters spilled (see the module docstring).

    The state dict is the wrapped model's (same parameter names).
    """

    def __init__(
        self,
        model: nn.Sequential,
        shards: int,
        compute: torch.device,
        offload: torch.device | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Sequential):
            raise KnobError(f"spill needs an nn.Sequential model, got {type(model).__name__}")
        if not 1 <= shards <= len(model):
            raise KnobError(
                f"spill: shards is {shards}; use 1..{len(model)} "
                f"(the model has {len(model)} layers)"
            )
        self.model = model.to(offload or torch.device("cpu"))
        self.compute = compute
        self.resident = 0
        self.peak_resident = 0
        self.moves = 0
        from ray_saturn.strategies.pipeline import stage_bounds

        bounds = stage_bounds(model, shards, "params")
        self._shards = [_Shard(model[a:b], compute, self) for a, b in itertools.pairwise(bounds)]

    def state_dict(self, *args, **kwargs):  # the wrapped model's names
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self.model.load_state_dict(*args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for shard in self._shards:
            x = _ShardFn.apply(shard, x, *shard.params)
        return x


def _trainable_layers(model: nn.Module) -> int:
    return sum(1 for child in model.children() if any(True for _ in child.parameters()))


class Spill(Strategy):
    """Layer spilling on one GPU (exact). Knob: ``shards``."""

    name = "spill"
    max_gpus = 1
    knob_defaults: ClassVar[dict[str, Any]] = {"shards": 2}

    def applies(self, task: Task | None, gpus: int) -> str | None:
        reason = super().applies(task, gpus)
        if reason or task is None:
            return reason
        from ray_saturn.strategies.introspect import sequential_reason

        return sequential_reason("spill", task)

    def check_knobs(self, knobs: Mapping[str, Any] | None) -> dict[str, Any]:
        k = super().check_knobs(knobs)
        if isinstance(k["shards"], bool) or int(k["shards"]) < 1:
            raise KnobError(f"spill: shards is {k['shards']!r}; use a whole number >= 1")
        return k

    def knob_space(self, task: Task, gpus: int) -> Sequence[Mapping[str, Any]]:
        from ray_saturn.strategies.introspect import meta_model

        n = _trainable_layers(meta_model(task))
        return [{"shards": s} for s in sorted({2, 4, 8} & set(range(1, n + 1))) or [1]]

    def prepare(
        self, model: nn.Module, task: Task, knobs: Mapping[str, Any], ctx: WorkerContext
    ) -> Runner:
        knobs = self.check_knobs(knobs)
        # at most one shard per layer with parameters (more would leave shards with nothing to move)
        shards = int(knobs["shards"])
        if isinstance(model, nn.Sequential):
            shards = max(1, min(shards, _trainable_layers(model)))
        spilled = SpilledSequential(model, shards, ctx.device, torch.device("cpu"))
        optimizer = task.optimizer(spilled.model.parameters(), task.hparams)
        return DataParallelRunner(
            spilled, spilled.model, optimizer, task.loss, WorkerContext(0, 1, ctx.device)
        )
