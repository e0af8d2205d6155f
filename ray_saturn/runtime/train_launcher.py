"""Each task segment as a Ray Train V2 run: a TorchTrainer pinned to the planned GPUs.

For a segment the launcher asks the placement-group manager to hand the
reservation over (see :mod:`ray_saturn.runtime.pg_manager`), builds

- ``ScalingConfig`` from the hand-over: one worker per GPU, each pinned by
  ``label_selector`` to its planned node, ``STRICT_PACK`` on one node; a
  share 1/k of one GPU is one worker with ``resources_per_worker={"GPU": 1/k}``
  (Ray Train V2 takes fractional GPUs per worker; up to k segments then share
  the device);
- ``RunConfig(name=<task>, storage_path=<run folder>/tasks,
  storage_filesystem=<the run's pyarrow filesystem>)``, so the Ray
  dashboard's Train view shows one run per task, Ray Train's own state lives
  in ``tasks/<task>/`` on the run's storage (an object store URI works: no
  node needs a shared disk);
  ``FailureConfig(max_failures=0)``: retries are the driver's decision (a
  failed segment is re-planned and relaunched from its last checkpoint);
- ``TorchConfig(backend=...)`` from
  :func:`ray_saturn.strategies.device.distributed_backend` on one of the
  task's GPUs (probed once on the cluster: ``nccl`` on CUDA, else ``gloo``), and

runs ``trainer.fit()`` in a thread of the driver process. Every worker runs
:func:`ray_saturn.strategies.train_worker` with the task's strategy, the
knobs the profiler chose, ``checkpoint_dir=<run folder>/tasks/<task>/checkpoints``
(a local path or a URI: every worker writes its DCP shard straight to the
storage, see :mod:`ray_saturn.strategies.checkpoint`) and a
:class:`~ray_saturn.runtime.launcher.Reporter` that sends progress to
the run's board and raises :class:`~ray_saturn.runtime.launcher.StopRequested`
when the driver moves the task (the segment ends; its next one resumes from
the latest checkpoint, whatever strategy wrote it). The driver learns a
segment's durable step from the storage (:meth:`TrainLauncher.checkpointed_step`:
the newest *intact* checkpoint), never from a disk of its own.

Example:
    >>> # inside the driver (Ray running, tasks and manager built):
    >>> # launcher = TrainLauncher(manager, storage, {t.name: t for t in tasks})
    >>> # launcher.launch(spec); events = launcher.poll(1.0)
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

from ray_saturn.defaults import quick_train_polls
from ray_saturn.errors import SaturnError
from ray_saturn.runtime.launcher import (
    Exited,
    Launcher,
    LauncherEvent,
    LaunchSpec,
    Reporter,
    StopRequested,
    drain_board,
    new_board,
)
from ray_saturn.runtime.pg_manager import PlacementGroupManager
from ray_saturn.runtime.storage import CHECKPOINTS_DIR, TASKS_DIR, RunStorage, child_uri
from ray_saturn.spec import Task

__all__ = ["TrainLauncher", "checkpoint_dir_of", "train_loop"]

logger = logging.getLogger(__name__)


#: Seconds :meth:`TrainLauncher.prepare` waits for a free GPU to learn the backend on.
PREPARE_PROBE_S = 30.0


def checkpoint_dir_of(task_dir: str) -> str:
    """Where a task's strategy checkpoints live, inside its folder of the run (a path or a URI)."""
    return child_uri(task_dir, CHECKPOINTS_DIR)


def train_loop(config: dict[str, Any]) -> None:
    """Body of every Ray Train worker of a segment."""
    import ray.train

    from ray_saturn.strategies import train_worker

    rank = ray.train.get_context().get_world_rank()
    spec: LaunchSpec = config["spec"]
    if rank == 0:
        report = Reporter(
            config["board"],
            spec.task,
            spec.attempt,
            config["report_interval_s"],
            checkpoint_every=spec.checkpoint_every,
        )
    else:

        def report(metrics: dict[str, Any]) -> None:
            return None

    train_worker(
        config["task"],
        spec.strategy,
        dict(spec.knobs),
        target_step=spec.target_step,
        checkpoint_dir=checkpoint_dir_of(spec.checkpoint_dir),
        checkpoint_every=spec.checkpoint_every,
        report=report,
    )


