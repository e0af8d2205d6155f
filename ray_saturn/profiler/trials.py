"""One profiling trial as Ray work: a placement group sized to the trial, one actor per GPU.

The actors form a torch.distributed group (gloo on CPU, NCCL on CUDA) and
run :meth:`Strategy.search` together, then measure what a segment of the
chosen knobs costs besides its steps (:mod:`ray_saturn.profiler.segment`);
rank 0's result is the trial's: ``(search result, segment costs)``. The
placement group holds ``gpus`` GPU bundles: packed on one node, or split
evenly over ``nodes`` nodes (one bundle per node, ``STRICT_SPREAD``).

On a one-node cluster the pool keeps its workers warm instead
(:class:`WarmWorkers`): each worker is an actor holding one GPU outright,
created once and lent to trial after trial, so a trial pays no process
start, Ray worker or torch import (seconds per worker on a small machine).
Each trial builds its model, process group and memory counters afresh; a
worker of a trial that failed, died or hung is killed, not lent again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.profiler.segment import SegmentCosts, measure_segment_costs
from ray_saturn.spec import Task
from ray_saturn.strategies.base import Infeasible, SearchResult

__all__ = ["RunningTrial", "TrialSpec", "WarmWorkers", "launch", "launch_warm"]

log = logging.getLogger(__name__)


class _TrialWorker:
    """A Ray actor holding one GPU of a trial."""

    def endpoint(self, strategy: str) -> tuple[str, int]:
        """This worker's address and a free port, after the heavy imports (not timed as a hang)."""
        import ray
        import torch.distributed  # noqa: F401

        from ray_saturn.strategies import get_strategy

        get_strategy(strategy)

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def search(
        self,
        task: Task,
        strategy: str,
        rank: int,
        world: int,
        addr: str,
        port: int,
        measure_kw: dict[str, Any],
        timeout_s: float,
        shared_folder: bool = True,
    ) -> tuple[SearchResult | Infeasible, SegmentCosts | None]:
        """The knob search, then (when feasible) what a segment costs besides its steps."""
        from datetime import timedelta

        import torch.distributed as dist

        from ray_saturn.strategies import WorkerContext, get_strategy
        from ray_saturn.strategies.device import use_rank_device
        from ray_saturn.strategies.measure import _describe

        # one GPU per actor: CUDA_VISIBLE_DEVICES is its own GPU, so its local index is 0
        os.environ.setdefault("LOCAL_RANK", "0")
        rd = use_rank_device()
        if world > 1:
            dist.init_process_group(
                rd.backend,
                init_method=f"tcp://{addr}:{port}",
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=timeout_s),
            )
        try:
            ctx = WorkerContext.current()
            result = get_strategy(strategy).search(task, ctx, **measure_kw)
            costs = None
            if result.feasible:
                try:
                    costs = measure_segment_costs(task, strategy, result.knobs, ctx, shared_folder=shared_folder)
                except Exception as exc:  # the row stays feasible; its start-up is then the trainer's only
                    log.warning("%s %s on %d GPU(s): segment costs not measured: %s", task.name, strategy, world,
                                _describe(exc))
            return result, costs
        except Exception as exc:
            return Infeasible(strategy, world, _describe(exc)), None
        finally:
            if world > 1 and dist.is_initialized():
                dist.destroy_process_group()


