"""The worker-side training entry point the runtime calls (see ``ray_saturn.strategies``)."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ray_saturn.errors import SpecError
from ray_saturn.spec import Task
from ray_saturn.strategies.base import StrategyError, WorkerContext
from ray_saturn.strategies.batching import DataStream
from ray_saturn.strategies.checkpoint import load_latest, save_checkpoint
from ray_saturn.strategies.device import synchronize
from ray_saturn.strategies.introspect import build_model
from ray_saturn.strategies.registry import get_strategy

__all__ = ["TrainOutcome", "exit_finished_process", "train_worker"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainOutcome:
    """What :func:`train_worker` did.

    ``final_step``: optimizer steps done in total (= target_step);
    ``start_step``: where it resumed (0 when it started fresh);
    ``last_loss``: loss of the last step trained (``None`` if none was);
    ``data_position``: global batches consumed; ``checkpoint``: folder of the
    last checkpoint written; ``mean_step_time_s``: mean over the steps trained.
    """

    final_step: int
    start_step: int
    last_loss: float | None
    data_position: int
    checkpoint: str | None
    mean_step_time_s: float | None
    strategy: str
    world_size: int


def train_worker(
    task: Task,
    strategy: str,
    knobs: Mapping[str, Any],
    *,
    target_step: int,
    checkpoint_dir: str,
    checkpoint_every: int,
    report: Callable[[dict], None],
) -> TrainOutcome:
    """Train ``task`` with ``strategy`` on this worker until ``target_step``.

    See the ``ray_saturn.strategies`` docstring for the contract.

    Example:
        >>> import tempfile, torch
        >>> from ray_saturn import Task
        >>> task = Task("lin", model=lambda hp: torch.nn.Linear(2, 1),
        ...             data=lambda hp: [(torch.ones(4, 2), torch.zeros(4, 1))],
        ...             loss=lambda out, b: torch.nn.functional.mse_loss(out, b[1]),
        ...             optimizer=lambda p, hp: torch.optim.SGD(p, lr=0.1), max_steps=4)
        >>> d = tempfile.mkdtemp()
        >>> train_worker(task, "single", {}, target_step=4, checkpoint_dir=d,
        ...              checkpoint_every=2, report=lambda r: None).final_step
        4
    """
    if isinstance(target_step, bool) or int(target_step) < 0:
        raise SpecError(f"target_step is {target_step!r}; give a step count >= 0")
    if isinstance(checkpoint_every, bool) or int(checkpoint_every) < 1:
        raise SpecError(f"checkpoint_every is {checkpoint_every!r}; give a whole number >= 1")
    ctx = WorkerContext.current()
    strat = get_strategy(strategy)
    knobs = strat.check_knobs(knobs)
    reason = strat.applies(task, ctx.world_size) or strat.hardware_reason(knobs, ctx.device)
    if reason:
        raise StrategyError(f"task {task.name!r}: {reason}")

    runner = strat.prepare(build_model(task), task, knobs, ctx)
    try:
        start, position, ckpt = 0, 0, None
        loaded = load_latest(checkpoint_dir, runner.module, runner.optimizer)
        if loaded is not None:
            meta = loaded.meta
            start, position, ckpt = meta.step, meta.data_position, loaded.location
            log.info(
                "task %s resumes from step %d (written by %s on %d worker(s))",
                task.name,
                start,
                meta.strategy,
                meta.world_size,
            )
        if start > target_step:
            raise SpecError(
                f"task {task.name!r}: checkpoint {ckpt} is at step {start}, "
                f"past target_step {target_step}"
            )
        stream = DataStream(task.data, task.hparams, position)
        loss: float | None = None
        times: list[float] = []
        for step in range(start, target_step):
            batch = next(stream)
            synchronize(ctx.device)
            t0 = time.perf_counter()
            loss = runner.step(batch)
            synchronize(ctx.device)
            dt = time.perf_counter() - t0
            times.append(dt)
            done = step + 1
            if ctx.rank == 0:
                report({"step": done, "loss": loss, "step_time_s": dt})
            if done % checkpoint_every == 0 or done == target_step:
                ckpt = save_checkpoint(
                    checkpoint_dir,
                    runner.module,
                    runner.optimizer,
                    step=done,
                    data_position=stream.position,
                    strategy=strat.name,
                    task=task.name,
                    loss=loss,
                )
        return TrainOutcome(
            target_step,
            start,
            loss,
            stream.position,
            ckpt,
            sum(times) / len(times) if times else None,
            strat.name,
            ctx.world_size,
        )
    finally:
        runner.close()


def exit_finished_process() -> None:
    """End a spawned training process whose results are all out, skipping the interpreter's teardown.

    Call it once the process group is destroyed and every result sent or saved.
    The C++ threads of a destroyed gloo group can outlive it, and the teardown
    then aborts ("terminate called without an active exception", SIGABRT) about
    one exit in fifteen on a 2-core machine: a rank that trained every step
    would read as failed.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