class TrainLauncher(Launcher):
    """Launches segments as TorchTrainer runs (see the module docstring)."""

    def __init__(
        self,
        manager: PlacementGroupManager,
        storage: RunStorage,
        tasks: Mapping[str, Task],
        *,
        report_interval_s: float = 0.5,
        backend: str | None = None,
    ) -> None:
        self.manager = manager
        self.storage = storage
        self.tasks = dict(tasks)
        self.report_interval_s = report_interval_s
        self.board = new_board()
        self._backend = backend
        self._exits: queue.Queue[Exited] = queue.Queue()
        self._threads: dict[str, threading.Thread] = {}
        self._specs: dict[str, LaunchSpec] = {}
        self._stop_requested: set[tuple[str, int]] = set()

    def prepare(self) -> None:
        """Before the run's clock starts: import Ray Train's trainer and learn the torch.distributed
        backend on any free GPU, so the first segment does not pay for them (it started 3-5 s later
        than the next ones on 2 cores). If no GPU frees within :data:`PREPARE_PROBE_S`, the first
        launch asks inside its own hold, as before."""
        import ray
        import ray.train.torch  # (the first fit() would import it)

        from ray_saturn.strategies.device import backend_task

        quick_train_polls()
        if self._backend is not None:
            return
        ref = backend_task().remote()
        ready, _ = ray.wait([ref], timeout=PREPARE_PROBE_S)
        if ready:
            self._backend = ray.get(ref)
            logger.info("torch.distributed backend: %s", self._backend)
        else:
            ray.cancel(ref, force=True)
            logger.info("no GPU free for %.0f s before the run; the first launch asks for the backend", PREPARE_PROBE_S)

    def _backend_name(self, task: str, gpus: float = 1.0) -> str:
        if self._backend is None:
            import ray

            from ray_saturn.strategies.device import backend_task

            # Probe on one of the task's own GPUs, or its share of one (inside its hold): every other
            # GPU may be held.
            probe = backend_task().options(num_gpus=min(1.0, gpus),
                                           scheduling_strategy=self.manager.bundle_strategy(task, 0))
            self._backend = ray.get(probe.remote())
            logger.info("torch.distributed backend: %s", self._backend)
        return self._backend

    def launch(self, spec: LaunchSpec) -> None:
        task = self.tasks.get(spec.task)
        if task is None:
            raise SaturnError(f"task {spec.task!r} is not in the workload given to the runtime")
        backend = self._backend_name(spec.task, spec.gpus_per_node)
        placement = self.manager.hand_over(spec.task)
        t = threading.Thread(
            target=self._fit,
            args=(spec, task, placement, backend),
            name=f"fit-{spec.task}",
            daemon=True,
        )
        self._specs[spec.task] = spec
        self._threads[spec.task] = t
        t.start()

    def _fit(self, spec: LaunchSpec, task: Task, placement: Any, backend: str) -> None:
        from ray.train import FailureConfig, RunConfig
        from ray.train.torch import TorchConfig, TorchTrainer

        quick_train_polls()
        try:
            trainer = TorchTrainer(
                train_loop,
                train_loop_config={
                    "spec": spec,
                    "task": task,
                    "board": self.board,
                    "report_interval_s": self.report_interval_s,
                },
                torch_config=TorchConfig(backend=backend),
                scaling_config=placement.scaling_config(),
                run_config=RunConfig(
                    name=spec.task,
                    storage_path=self.storage.join(TASKS_DIR),
                    storage_filesystem=self.storage.fs,
                    failure_config=FailureConfig(max_failures=0),
                ),
            )
            trainer.fit()
            status, reason = "finished", ""
        except Exception as exc:  # Ray Train wraps worker errors
            text = f"{type(exc).__name__}: {exc}"
            if (spec.task, spec.attempt) in self._stop_requested or StopRequested.__name__ in text:
                status, reason = "stopped", ""
            else:
                status, reason = "failed", _one_line(text)
        step = self.checkpointed_step(spec.checkpoint_dir)
        if status == "finished":
            step = max(step, spec.target_step)
        self._exits.put(Exited(spec.task, spec.attempt, time.time(), status, step, reason))

    def stop(self, task: str) -> None:
        spec = self._specs.get(task)
        if spec is not None:
            self._stop_requested.add(spec.key)
            self.board.request_stop.remote(task, spec.attempt)

    def poll(self, timeout_s: float) -> list[LauncherEvent]:

        exits: list[LauncherEvent] = []
        with contextlib.suppress(queue.Empty):
            exits.append(self._exits.get(timeout=max(timeout_s, 0.0)))
        while True:
            try:
                exits.append(self._exits.get_nowait())
            except queue.Empty:
                break
        events = drain_board(self.board)
        for ex in exits:
            if self._specs.get(ex.task) is not None and self._specs[ex.task].attempt == ex.attempt:
                del self._specs[ex.task]
                self._threads.pop(ex.task, None)
        return events + exits

    def checkpointed_step(self, checkpoint_dir: str) -> int:
        """The step of the task's newest intact checkpoint, read from the run's storage (0 if none)."""
        from ray_saturn.strategies import latest_step

        return int(latest_step(checkpoint_dir_of(checkpoint_dir)) or 0)

    def shutdown(self) -> None:
        for task in list(self._specs):
            self.stop(task)


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    # Ray Train puts the worker's own error last.
    return (lines[-1] if lines else text)[:500]
