"""``fsdp``: fully sharded data parallel with torch FSDP2 (``fully_shard``).

Composition order, as in torchtitan: activation checkpointing on each block
first, then ``fully_shard`` on each block, then on the root. Blocks are the
children of an ``nn.Sequential`` model, the entries of a ``layers``
container, or else the model's direct children that hold parameters; blocks
with tied weights stay in the root's group (see :func:`blocks_of`).
Composable checkpointing keeps the parameter names, so checkpoints written
by FSDP load into any other strategy.

Knobs:

* ``activation_checkpointing`` (bool): recompute block activations in backward.
* ``cpu_offload`` (bool): keep sharded parameters in CPU memory
  (FSDP2 ``CPUOffloadPolicy``; needs a CUDA device, so it is infeasible on a
  CPU-only worker and the search says so).
* ``reshard_after_forward`` (bool): free gathered parameters after forward
  (less memory, one more all-gather in backward).

Example:
    >>> from ray_saturn.strategies import get_strategy
    >>> import torch
    >>> get_strategy("fsdp").hardware_reason({"cpu_offload": True}, torch.device("cpu"))
    'fsdp cpu_offload needs a CUDA device (FSDP2 CPUOffloadPolicy fails without an accelerator)'
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from ray_saturn.spec import Task
from ray_saturn.strategies.base import Runner, Strategy, WorkerContext
from ray_saturn.strategies.data_parallel import DataParallelRunner

__all__ = ["FSDP", "blocks_of"]


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The blocks of a model that FSDP shards one by one.

    The children of an ``nn.Sequential`` model, else the entries of a
    ``layers`` container (``nn.ModuleList`` or ``nn.Sequential``), else the
    model's direct children. A block is left to the root's group when it
    holds no parameters, or shares one with the rest of the model (tied
    weights, e.g. an embedding and its output head: FSDP2 needs them in one
    group).

    Example:
        >>> from ray_saturn.workloads.text import TinyGPT
        >>> gpt = TinyGPT(vocab=10, width=8, depth=3, heads=2, context=4)
        >>> len(blocks_of(gpt)) == 3
        True
        >>> tied = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 10))
        >>> tied[1].weight = tied[0].weight
        >>> blocks_of(tied)
        []
    """
    layers = getattr(model, "layers", None)
    if isinstance(model, nn.Sequential):
        named = list(model.named_children())
    elif isinstance(layers, nn.ModuleList | nn.Sequential):
        named = [(f"layers.{n}", m) for n, m in layers.named_children()]
    else:
        named = list(model.named_children())
    every = list(model.named_parameters(remove_duplicate=False))
    out = []
    for prefix, block in named:
        own = {id(p) for p in block.parameters()}
        shared = any(id(p) in own and not name.startswith(prefix + ".") for name, p in every)
        if own and not shared:
            out.append(block)
    return out


class FSDP(Strategy):
    """FSDP2 (exact). Knobs: activation_checkpointing, cpu_offload, reshard_after_forward."""

    name = "fsdp"
    min_gpus = 2
    knob_defaults: ClassVar[dict[str, Any]] = {
        "activation_checkpointing": False,
        "cpu_offload": False,
        "reshard_after_forward": True,
    }

    def knob_space(self, task: Task, gpus: int) -> Sequence[Mapping[str, Any]]:
        names = list(self.knob_defaults)
        return [
            dict(zip(names, values, strict=True))
            for values in itertools.product((False, True), repeat=3)
        ]

    def hardware_reason(self, knobs: Mapping[str, Any], device: torch.device) -> str | None:
        if knobs.get("cpu_offload") and device.type != "cuda":
            return (
                "fsdp cpu_offload needs a CUDA device "
                "(FSDP2 CPUOffloadPolicy fails without an accelerator)"
            )
        return None

    def prepare(
        self, model: nn.Module, task: Task, knobs: Mapping[str, Any], ctx: WorkerContext
    ) -> Runner:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        knobs = self.check_knobs(knobs)
        reason = self.hardware_reason(knobs, ctx.device)
        if reason:
            from ray_saturn.strategies.base import StrategyError

            raise StrategyError(reason)
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        offload = CPUOffloadPolicy() if knobs["cpu_offload"] else OffloadPolicy()
        if not knobs["cpu_offload"]:
            model = model.to(ctx.device)
        reshard = bool(knobs["reshard_after_forward"])
        for block in blocks_of(model):
            if knobs["activation_checkpointing"]:
                from torch.distributed._composable import checkpoint

                checkpoint(block)
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, offload_policy=offload)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, offload_policy=offload)
        optimizer = task.optimizer(model.parameters(), task.hparams)
        return DataParallelRunner(model, model, optimizer, task.loss, ctx)
