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

Worker reuse (``reuse_workers``, on by default). Starting a TorchTrainer
costs its controller, a process per worker, their imports of torch and Ray
Train and the process group: 13-19 s per segment on 2 cores, as much as the
demo's training. So a segment's workers do not end with its last step: they
*park* (rank 0 tells the board; the driver sees the segment finished) and
wait up to ``linger_s`` for another segment on exactly the same GPUs (same
nodes, as many per node, whole GPUs). The driver, reserving the next task,
claims them (:meth:`TrainLauncher.claim_parked`) and books the task without
a hold; the launch hands the segment to the parked loop, which builds the
new model and strategy in the same processes and process group and trains
on. Groups nobody claims are let go at the driver's next launch pass
(:meth:`TrainLauncher.release_parked`), so GPUs another shape needs wait at
most one pass. A chained segment runs inside the Ray Train run of the
group's first task (the dashboard's Train view shows that run), writes its
checkpoints to its own folder as any segment does, and stops and fails as
any segment does (its :class:`Exited` names it).

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
from dataclasses import dataclass
from typing import Any

from ray_saturn.defaults import WORKER_LINGER_S, quick_train_polls
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


#: Seconds between a parked group's polls of the board.
_PARK_POLL_S = 0.05
#: A claimed group whose launch never came ends after this many seconds (the driver's launch follows its
#: claim in the same pass; this only bounds a driver that died in between).
CLAIM_TIMEOUT_S = 120.0


def train_loop(config: dict[str, Any]) -> None:
    """Body of every Ray Train worker of a segment, and of the segments that reuse its workers."""
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    spec: LaunchSpec = config["spec"]
    task: Task = config["task"]
    group: str | None = config.get("group")
    decided = 0
    while True:
        _train_segment(config, spec, task, rank)
        if group is None:
            return
        nxt = _next_segment(config["board"], group, spec, rank, decided, float(config["linger_s"]))
        decided += 1
        if nxt is None:
            return
        spec, task = nxt
        _free_memory()


def _train_segment(config: dict[str, Any], spec: LaunchSpec, task: Task, rank: int) -> None:
    from ray_saturn.strategies import train_worker

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
        task,
        spec.strategy,
        dict(spec.knobs),
        target_step=spec.target_step,
        checkpoint_dir=checkpoint_dir_of(spec.checkpoint_dir),
        checkpoint_every=spec.checkpoint_every,
        report=report,
    )


def _next_segment(
    board: Any, group: str, done: LaunchSpec, rank: int, decided: int, linger_s: float
) -> tuple[LaunchSpec, Task] | None:
    """Park the group after ``done``'s last step and wait for the next segment (``None``: end).

    Rank 0 tells the board the segment finished (its final checkpoint is written: the save is
    collective) and polls it; it gives up after ``linger_s`` unless a launch claimed the group. The
    other ranks follow rank 0's ``decided``-th decision.
    """
    import ray

    if rank == 0:
        ray.get(board.park.remote(group, done.task, done.attempt, time.time(), done.target_step))
        t0 = time.monotonic()
        while True:
            waited = time.monotonic() - t0
            kind, segment = ray.get(board.next_segment.remote(group, waited > linger_s, waited > CLAIM_TIMEOUT_S))
            if kind != "wait":
                break
            time.sleep(_PARK_POLL_S)
    else:
        while True:
            kind, segment = ray.get(board.decision.remote(group, decided))
            if kind != "wait":
                break
            time.sleep(_PARK_POLL_S)
    if kind != "run" or not segment:
        return None
    spec, task = ray.get(segment[0])
    return spec, task


