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
- :func:`probe_trainer_startup` starts ``side_by_side`` TorchTrainers of
  ``gpus`` workers each at the same moment, each ``fit()`` in a thread of
  its own as the run's launcher starts segments, whose loops return at
  once, and measures ``fit()`` to the loop having made a segment's imports
  (``start_s``: Ray Train's controller, worker group, process start,
  process group, and the imports of torch and the strategies' worker)
  and the loop's end to ``fit()`` returning (``stop_s``), each the mean over
  the trainers. A run starts as many segments at once as the cluster holds
  (its first plan starts every GPU's task together), and on a small machine
  trainers started side by side take far longer than one alone, so the
  profiler probes with as many side by side as the cluster fits (see
  :meth:`ray_saturn.profiler.Profiler.run`). It depends on the cluster, not
  on the task, so the profiler runs it once per (GPU count, side by side)
  and hardware and keeps it in its store. Given :class:`Calibration` s (one
  measured configuration of that GPU count per task signature), every
  trainer also trains each of them in turn, for a few seconds each, and the
  probe reports ``step_factors``: per signature, the trainers' step time
  over the trial's (and ``step_factor``, their median, for signatures not
  calibrated). A segment steps beside Ray Train's controller and helper
  actors and the other segments, a trial in a bare warm worker; the
  profile's step times are the trials' times their signature's factor. The
  trainers side by side train the same configuration at the same moment, so
  the factor holds what running next to a like segment costs *that* task
  (on a CPU machine, a wide convolution slows more beside another than a
  small MLP; one factor per GPU count missed that by up to 1.3x).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.defaults import quick_train_polls

__all__ = [
    "Calibration", "SegmentCosts", "TrainerStartup", "measure_segment_costs", "median_factor", "probe_trainer_startup",
]

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
class Calibration:
    """A configuration the start-up probe trains inside its trainers: ``task`` on ``strategy`` with
    ``knobs``, ``steps`` timed steps after one untimed; ``trial_step_s``: its step time in the
    profiling trial, what the trainers' step time is compared with; ``signature``: the task
    signature its factor is kept for."""

    task: Any
    strategy: str
    knobs: Mapping[str, Any]
    steps: int
    trial_step_s: float
    signature: str = ""


@dataclass(frozen=True)
class TrainerStartup:
    """TorchTrainers of ``gpus`` workers on ``nodes`` nodes, ``side_by_side`` started at once:
    ``fit()`` to the loop and loop to return (s), the mean over them; ``slowest_s`` the slowest start.

    ``step_factors``: per calibrated signature, its step time inside the trainers (the mean over
    them) over its step time in the profiling trial; ``step_factor``: their median, 1.0 without
    calibrations.
    """

    gpus: int
    nodes: int
    start_s: float
    stop_s: float
    side_by_side: int = 1
    slowest_s: float = 0.0
    step_factor: float = 1.0
    step_factors: Mapping[str, float] = field(default_factory=dict)
    #: The torch.distributed backend the trainers ran (the next probe need not ask the cluster again).
    backend: str = ""


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
    """The loop of the start-up probe: stamp the time on rank 0; train each calibration's steps in
    turn (every rank), and stamp their step times and the loop's end; return."""
    import ray
    import ray.train
    import torch  # noqa: F401  (a real segment's loop imports it first)

    from ray_saturn.strategies import train_worker  # noqa: F401  (as a segment's loop does, before its set-up)

    rank0 = ray.train.get_context().get_world_rank() == 0
    stamp = config["stamp"]
    if rank0:
        ray.get(stamp.mark.remote(time.time()))
    cals: list[Calibration] = config.get("calibrate") or []
    if cals:
        from ray_saturn.strategies import WorkerContext, get_strategy
        from ray_saturn.strategies.measure import measure_knobs

        ctx = WorkerContext.current()
        times = []
        for cal in cals:
            strat = get_strategy(cal.strategy)
            step_s, _ = measure_knobs(strat, cal.task, strat.check_knobs(dict(cal.knobs)), ctx, warmup=1,
                                      steps=cal.steps)
            times.append(step_s)
        if rank0:
            ray.get(stamp.step.remote(times))
    if rank0:
        ray.get(stamp.done.remote(time.time()))


def _stamp_cls():
    import ray

    @ray.remote(num_cpus=0)
    class _Stamp:
        def __init__(self) -> None:
            self.t: float | None = None
            self.end: float | None = None
            self.step_s: list[float] | None = None

        def mark(self, t: float) -> None:
            self.t = t

        def step(self, step_s: list[float]) -> None:
            self.step_s = step_s

        def done(self, t: float) -> None:
            self.end = t

        def get(self) -> tuple[float | None, float | None, list[float] | None]:
            return self.t, self.end, self.step_s

    return _Stamp


def probe_trainer_startup(
    gpus: int,
    nodes: int = 1,
    *,
    backend: str | None = None,
    side_by_side: int = 1,
    calibrate: Calibration | Sequence[Calibration] | None = None,
) -> TrainerStartup:
    """Start ``side_by_side`` TorchTrainers of ``gpus`` workers (``nodes`` nodes) at once, each in a
    thread as the launcher does, whose loops return at once (after training each of ``calibrate``'s
    configurations, if given); time them (the mean over them)."""
    import threading

    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if side_by_side < 1:
        raise ValueError(f"side_by_side is {side_by_side}; give at least 1")
    cals = [calibrate] if isinstance(calibrate, Calibration) else list(calibrate or [])
    if backend is None:
        from ray_saturn.strategies.device import backend_task

        backend = str(ray.get(backend_task().remote()))
    quick_train_polls()  # as the launcher's segments do: their stop time is what the probe measures
    stamps = [_stamp_cls().remote() for _ in range(side_by_side)]
    folder = tempfile.mkdtemp(prefix="saturn-probe-")
    times: list[tuple[float, float] | None] = [None] * side_by_side
    errors: list[BaseException] = []

    def fit(i: int, trainer: Any, go: threading.Barrier) -> None:
        try:
            go.wait(timeout=60)
            t0 = time.time()
            trainer.fit()
            times[i] = (t0, time.time())
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)

    try:
        trainers = [
            TorchTrainer(
                _probe_loop,
                train_loop_config={"stamp": stamps[i], "calibrate": cals},
                torch_config=TorchConfig(backend=backend),
                scaling_config=ScalingConfig(
                    num_workers=gpus,
                    use_gpu=True,
                    placement_strategy="STRICT_PACK" if nodes == 1 else "STRICT_SPREAD",
                ),
                run_config=RunConfig(
                    name=f"saturn-startup-probe-{gpus}x{nodes}-{os.getpid()}-{i}",
                    storage_path=folder,
                    failure_config=FailureConfig(max_failures=0),
                ),
            )
            for i in range(side_by_side)
        ]
        go = threading.Barrier(side_by_side)
        threads = [threading.Thread(target=fit, args=(i, tr, go), daemon=True) for i, tr in enumerate(trainers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        firsts = ray.get([s.get.remote() for s in stamps])
    finally:
        for s in stamps:
            ray.kill(s)
        shutil.rmtree(folder, ignore_errors=True)
    if any(f[0] is None or f[1] is None for f in firsts):
        raise RuntimeError(f"a start-up probe on {gpus} GPU(s) never reached its loop")
    starts = [max(0.0, f[0] - t[0]) for f, t in zip(firsts, times, strict=True)]
    stops = [max(0.0, t[1] - f[1]) for f, t in zip(firsts, times, strict=True)]
    factors: dict[str, float] = {}
    if cals:
        timed = [f[2] for f in firsts if f[2] is not None and len(f[2]) == len(cals)]
        if len(timed) != len(firsts) or not all(c.trial_step_s > 0 for c in cals):
            raise RuntimeError(f"the start-up probe on {gpus} GPU(s) did not time its calibration steps")
        for i, cal in enumerate(cals):
            factors[cal.signature] = (sum(t[i] for t in timed) / len(timed)) / cal.trial_step_s
    out = TrainerStartup(
        gpus, nodes, sum(starts) / len(starts), sum(stops) / len(stops), side_by_side, max(starts),
        median_factor(factors.values()), factors, backend,
    )
    log.info(
        "trainer start-up on %d GPU(s), %d side by side: %.1f s to the loop (slowest %.1f s), %.1f s to stop; "
        "steps %s x the trial's",
        gpus, side_by_side, out.start_s, out.slowest_s, out.stop_s,
        ", ".join(f"{v:.2f}" for v in factors.values()) or "1.00",
    )
    return out


def median_factor(factors: Any) -> float:
    """The median of step factors (the upper middle of an even count), 1.0 of none.

    Example:
        >>> median_factor([1.2, 1.0, 1.5]), median_factor([])
        (1.2, 1.0)
    """
    values = sorted(float(v) for v in factors)
    return values[len(values) // 2] if values else 1.0
