"""The trial side: a Tune function trainable that trains a Task on the GPUs ray_saturn gave it.

The scheduler writes its decision into the trial's config under ``"_saturn"``
(``{"strategy": "single"|"ddp", "gpus": g}``) and sizes the trial's
placement group to ``g`` GPUs in one bundle (STRICT_PACK). The trainable

- builds the task with the user's ``make_task(config)``;
- restores model, optimizer and step from ``tune.get_checkpoint()`` (after a
  pause, a resize or a restart), so no step is trained twice;
- trains with ``g`` local processes (torch DistributedDataParallel, gloo) when
  ``g > 1``, in the trial process when ``g == 1``. There is no Ray Train run
  inside the trial, hence no nested placement group that could wait forever
  for GPUs its parent already holds;
- reports every ``report_every`` steps ``loss``, ``saturn_step``,
  ``saturn_step_time_s`` and ``saturn_gpus`` with a checkpoint, so ASHA's
  ``training_iteration`` advances once per report.

Batches follow the strategies' conventions: global batch ``p`` is element
``p % n`` of ``task.data(hparams)``; the model input is ``batch[0]`` (or
``batch["input"]``); each of ``g`` ranks takes a contiguous slice of the rows.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from ray_saturn.errors import SaturnError
from ray_saturn.spec import Task

__all__ = ["TUNE_STRATEGIES", "TrialTrainingError", "saturn_trainable"]

logger = logging.getLogger(__name__)

#: Strategies a Tune trial can execute (the estimate's rows are filtered to these).
TUNE_STRATEGIES = ("single", "ddp")
CKPT_FILE = "saturn_state.pt"


class TrialTrainingError(SaturnError, RuntimeError):
    """A Tune trial could not train its task (bad decision, bad task)."""


def _model_input(batch: Any) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (tuple, list)) and batch:
        return batch[0]
    if isinstance(batch, Mapping) and "input" in batch:
        return batch["input"]
    raise TrialTrainingError("cannot find the model input in a batch: yield (input, target) tuples or a tensor")


def _shard(batch: Any, rank: int, ways: int) -> Any:
    import torch

    if ways == 1:
        return batch

    def cut(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            n = x.shape[0]
            if n % ways:
                raise TrialTrainingError(f"a batch of {n} rows does not split evenly over {ways} GPUs")
            per = n // ways
            return x[rank * per : (rank + 1) * per]
        return x

    if isinstance(batch, (tuple, list)):
        return type(batch)(cut(x) for x in batch)
    if isinstance(batch, Mapping):
        return {k: cut(v) for k, v in batch.items()}
    return cut(batch)


def _worker(rank: int, ways: int, port: int, task_bytes: bytes, state_path: str | None, target: int,
            report_every: int, out_dir: str, queue: Any) -> None:
    """One training process (rank ``rank`` of ``ways``); rank 0 sends progress through ``queue``."""
    import torch
    import torch.distributed as dist
    from ray import cloudpickle

    task: Task = cloudpickle.loads(task_bytes)
    torch.set_num_threads(1)
    if ways > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ways)
    try:
        torch.manual_seed(int(task.hparams.get("seed", 0)))
        device = torch.device("cuda", rank % torch.cuda.device_count()) if torch.cuda.is_available() else None
        model = task.model(task.hparams)
        if device is not None:
            model = model.to(device)
        opt = task.optimizer(model.parameters(), task.hparams)
        step = 0
        if state_path:
            state = torch.load(state_path, map_location="cpu", weights_only=True)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            step = int(state["step"])
        net = torch.nn.parallel.DistributedDataParallel(model) if ways > 1 else model
        data = list(task.data(task.hparams))
        if not data:
            raise TrialTrainingError(f"task {task.name!r}: its data factory yielded no batches")
        t_last, steps_since = time.perf_counter(), 0
        loss_v = float("nan")
        while step < target:
            batch = _shard(data[step % len(data)], rank, ways)
            if device is not None:
                batch = type(batch)(x.to(device) if isinstance(x, torch.Tensor) else x for x in batch)
            opt.zero_grad(set_to_none=True)
            loss = task.loss(net(_model_input(batch)), batch)
            loss.backward()
            opt.step()
            step += 1
            steps_since += 1
            loss_t = loss.detach().float().cpu()
            if ways > 1:
                dist.all_reduce(loss_t)
                loss_t /= ways
            loss_v = float(loss_t)
            if step % report_every == 0 or step == target:
                now = time.perf_counter()
                if rank == 0:
                    path = os.path.join(out_dir, f"state-{step}.pt")
                    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
                    queue.put(("report", step, loss_v, (now - t_last) / steps_since, path))
                if ways > 1:
                    dist.barrier()  # the next checkpoint is not written before this one is handed over
                t_last, steps_since = now, 0
    except BaseException as exc:
        if rank == 0:
            queue.put(("error", repr(exc)))
        raise
    finally:
        if ways > 1:
            dist.destroy_process_group()
        if rank == 0:
            queue.put(("done",))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_trial(make_task: Callable[[dict], Task], config: dict, report_every: int) -> None:
    import torch.multiprocessing as mp
    from ray import cloudpickle, tune
    from ray.tune import Checkpoint

    decision = dict(config.get("_saturn") or {})
    strategy = decision.get("strategy", "single")
    gpus = int(decision.get("gpus", 1))
    if strategy not in TUNE_STRATEGIES:
        raise TrialTrainingError(
            f"strategy {strategy!r} cannot run inside a Tune trial yet; Tune trials run {', '.join(TUNE_STRATEGIES)}"
        )
    if strategy == "single" and gpus != 1:
        raise TrialTrainingError(f"strategy 'single' runs on 1 GPU, not {gpus}")
    user_config = {k: v for k, v in config.items() if k != "_saturn"}
    task = make_task(user_config)
    if not isinstance(task, Task):
        raise TrialTrainingError(f"make_task must return a ray_saturn.Task, got {type(task).__name__}")
    target = task.total_steps
    with tempfile.TemporaryDirectory(prefix="saturn-trial-") as out_dir:
        state_path = None
        ckpt = tune.get_checkpoint()
        if ckpt is not None:
            with ckpt.as_directory() as d:
                src = os.path.join(d, CKPT_FILE)
                if os.path.exists(src):
                    state_path = os.path.join(out_dir, "restore.pt")
                    with open(src, "rb") as f_in, open(state_path, "wb") as f_out:
                        f_out.write(f_in.read())
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        args = (gpus, _free_port(), cloudpickle.dumps(task), state_path, target, report_every, out_dir, queue)
        if gpus == 1:
            import threading

            worker = threading.Thread(target=_worker, args=(0, *args), daemon=True)
            worker.start()
            procs = None
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
                ckpt_dir = os.path.join(out_dir, f"ckpt-{step}")
                os.makedirs(ckpt_dir)
                os.replace(path, os.path.join(ckpt_dir, CKPT_FILE))
                tune.report(
                    {"loss": loss, "saturn_step": step, "saturn_step_time_s": step_time, "saturn_gpus": gpus,
                     "saturn_strategy": strategy, "saturn_total_steps": target},
                    checkpoint=Checkpoint.from_directory(ckpt_dir),
                )
        finally:
            if procs is not None:
                for p in procs.processes:
                    if p.is_alive():
                        p.terminate()
                procs.join(timeout=30)
            else:
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