def _free_memory() -> None:
    """Between two segments of one group: the last model's memory goes before the next is built."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class _Group:
    """A TorchTrainer's workers (see the module docstring's worker reuse): where they are, the
    segment they run or ran last, and whether they are parked (``claimed_by``: the task coming)."""

    name: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    spec: LaunchSpec
    parked: bool = False
    claimed_by: str | None = None


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
        reuse_workers: bool = True,
        linger_s: float = WORKER_LINGER_S,
    ) -> None:
        self.manager = manager
        self.storage = storage
        self.tasks = dict(tasks)
        self.report_interval_s = report_interval_s
        self.reuse_workers = reuse_workers
        self.linger_s = float(linger_s)
        self.board = new_board()
        self._backend = backend
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}
        self._claims: dict[str, str] = {}  # task -> the parked group its next launch runs on
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
        name = self._claims.pop(spec.task, None)
        if task is None:
            if name is not None:
                self._close(name)
            raise SaturnError(f"task {spec.task!r} is not in the workload given to the runtime")
        if name is not None and self._offer(name, spec, task):
            return
        backend = self._backend_name(spec.task, spec.gpus_per_node)
        placement = self.manager.hand_over(spec.task)
        group = None
        if self.reuse_workers and placement.gpus_per_worker == 1 and spec.gpus >= 1:
            group = _Group(f"{spec.task}#{spec.attempt}", tuple(sorted(spec.nodes)), int(spec.gpus_per_node), spec)
            with self._lock:
                self._groups[group.name] = group
        t = threading.Thread(
            target=self._fit,
            args=(spec, task, placement, backend, group),
            name=f"fit-{spec.task}",
            daemon=True,
        )
        self._specs[spec.task] = spec
        self._threads[spec.task] = t
        t.start()

    def _offer(self, name: str, spec: LaunchSpec, task: Task) -> bool:
        """Hand ``spec`` to the parked group ``name``; ``False`` if the group ended first (the caller
        then starts a trainer of its own, which waits for the GPUs the group frees)."""
        import ray

        with self._lock:
            group = self._groups.get(name)
            if group is None:
                return False
            previous, group.spec = group.spec, spec
        if ray.get(self.board.offer.remote(name, [ray.put((spec, task))])):
            with self._lock:
                group.parked, group.claimed_by = False, None
            self._specs[spec.task] = spec
            logger.info("%s runs on the parked workers of %s (no new trainer)", spec.task, previous.task)
            return True
        with self._lock:
            group.spec = previous
        logger.info("the parked workers of %s ended before %s could use them", previous.task, spec.task)
        return False

    def claim_parked(self, task: str, nodes: tuple[str, ...], gpus_per_node: int | float) -> bool:
        import ray

        if not self.reuse_workers or gpus_per_node < 1:
            return False
        want = (tuple(sorted(nodes)), int(gpus_per_node))
        with self._lock:
            parked = [g for g in self._groups.values()
                      if g.parked and g.claimed_by is None and (g.nodes, g.gpus_per_node) == want]
        for g in parked:
            if ray.get(self.board.claim.remote(g.name)):
                with self._lock:
                    g.claimed_by = task
                self._claims[task] = g.name
                return True
            with self._lock:
                g.parked = False  # it gave up waiting
        return False

    def release_parked(self) -> None:
        with self._lock:
            idle = [g.name for g in self._groups.values() if g.parked and g.claimed_by is None]
        for name in idle:
            self._close(name, force=False)
        for task, name in list(self._claims.items()):  # a claim whose launch never came
            del self._claims[task]
            self._close(name)

    def _close(self, name: str, force: bool = True) -> None:
        with self._lock:
            group = self._groups.get(name)
            if group is not None:
                group.parked, group.claimed_by = False, None
        self.board.dismiss.remote(name, force)

    def _fit(self, spec: LaunchSpec, task: Task, placement: Any, backend: str, group: _Group | None) -> None:
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
                    "group": None if group is None else group.name,
                    "linger_s": self.linger_s,
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
            status, reason, stopped = "finished", "", False
        except Exception as exc:  # Ray Train wraps worker errors
            text = f"{type(exc).__name__}: {exc}"
            status, reason = "failed", _one_line(text)
            stopped = StopRequested.__name__ in text
        with self._lock:
            if group is not None:
                self._groups.pop(group.name, None)
                spec = group.spec  # the segment the workers ran last
        if status == "failed" and (stopped or spec.key in self._stop_requested):
            status, reason = "stopped", ""
        step = self.checkpointed_step(spec.checkpoint_dir)
        if status == "finished":
            step = max(step, spec.target_step)
        # (A parked group's last segment was reported finished when it parked; this repeat is ignored.)
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
        parked = {(ev.task, ev.attempt) for ev in events if isinstance(ev, Exited)}
        if parked:
            with self._lock:
                for g in self._groups.values():
                    if g.spec.key in parked:
                        g.parked = True  # its workers wait for the next segment of this shape
        for ex in events + exits:
            if isinstance(ex, Exited) and self._specs.get(ex.task) is not None \
                    and self._specs[ex.task].attempt == ex.attempt:
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
        self._claims.clear()
        with self._lock:
            names = list(self._groups)
        for name in names:
            self._close(name)


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    # Ray Train puts the worker's own error last.
    return (lines[-1] if lines else text)[:500]
