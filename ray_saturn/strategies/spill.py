"""``spill``: train a model larger than one GPU by spilling layer shards to an offload device.

The parameters (and their gradients and optimizer state) live on the offload
device (CPU memory). The model's ``nn.Sequential`` children are cut into
``shards`` runs of consecutive layers. Forward copies one shard's parameters
(and buffers) at a time onto the compute device, runs the shard without
keeping its activations (``no_grad``), copies the shard's *input* to the
offload device, and drops the copies. Backward walks the shards in reverse:
it copies the shard's parameters and its saved input back, recomputes the
shard's forward with autograd, back-propagates through it, and moves the
parameter gradients to the offload device. So the compute device holds at
most one shard's parameters and one shard's activations at a time, plus the
activation flowing between shards (its size does not grow with depth):
compute-device memory falls as the shard count grows (``tests`` measure it
per device against the shard count). This is what fairscale's
``OffloadModel`` does; fairscale's version needs CUDA, this one also runs
(and is tested) with both devices being the CPU, where each move is a real
copy into a separate tensor.

Shards run through ``torch.func.functional_call`` on the copies, so the
module's own parameters never change device and stay what the optimizer and
checkpoints see. Buffers a forward updates (BatchNorm statistics) are copied
back after the forward; the recomputation's updates are dropped, so they
change once per step, as in one-process training.

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
from torch.func import functional_call

from ray_saturn.spec import Task
from ray_saturn.strategies.base import KnobError, Runner, Strategy, WorkerContext
from ray_saturn.strategies.data_parallel import DataParallelRunner

__all__ = ["Spill", "SpilledSequential"]


class _Shard:
    """A run of layers whose parameters and buffers are copied to the compute device when used."""

    def __init__(self, layers: nn.Sequential, owner: SpilledSequential) -> None:
        self.layers = layers
        self.owner = owner
        named = list(layers.named_parameters())
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.buffers = list(layers.named_buffers())

    @property
    def compute(self) -> torch.device:
        return self.owner.compute

    def fetch(self, *, trainable: bool = False) -> dict[str, torch.Tensor]:
        """Copies of the shard's parameters and buffers on the compute device (new tensors even
        on the same device); with ``trainable`` the copies of trainable parameters require grad."""
        out: dict[str, torch.Tensor] = {}
        for name, p in zip(self.names, self.params, strict=True):
            t = p.detach().to(self.compute, copy=True)
            out[name] = t.requires_grad_(trainable and p.requires_grad)
        for name, b in self.buffers:
            out[name] = b.detach().to(self.compute, copy=True)
        owner = self.owner
        owner.resident += 1
        owner.peak_resident = max(owner.peak_resident, owner.resident)
        owner.moves += 1
        return out

    def release(self) -> None:
        self.owner.resident -= 1

    def keep_buffers(self, fetched: Mapping[str, torch.Tensor]) -> None:
        """Copy buffers the forward updated (e.g. running statistics) back to the offload device."""
        with torch.no_grad():
            for name, b in self.buffers:
                b.copy_(fetched[name])

    def run(self, fetched: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.layers, dict(fetched), (x,))


class _ShardFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard: _Shard, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.shard = shard
        fetched = shard.fetch()
        try:
            with torch.no_grad():
                y = shard.run(fetched, x.to(shard.compute))
            shard.keep_buffers(fetched)
        finally:
            del fetched
            shard.release()
        # the input waits for backward on the offload device, not on the compute device
        ctx.save_for_backward(x.detach().to(shard.owner.offload, copy=True))
        return y

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        shard: _Shard = ctx.shard
        (saved,) = ctx.saved_tensors
        want_x = ctx.needs_input_grad[1]
        wanted = [i for i, p in enumerate(shard.params) if p.requires_grad and ctx.needs_input_grad[2 + i]]
        fetched = shard.fetch(trainable=True)
        try:
            with torch.enable_grad():
                x = saved.to(shard.compute, copy=True).requires_grad_(want_x)
                del saved
                y = shard.run(fetched, x)
                inputs = ([x] if want_x else []) + [fetched[shard.names[i]] for i in wanted]
                grads = list(torch.autograd.grad(y, inputs, grad_out)) if inputs else []
            del y, x
        finally:
            del fetched
            shard.release()
        gx = grads.pop(0) if want_x else None
        gparams: list[torch.Tensor | None] = [None] * len(shard.params)
        for i, g in zip(wanted, grads, strict=True):
            gparams[i] = g.to(shard.params[i].device)
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
        self.offload = offload or torch.device("cpu")
        if any(t.device != self.offload for t in itertools.chain(model.parameters(), model.buffers())):
            model = model.to(self.offload)
        self.model = model
        self.compute = compute
        self.resident = 0
        self.peak_resident = 0
        self.moves = 0
        from ray_saturn.strategies.pipeline import stage_bounds

        bounds = stage_bounds(model, shards, "params")
        self._shards = [_Shard(model[a:b], self) for a, b in itertools.pairwise(bounds)]

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
