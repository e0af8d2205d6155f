"""What a segment costs outside its steps: start-up, checkpoint save and load.

A run executes each task as segments (:mod:`ray_saturn.runtime.train_launcher`):
a TorchTrainer starts its workers, each builds the model, wraps it in its
strategy, loads the latest checkpoint and steps; a move checkpoints, stops
and starts another segment. The profiler measures these costs so the plan
can include them (profile columns ``startup_s``, ``checkpoint_save_s``,
``checkpoint_load_s``; see :mod:`ray_saturn.profile_table`):

- :func:`measure_segment_costs` runs in the workers of a profiling trial,
  after its knob search, with the chosen knobs: model build + strategy
  set-up + the first (cold) step (``setup_s``), one checkpoint save and one
  load into a freshly built model (DCP, as the run does), and the data
  factory's time per batch (``data_s``: the run regenerates an epoch's
  batches at every epoch boundary; the profile adds it to the step time).
  Collective: every worker of the trial calls it; each figure is the
  slowest worker's.
- :func:`probe_trainer_startup` starts a TorchTrainer of ``gpus`` workers
  whose loop returns at once, as the launcher starts a segment, and
  measures ``fit()`` to the loop's first line (``start_s``: Ray Train's
  controller, worker group, process start, imports, process group) and the
  loop's end to ``fit()`` returning (``stop_s``). It depends on the
  cluster, not on the task, so the profiler runs it once per GPU count and
  hardware and keeps it in its store.

A configuration's ``startup_s`` = trainer start (per GPU count) + its setup.

Example:
    >>> SegmentCosts(1.5, 0.2, 0.3).setup_s
    1.5
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SegmentCosts", "TrainerStartup", "measure_segment_costs", "probe_trainer_startup"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SegmentCosts:
    """Measured in a trial: set-up to the end of the first step, one checkpoint save, one load (s),
    and ``data_s``, the task's data factory's time per batch (a run calls it at every epoch
    boundary, on every worker; the strategy's step time does not include it).

    ``save_s``/``load_s`` are ``None`` where a trial cannot measure them (a
    multi-node trial has no folder its workers share).
    """

    setup_s: float
    save_s: float | None
    load_s: float | None
    data_s: float = 0.0


@dataclass(frozen=True)
class TrainerStartup:
    """A TorchTrainer of ``gpus`` workers on ``nodes`` nodes: ``fit()`` to its loop, loop to return (s)."""

    gpus: int
    nodes: int
    start_s: float
    stop_s: float


def _max_over_workers(values: list[float], ctx: Any) -> list[float]:
    import torch
    import torch.distributed as dist

    if not ctx.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.to(ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(x) for x in t.cpu().tolist()]


def _shared_dir(ctx: Any, share: bool) -> str | None:
    """A temporary folder every worker of the trial sees (rank 0 makes it); ``None`` if not shared."""
    import torch.distributed as dist

    if not share:
        return None
    path = [tempfile.mkdtemp(prefix="saturn-segcost-") if ctx.rank == 0 else None]
    if ctx.distributed:
        dist.broadcast_object_list(path, src=0)
    return path[0]


def measure_segment_costs(
    task: Any, strategy: str, knobs: Mapping[str, Any], ctx: Any, *, shared_folder: bool = True
) -> SegmentCosts:
    """Set-up, checkpoint save and checkpoint load of ``task`` on ``strategy`` (see the module docstring).

    ``shared_folder``: the trial's workers share a local disk (one node), so a
    checkpoint can be written and read back.
    """
    from ray_saturn.strategies.batching import DataStream
    from ray_saturn.strategies.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from ray_saturn.strategies.device import synchronize
    from ray_saturn.strategies.introspect import build_model
    from ray_saturn.strategies.registry import get_strategy

    strat = get_strategy(strategy)
    knobs = strat.check_knobs(dict(knobs))
    t_data = time.perf_counter()
    batches = sum(1 for _ in task.data(task.hparams))
    data_s = (time.perf_counter() - t_data) / max(1, batches)
    folder = _shared_dir(ctx, shared_folder)
    runner = again = None
    save_s = load_s = -1.0
    try:
        synchronize(ctx.device)
        t0 = time.perf_counter()
        runner = strat.prepare(build_model(task), task, knobs, ctx)
        stream = DataStream(task.data, task.hparams)
        loss = runner.step(next(stream))
        synchronize(ctx.device)
        setup_s = time.perf_counter() - t0
        if folder is not None:
            t1 = time.perf_counter()
            save_checkpoint(
                folder, runner.module, runner.optimizer, step=1, data_position=stream.position,
                strategy=strat.name, task=task.name, loss=loss,
            )
            save_s = time.perf_counter() - t1
            runner.close()
            runner = None
            again = strat.prepare(build_model(task), task, knobs, ctx)
            latest = latest_checkpoint(folder)
            t2 = time.perf_counter()
            load_checkpoint(latest, again.module, again.optimizer, folder)
            synchronize(ctx.device)
            load_s = time.perf_counter() - t2
    finally:
        for r in (runner, again):
            if r is not None:
                r.close()
        if folder is not None and ctx.rank == 0:
            with contextlib.suppress(OSError):
                shutil.rmtree(folder)
    setup_s, save_s, load_s, data_s = _max_over_workers([setup_s, save_s, load_s, data_s], ctx)
    return SegmentCosts(setup_s, None if save_s < 0 else save_s, None if load_s < 0 else load_s, data_s)


def _probe_loop(config: dict[str, Any]) -> None:
    """The loop of the start-up probe: stamp the time on rank 0 and return."""
    import ray
    import ray.train
    import torch  # noqa: F401  (a real segment's loop imports it first)

    if ray.train.get_context().get_world_rank() == 0:
        ray.get(config["stamp"].mark.remote(time.time()))


def _stamp_cls():
    import ray

    @ray.remote(num_cpus=0)
    class _Stamp:
        def __init__(self) -> None:
            self.t: float | None = None

        def mark(self, t: float) -> None:
            self.t = t

        def get(self) -> float | None:
            return self.t

    return _Stamp


def _cluster_backend() -> str:
    """The torch.distributed backend of the cluster's GPU workers (asked on one of them)."""
    import ray

    @ray.remote(num_gpus=1, num_cpus=0)
    def _backend() -> str:
        from ray_saturn.strategies.device import distributed_backend

        return distributed_backend()

    return str(ray.get(_backend.remote()))


def probe_trainer_startup(gpus: int, nodes: int = 1, *, backend: str | None = None) -> TrainerStartup:
    """Start a TorchTrainer of ``gpus`` workers (``nodes`` nodes) whose loop returns at once; time it."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if backend is None:
        backend = _cluster_backend()
    stamp = _stamp_cls().remote()
    folder = tempfile.mkdtemp(prefix="saturn-probe-")
    try:
        trainer = TorchTrainer(
            _probe_loop,
            train_loop_config={"stamp": stamp},
            torch_config=TorchConfig(backend=backend),
            scaling_config=ScalingConfig(
                num_workers=gpus,
                use_gpu=True,
                placement_strategy="STRICT_PACK" if nodes == 1 else "STRICT_SPREAD",
            ),
            run_config=RunConfig(
                name=f"saturn-startup-probe-{gpus}x{nodes}-{os.getpid()}",
                storage_path=folder,
                failure_config=FailureConfig(max_failures=0),
            ),
        )
        t0 = time.time()
        trainer.fit()
        t1 = time.time()
        first = ray.get(stamp.get.remote())
    finally:
        ray.kill(stamp)
        shutil.rmtree(folder, ignore_errors=True)
    if first is None:
        raise RuntimeError(f"the start-up probe on {gpus} GPU(s) never reached its loop")
    out = TrainerStartup(gpus, nodes, max(0.0, first - t0), max(0.0, t1 - first))
    log.info("trainer start-up on %d GPU(s): %.1f s to the loop, %.1f s to stop", gpus, out.start_s, out.stop_s)
    return out
