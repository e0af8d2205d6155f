"""The trial side: a Tune function trainable that trains a Task on the GPUs ray_saturn gave it.

The scheduler writes its decision into the trial's config under ``"_saturn"``
(``{"strategy", "gpus", "knobs", "node"}``, or ``{"error": why}`` for a
config it cannot run) and sizes the trial's placement group to one bundle of
those GPUs on that node. :func:`trial_decision` reads it (and raises the
error); :func:`saturn_trainable` does the rest:

- builds the task with the user's ``make_task(config)``;
- restores model, optimizer, step and data position from
  ``tune.get_checkpoint()`` (a sharded DCP checkpoint that any strategy on any
  GPU count loads), so a resized trial neither repeats nor skips a sample;
- on 1 GPU trains in the trial's own process; on ``g > 1`` GPUs starts ``g``
  local processes, each with ``LOCAL_RANK``/``RANK``/``WORLD_SIZE`` set and
  its own device and backend (``cuda:<rank>`` + NCCL when the trial's GPUs are
  CUDA devices, else CPU + gloo; :func:`ray_saturn.strategies.device.rank_device`);
  rank 0 hands each report to the trial process over a pipe;
- reports every ``report_every`` steps ``loss``, ``saturn_strategy``,
  ``saturn_gpus``, ``saturn_step``, ``saturn_step_time_s``,
  ``saturn_total_steps`` and ``saturn_resumed_from`` (the checkpoint step this
  trial process started from, 0 when it started fresh) with a checkpoint (so ASHA's ``training_iteration``
  advances once per report, and Tune's progress table shows each trial's
  GPUs and strategy);
- a trial that trained all its steps waits for every rank to exit on its own:
  it ends as TERMINATED, never ERROR. A rank that fails ends the others and
  the trial errors with the rank's error.

There is no Ray Train run inside a trial, so no nested placement group waits
for GPUs its parent already holds.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.errors import SaturnError
from ray_saturn.spec import Task

__all__ = ["TrialDecision", "TrialTrainingError", "saturn_trainable", "trial_decision", "tune_strategies"]

logger = logging.getLogger(__name__)

#: Seconds a finished multi-process trial waits for its ranks to exit before it ends them.
RANK_EXIT_TIMEOUT_S = 120.0


def tune_strategies() -> tuple[str, ...]:
    """Strategies a Tune trial can execute: every registered one (on one node)."""
    from ray_saturn.strategies import strategy_names

    return tuple(strategy_names())


class TrialTrainingError(SaturnError, RuntimeError):
    """A Tune trial could not train its task (rejected config, bad task, a rank failed)."""


@dataclass(frozen=True)
class TrialDecision:
    """What ray_saturn decided for a trial: run ``strategy`` on ``gpus`` GPUs of ``node`` (or on a
    share 1/k of one GPU: one worker, the device shared with other trials)."""

    strategy: str
    gpus: int | float
    knobs: Mapping[str, Any] = field(default_factory=dict)
    node: str | None = None

    @property
    def workers(self) -> int:
        """Training processes: one per GPU, one for a share of one GPU."""
        return 1 if self.gpus < 1 else int(self.gpus)


def trial_decision(config: Mapping[str, Any]) -> TrialDecision:
    """The decision :class:`~ray_saturn.tune.SaturnScheduler` wrote into a trial's config.

    Raises :class:`TrialTrainingError` with the scheduler's reason when the
    config could not be estimated or placed (the trial errors, the search goes
    on), or when the trial was not scheduled by a SaturnScheduler.

    Example:
        >>> trial_decision({"lr": 0.1, "_saturn": {"strategy": "ddp", "gpus": 2}}).gpus
        2
    """
    raw = config.get("_saturn")
    if not isinstance(raw, Mapping):
        raise TrialTrainingError(
            "this trial has no ray_saturn decision in config['_saturn']; "
            "pass SaturnScheduler(...) as the scheduler in tune.TuneConfig"
        )
    if raw.get("error"):
        raise TrialTrainingError(str(raw["error"]))
    try:
        g = float(raw["gpus"])
        knobs = raw.get("knobs") or {}
        if not (isinstance(raw["strategy"], str) and raw["strategy"] and g > 0 and math.isfinite(g)
                and isinstance(knobs, Mapping)):
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise TrialTrainingError(
            f"config['_saturn'] is {dict(raw)!r}, not a decision of SaturnScheduler (a strategy, gpus > 0 and "
            "knobs as a dict); '_saturn' is ray_saturn's key: leave it out of param_space"
        ) from None
    return TrialDecision(raw["strategy"], g if g < 1 else int(g), dict(knobs), raw.get("node"))


def _set_rank_env(rank: int, world: int) -> None:
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world))
    # The ranks are processes of one node: their process group's sockets (gloo's pairs, NCCL's bootstrap)
    # listen on the loopback interface only, not on the machine's address (unless the user chose one).
    loopback = _loopback_interface()
    if loopback is not None:
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(var, loopback)


def _loopback_interface() -> str | None:
    """The name of this machine's loopback interface ("lo" on Linux, "lo0" on macOS), if it has one."""
    import socket

    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


