"""The trial side: a Tune function trainable that trains a Task on the GPUs ray_saturn gave it.

The scheduler writes its decision into the trial's config under ``"_saturn"``
(``{"strategy": "single"|"ddp", "gpus": g}``) and sizes the trial's
placement group to ``g`` GPUs in one bundle (STRICT_PACK). The trainable

- builds the task with the user's ``make_task(config)``;
- restores model, optimizer, step and data position from
  ``tune.get_checkpoint()`` (a sharded DCP checkpoint that any strategy on any
  GPU count can load), so a resized trial neither repeats nor skips a sample;
- trains with the strategy's ``ray_saturn.strategies.train_worker`` on ``g``
  local processes (torch.distributed, gloo) when ``g > 1``, in the trial
  process when ``g == 1``. There is no Ray Train run inside the trial, hence
  no nested placement group that could wait forever for GPUs its parent
  already holds;
- reports every ``report_every`` steps ``loss``, ``saturn_step``,
  ``saturn_step_time_s`` and ``saturn_gpus`` with a checkpoint, so ASHA's
  ``training_iteration`` advances once per report.

Every registered strategy that runs in one bundle of ``g`` GPUs can run a
trial (``single``, ``ddp``, ``ddp-compressed``, ``fsdp``, ``pipeline``,
``spill``, where the hardware allows them).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from typing import Any

from ray_saturn.errors import SaturnError
from ray_saturn.spec import Task

__all__ = ["TrialTrainingError", "saturn_trainable", "tune_strategies"]

logger = logging.getLogger(__name__)

#: Strategies a Tune trial can execute: every registered one (single-node rows only).
def tune_strategies() -> tuple[str, ...]:
    from ray_saturn.strategies import strategy_names

    return tuple(strategy_names())


class TrialTrainingError(SaturnError, RuntimeError):
    """A Tune trial could not train its task (bad decision, bad task)."""


def _worker(rank: int, ways: int, port: int, task_bytes: bytes, strategy: str, knobs: dict, target: int,
            report_every: int, ckpt_dir: str, queue: Any, acks: Any) -> None:
    """One training process (rank ``rank`` of ``ways``) running the strategy's ``train_worker``.

    It trains in segments of ``report_every`` steps; after each, every rank has
    written its part of the (sharded) checkpoint, rank 0 hands
    ``(step, loss, step time, checkpoint folder)`` to the trial process and
    waits until Tune has copied it, so the next segment cannot prune it first.
    """
    import torch
    import torch.distributed as dist
    from ray import cloudpickle

    from ray_saturn.strategies import train_worker
    from ray_saturn.strategies.checkpoint import latest_checkpoint, latest_step

    task: Task = cloudpickle.loads(task_bytes)
    torch.set_num_threads(1)
    if ways > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ways)
    try:
        step = latest_step(ckpt_dir) or 0
        while step < target:
            seg_target = min(target, (step // report_every + 1) * report_every)
            out = train_worker(task, strategy, knobs, target_step=seg_target, checkpoint_dir=ckpt_dir,
                               checkpoint_every=report_every, report=lambda r: None)
            step = out.final_step
            if ways > 1:
                dist.barrier()
            if rank == 0:
                queue.put(("report", step, out.last_loss, out.mean_step_time_s, str(latest_checkpoint(ckpt_dir))))
                acks.get()
            if ways > 1:
                dist.barrier()
    except BaseException as exc:
        if rank == 0:
            queue.put(("error", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        if ways > 1 and dist.is_initialized():
            dist.destroy_process_group()
        if rank == 0:
            queue.put(("done",))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_trial(make_task: Callable[[dict], Task], config: dict, report_every: int) -> None:
    import shutil
    import threading

    import torch.multiprocessing as mp
    from ray import cloudpickle, tune
    from ray.tune import Checkpoint

    from ray_saturn.strategies import get_strategy

    decision = dict(config.get("_saturn") or {})
    strategy = decision.get("strategy", "single")
    gpus = int(decision.get("gpus", 1))
    knobs = dict(decision.get("knobs") or {})
    user_config = {k: v for k, v in config.items() if k != "_saturn"}
    task = make_task(user_config)
    if not isinstance(task, Task):
        raise TrialTrainingError(f"make_task must return a ray_saturn.Task, got {type(task).__name__}")
    reason = get_strategy(strategy).applies(task, gpus)
    if reason:
        raise TrialTrainingError(f"trial of task {task.name!r}: {strategy} on {gpus} GPU(s): {reason}")
    target = task.total_steps
    with tempfile.TemporaryDirectory(prefix="saturn-trial-") as work:
        ckpt_dir = os.path.join(work, "checkpoints")
        os.makedirs(ckpt_dir)
        restored = tune.get_checkpoint()
        if restored is not None:
            # Written by any strategy on any GPU count: train_worker re-shards it on load.
            with restored.as_directory() as d:
                for entry in os.listdir(d):
                    if entry.startswith("step-"):
                        shutil.copytree(os.path.join(d, entry), os.path.join(ckpt_dir, entry))
        ctx = mp.get_context("spawn")
        queue, acks = ctx.SimpleQueue(), ctx.SimpleQueue()
        args = (gpus, _free_port(), cloudpickle.dumps(task), strategy, knobs, target, report_every, ckpt_dir,
                queue, acks)
        procs = worker = None
        if gpus == 1:
            worker = threading.Thread(target=_worker, args=(0, *args), daemon=True)
            worker.start()
        else:
            procs = mp.start_processes(_worker, args=args, nprocs=gpus, join=False, start_method="spawn")
        try:
            while True:
                msg = queue.get()
                if msg[0] == "done":
                    break
                if msg[0] == "error":
                    raise TrialTrainingError(f"task {task.name!r} failed in training: {msg[1]}")
                _, step, loss, step_time, path = msg
                out = os.path.join(work, f"report-{step}")
                shutil.copytree(path, os.path.join(out, os.path.basename(path)))
                acks.put(True)
                tune.report(
                    {"loss": loss, "saturn_step": step, "saturn_step_time_s": step_time, "saturn_gpus": gpus,
                     "saturn_strategy": strategy, "saturn_total_steps": target},
                    checkpoint=Checkpoint.from_directory(out),
                )
                shutil.rmtree(out, ignore_errors=True)
        finally:
            if procs is not None:
                for p in procs.processes:
                    if p.is_alive():
                        p.terminate()
                procs.join(timeout=30)
            elif worker is not None:
                worker.join(timeout=30)


def saturn_trainable(make_task: Callable[[dict], Task], *, report_every: int = 10) -> Callable[[dict], None]:
    """A Tune function trainable that trains ``make_task(config)`` as ray_saturn decides.

    Use it with :class:`SaturnScheduler`, which picks each trial's strategy and
    GPU count and writes them into ``config["_saturn"]`` before the trial
    starts. Reports ``loss`` (and ``saturn_*`` fields) with a checkpoint every
    ``report_every`` steps.

    Example:
        >>> from ray_saturn.tune import saturn_trainable
        >>> trainable = saturn_trainable(lambda config: my_task(config), report_every=5)  # doctest: +SKIP
        >>> tune.Tuner(trainable, tune_config=tune.TuneConfig(scheduler=SaturnScheduler(...)))  # doctest: +SKIP
    """
    if not callable(make_task):
        raise TrialTrainingError("make_task must be a function config -> ray_saturn.Task")
    if int(report_every) < 1:
        raise TrialTrainingError(f"report_every is {report_every}; it must be at least 1")

    def saturn_trial(config: dict) -> None:
        _run_trial(make_task, config, int(report_every))

    return saturn_trial