@dataclass(frozen=True)
class TrialSpec:
    """What one trial measures."""

    task: Task
    signature: str
    strategy: str
    gpus: int
    nodes: int
    measure_kw: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunningTrial:
    """A launched trial: its placement group, actors and result reference."""

    spec: TrialSpec
    pg: Any
    ready_ref: Any
    created_s: float
    actors: list[Any] = field(default_factory=list)
    result_ref: Any = None
    ready_s: float | None = None
    started_s: float | None = None
    warm: WarmWorkers | None = None

    def start(self, timeout_s: float, startup_timeout_s: float = 300.0) -> None:
        """Create the actors in the (ready) placement group and start the search."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        spec = self.spec
        self.ready_s = time.monotonic()
        # one 1-GPU bundle per worker on one node; one (gpus/nodes)-GPU bundle per node otherwise
        per_bundle = 1 if spec.nodes == 1 else spec.gpus // spec.nodes
        if self.warm is not None:
            self.actors = self.warm.take(spec.gpus)
        else:
            cls = ray.remote(num_cpus=0, num_gpus=1, max_restarts=0)(_TrialWorker)
            self.actors = [
                cls.options(
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self.pg, placement_group_bundle_index=rank // per_bundle
                    ),
                    name=None,
                ).remote()
                for rank in range(spec.gpus)
            ]
        # every worker process is up before the rendezvous (and before the trial's clock starts)
        endpoints = ray.get([a.endpoint.remote(spec.strategy) for a in self.actors], timeout=startup_timeout_s)
        addr, port = endpoints[0]
        refs = [
            a.search.remote(
                spec.task, spec.strategy, rank, spec.gpus, addr, port, spec.measure_kw, timeout_s, spec.nodes == 1
            )
            for rank, a in enumerate(self.actors)
        ]
        self.result_ref = refs[0]
        self.started_s = time.monotonic()

    def release(self, healthy: bool = True) -> None:
        """Kill the actors and remove the placement group; warm workers of a ``healthy`` trial
        (it returned a result) go back to their pool instead."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.warm is not None:
            self.warm.give_back(self.actors, healthy)
            self.actors = []
            return
        for a in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        with contextlib.suppress(Exception):
            remove_placement_group(self.pg)

    def gpu_seconds(self) -> float:
        """GPU-seconds held: from the placement group being ready (bundles reserved) to now."""
        return 0.0 if self.ready_s is None else self.spec.gpus * (time.monotonic() - self.ready_s)


def launch(spec: TrialSpec) -> RunningTrial:
    """Ask Ray for the trial's placement group (the actors start once it is ready)."""
    from ray.util.placement_group import placement_group

    per = spec.gpus // spec.nodes
    if spec.nodes == 1:
        pg = placement_group([{"GPU": 1}] * spec.gpus, strategy="STRICT_PACK")
    else:
        pg = placement_group([{"GPU": per}] * spec.nodes, strategy="STRICT_SPREAD")
    return RunningTrial(spec, pg, pg.ready(), time.monotonic())


class WarmWorkers:
    """Trial workers kept between trials on a one-node cluster (see the module docstring).

    Each holds one GPU while it lives; :meth:`close` kills them all (the pool calls it when it is
    done, before anything else needs the GPUs).

    Example:
        >>> w = WarmWorkers()
        >>> w.idle, w.created
        (0, 0)
    """

    def __init__(self) -> None:
        self._idle: list[Any] = []
        self._lent: set[Any] = set()
        self.created = 0

    @property
    def idle(self) -> int:
        return len(self._idle)

    def take(self, n: int) -> list[Any]:
        """``n`` workers: idle ones first, new ones for the rest."""
        import ray

        out = [self._idle.pop() for _ in range(min(n, len(self._idle)))]
        cls = ray.remote(num_cpus=0, num_gpus=1, max_restarts=0)(_TrialWorker)
        while len(out) < n:
            out.append(cls.remote())
            self.created += 1
        self._lent.update(out)
        return out

    def give_back(self, actors: list[Any], healthy: bool) -> None:
        import ray

        for a in actors:
            self._lent.discard(a)
            if healthy:
                self._idle.append(a)
            else:
                with contextlib.suppress(Exception):
                    ray.kill(a, no_restart=True)

    def close(self) -> None:
        import ray

        for a in [*self._idle, *self._lent]:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        self._idle.clear()
        self._lent.clear()


def launch_warm(spec: TrialSpec, warm: WarmWorkers) -> RunningTrial:
    """A trial on warm workers (one node): no placement group; it starts at the pool's next turn."""
    import ray

    return RunningTrial(spec, None, ray.put(None), time.monotonic(), warm=warm)