def _train_segments(
    task: Task,
    strategy: str,
    knobs: dict,
    target: int,
    report_every: int,
    ckpt_dir: str,
    on_report: Callable[[int, float | None, float | None, str], None],
    rank: int,
    ways: int,
) -> None:
    """Train to ``target`` in segments of ``report_every`` steps; rank 0 reports after each."""
    from ray_saturn.strategies import train_worker
    from ray_saturn.strategies.checkpoint import latest_checkpoint, latest_step

    step = latest_step(ckpt_dir) or 0
    while step < target:
        seg_target = min(target, (step // report_every + 1) * report_every)
        out = train_worker(
            task,
            strategy,
            knobs,
            target_step=seg_target,
            checkpoint_dir=ckpt_dir,
            checkpoint_every=report_every,
            report=lambda r: None,
        )
        step = out.final_step
        if rank == 0:
            on_report(step, out.last_loss, out.mean_step_time_s, str(latest_checkpoint(ckpt_dir)))
        if ways > 1:
            import torch.distributed as dist

            dist.barrier()  # the next segment may prune this checkpoint: not before it was reported


def _rank_main(
    rank: int,
    ways: int,
    rendezvous: str,
    task_bytes: bytes,
    strategy: str,
    knobs: dict,
    target: int,
    report_every: int,
    ckpt_dir: str,
    conn: Any,
) -> None:
    """One training process of a multi-GPU trial: rank ``rank`` of ``ways`` on its own device."""
    import torch
    import torch.distributed as dist
    from ray import cloudpickle

    from ray_saturn.strategies.device import use_rank_device
    from ray_saturn.strategies.worker import exit_finished_process

    _die_with_parent()
    _set_rank_env(rank, ways)
    torch.set_num_threads(1)
    device = use_rank_device(rank)
    store = dist.FileStore(rendezvous, ways)  # a file in the trial's private folder: no port to listen on
    dist.init_process_group(
        device.backend,
        store=store,
        rank=rank,
        world_size=ways,
        **({"device_id": device.device} if device.is_cuda else {}),
    )
    task: Task = cloudpickle.loads(task_bytes)

    def report(step, loss, step_time, path):
        conn.send(("report", step, loss, step_time, path))
        conn.recv()  # Tune has copied the checkpoint

    try:
        _train_segments(task, strategy, knobs, target, report_every, ckpt_dir, report, rank, ways)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        conn.send(("done",))
    exit_finished_process()


def _die_with_parent() -> None:
    """Linux: end this rank when the trial process dies (Tune kills a stopped trial's actor)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _report_to_tune(
    work: str, task: Task, decision: TrialDecision, resumed_from: int, step: int, loss, step_time, path: str
) -> None:
    from ray import tune
    from ray.tune import Checkpoint

    out = os.path.join(work, f"report-{step}")
    shutil.copytree(path, os.path.join(out, os.path.basename(path)))
    try:
        tune.report(
            {
                "loss": loss,
                "saturn_strategy": decision.strategy,
                "saturn_gpus": decision.gpus,
                "saturn_step": step,
                "saturn_step_time_s": step_time,
                "saturn_total_steps": task.total_steps,
                "saturn_resumed_from": resumed_from,
            },
            checkpoint=Checkpoint.from_directory(out),
        )
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _run_multi(
    task: Task, decision: TrialDecision, report_every: int, ckpt_dir: str, work: str, resumed_from: int
) -> None:
    import multiprocessing

    import torch.multiprocessing as tmp
    from ray import cloudpickle

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()  # a pipe, not a queue: no semaphores to leak
    args = (
        decision.workers,
        # The ranks (processes of this node) meet on a FileStore in the trial's own folder (mode 0700,
        # removed with the trial). A TCPStore listened on every interface of the machine, whatever host it
        # was given, and a port found free and closed could be taken before rank 0 bound it (EADDRINUSE).
        os.path.join(work, "rendezvous"),
        cloudpickle.dumps(task),
        decision.strategy,
        dict(decision.knobs),
        task.total_steps,
        report_every,
        ckpt_dir,
        child,
    )
    procs = tmp.start_processes(_rank_main, args=args, nprocs=decision.workers, join=False, start_method="spawn")
    child.close()
    done = False
    try:
        while not done:
            if parent.poll(0.2):
                msg = parent.recv()
                if msg[0] == "done":
                    done = True
                    break
                _, step, loss, step_time, path = msg
                _report_to_tune(work, task, decision, resumed_from, step, loss, step_time, path)
                parent.send(True)
            # join raises, naming the rank, when one failed (and ends the others).
            elif procs.join(timeout=0) and not parent.poll(0):
                raise TrialTrainingError(f"task {task.name!r}: its ranks exited before training ended")
        # Finished: every rank exits on its own after the last barrier.
        import time

        deadline = time.monotonic() + RANK_EXIT_TIMEOUT_S
        while not procs.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TrialTrainingError(
                    f"task {task.name!r} trained all its steps, but its ranks did not exit in "
                    f"{RANK_EXIT_TIMEOUT_S:.0f} s"
                )
    except tmp.ProcessRaisedException as exc:
        first = str(exc).strip().splitlines()
        raise TrialTrainingError(f"task {task.name!r} failed in training: {first[-1] if first else exc}") from None
    except tmp.ProcessExitedException as exc:
        raise TrialTrainingError(f"task {task.name!r} failed in training: {exc}") from None
    finally:
        parent.close()
        for p in procs.processes:
            if p.is_alive():
                p.terminate()
        for p in procs.processes:
            p.join(timeout=10)


def _run_trial(make_task: Callable[[dict], Task], config: dict, report_every: int) -> None:
    from ray import tune

    from ray_saturn.strategies import get_strategy
    from ray_saturn.strategies.checkpoint import latest_step
    from ray_saturn.strategies.device import use_rank_device

    decision = trial_decision(config)
    user_config = {k: v for k, v in config.items() if k != "_saturn"}
    task = make_task(user_config)
    if not isinstance(task, Task):
        raise TrialTrainingError(f"make_task must return a ray_saturn.Task, got {type(task).__name__}")
    reason = get_strategy(decision.strategy).applies(task, decision.workers)
    if reason:
        raise TrialTrainingError(
            f"trial of task {task.name!r}: {decision.strategy} on {decision.gpus} GPU(s): {reason}"
        )
    with tempfile.TemporaryDirectory(prefix="saturn-trial-") as work:
        ckpt_dir = os.path.join(work, "checkpoints")
        os.makedirs(ckpt_dir)
        restored = tune.get_checkpoint()
        if restored is not None:
            # Written by any strategy on any GPU count: train_worker re-shards it on load.
            with restored.as_directory() as d:
                for entry in os.listdir(d):
                    if entry.startswith("step-"):
                        # Links stay links (checkpoint verification refuses them): never copy in what they lead to.
                        shutil.copytree(os.path.join(d, entry), os.path.join(ckpt_dir, entry), symlinks=True)
        resumed_from = latest_step(ckpt_dir) or 0
        if decision.workers == 1:
            _set_rank_env(0, 1)
            use_rank_device(0)

            def report(step, loss, step_time, path):
                _report_to_tune(work, task, decision, resumed_from, step, loss, step_time, path)

            _train_segments(
                task, decision.strategy, dict(decision.knobs), task.total_steps, report_every, ckpt_dir, report, 0, 1
            )
        else:
            _run_multi(task, decision, report_every, ckpt_dir, work, resumed_from)


def saturn_trainable(make_task: Callable[[dict], Task], *, report_every: int = 10) -> Callable[[dict], None]:
    """A Tune function trainable that trains ``make_task(config)`` as ray_saturn decides.

    Use it with :class:`~ray_saturn.tune.SaturnScheduler`, which picks each
    trial's strategy and GPU count and writes them into ``config["_saturn"]``
    before the trial starts. Reports ``loss`` (and ``saturn_*`` fields) with a
    checkpoint every ``report_every`` steps.

    Example:
        >>> from ray_saturn.tune import saturn_trainable
        >>> trainable = saturn_trainable(lambda config: my_task(config), report_every=5)  # doctest: +SKIP
        >>> tune.Tuner(trainable, tune_config=tune.TuneConfig(scheduler=SaturnScheduler(...)))  # doctest: +SKIP
    """
    if not callable(make_task):
        raise TrialTrainingError("make_task must be a function config -> ray_saturn.Task")
    from ray_saturn.limits import whole

    every = whole(report_every, "report_every", error=TrialTrainingError)  # 2.5 was cut to 2, "x" a ValueError

    def saturn_trial(config: dict) -> None:
        _run_trial(make_task, config, every)

    return saturn_trial
