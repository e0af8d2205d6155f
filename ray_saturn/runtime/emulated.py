"""The emulated workload of ``ray-saturn emulate``: steps that sleep, checkpoints that count.

Each segment is a Ray task scheduled *inside* the placement group that the
manager reserved for it (bundle 0, ``num_gpus`` = the GPUs per node of the
assignment, or its share 1/k of one GPU; the other bundles of a multi-node assignment stay held by the
group). Its step sleeps ``true_step_time_s x time_scale``. The true step
times are drawn exactly as the simulator draws them
(:func:`ray_saturn.sim.workload.true_step_times`: a seeded per-task factor
of spread ``noise`` times a per-configuration jitter of a quarter of it; the
profile's times without noise), so emulation and simulation face the same
world and the driver's estimates are off the way real ones are. It
reports through the same :class:`~ray_saturn.runtime.launcher.Reporter`
and board as real workers, and checkpoints its step counter every
``checkpoint_every`` steps in the task's checkpoint folder (a local path or
pyarrow URI, written atomically), restoring from the latest one when it
starts, so moves, retries and resume work as for real tasks.

What it does not exercise: Ray Train's controller and worker group,
torch.distributed, the strategies' training code and DCP checkpoints (the
:class:`~ray_saturn.runtime.train_launcher.TrainLauncher` does; it costs
10-20 s per start on a 2-core machine, too much for 32 tasks in 2 minutes).

Example:
    >>> # inside a driver: EmulatedLauncher(manager, time_scale=0.01, truth=true_step_times(...))
    >>> latest_emulated_step("/nonexistent/run/tasks/a")
    0
"""

from __future__ import annotations

import logging
import posixpath
import time
import uuid
from collections.abc import Mapping
from typing import Any

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

__all__ = ["EmulatedLauncher", "latest_emulated_step", "run_emulated_segment"]

logger = logging.getLogger(__name__)
_SUBDIR = "emulated"


def _fs(checkpoint_dir: str) -> tuple[Any, str]:
    from ray_saturn.runtime.storage import RunStorage

    store = RunStorage.at(checkpoint_dir)  # the run's storage layer: local, pyarrow or fsspec URIs
    return store.fs, store.path


def latest_emulated_step(checkpoint_dir: str) -> int:
    """The step of the newest emulated checkpoint in ``checkpoint_dir`` (0 if none)."""
    import pyarrow.fs as pafs

    fs, path = _fs(checkpoint_dir)
    sel = pafs.FileSelector(posixpath.join(path, _SUBDIR), allow_not_found=True)
    steps = []
    for info in fs.get_file_info(sel):
        name = info.base_name
        digits = name[5:-5]
        if name.startswith("step-") and name.endswith(".json") and digits.isascii() and digits.isdigit():
            steps.append(int(digits))  # another file of that shape (step-x.json) is not a checkpoint
    return max(steps, default=0)


def _save(checkpoint_dir: str, step: int) -> None:
    import json

    fs, path = _fs(checkpoint_dir)
    folder = posixpath.join(path, _SUBDIR)
    fs.create_dir(folder, recursive=True)
    tmp = posixpath.join(folder, f".tmp-{uuid.uuid4().hex[:8]}")
    with fs.open_output_stream(tmp) as f:
        f.write(json.dumps({"step": step, "time": time.time()}).encode())
    fs.move(tmp, posixpath.join(folder, f"step-{step:012d}.json"))
    # Keep the newest two.
    import pyarrow.fs as pafs

    old = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(folder)) if i.base_name.startswith("step-"))
    for p in old[:-2]:
        fs.delete_file(p)


def run_emulated_segment(
    spec: LaunchSpec, board: Any, wall_step_s: float, report_interval_s: float, wall_startup_s: float = 0.0
) -> dict:
    """Body of one emulated segment (runs as a Ray task inside the reserved bundle).

    It starts up for ``wall_startup_s`` (the profile's ``startup_s``, time-scaled), then steps.
    """
    step = latest_emulated_step(spec.checkpoint_dir)
    reporter = Reporter(board, spec.task, spec.attempt, report_interval_s)
    every = max(1, spec.checkpoint_every)
    deadline = time.time() + wall_startup_s
    chunk = max(1, int(report_interval_s / max(wall_step_s, 1e-9)))
    first = True
    try:
        while step < spec.target_step:
            to_ckpt = every - step % every
            n = 1 if first else min(spec.target_step - step, to_ckpt, chunk)
            first = False
            deadline += n * wall_step_s
            pause = deadline - time.time()
            if pause > 0:
                time.sleep(pause)
            step += n
            if step % every == 0 or step == spec.target_step:
                _save(spec.checkpoint_dir, step)
            reporter({"step": step, "step_time_s": wall_step_s, "loss": None})
    except StopRequested:
        _save(spec.checkpoint_dir, step)
        return {"status": "stopped", "step": step}
    return {"status": "finished", "step": step}


def _warm(board: Any) -> None:
    import pyarrow.fs  # noqa: F401  (what a segment imports first)
    import ray

    ray.get(board.ping.remote())  # connect to the board once
    time.sleep(0.5)  # overlap, so every GPU slot gets its own worker process


class EmulatedLauncher(Launcher):
    """Runs emulated segments in the manager's placement groups."""

    def __init__(
        self,
        manager: PlacementGroupManager,
        *,
        time_scale: float,
        truth: Mapping[tuple, float] | None = None,
        report_interval_s: float = 0.25,
    ) -> None:
        import ray

        if time_scale <= 0:
            raise ValueError(f"time_scale is {time_scale}; it must be > 0")
        self.manager = manager
        self.time_scale = float(time_scale)
        self.truth = dict(truth or {})
        self.report_interval_s = report_interval_s
        self.board = new_board()
        self._remote = ray.remote(num_cpus=0, max_retries=0)(run_emulated_segment)
        self._running: dict[Any, LaunchSpec] = {}
        self._by_task: dict[str, LaunchSpec] = {}

    def prepare(self) -> None:
        """Start one worker process per GPU on every node, so launches reuse warm workers.

        The warm-up runs inside placement groups, as segments do (Ray does
        not hand a worker that ran outside a placement group to a task in
        one), and Ray keeps up to a node's CPU count of idle workers; the
        emulated cluster gives each node as many CPUs as GPUs.
        """
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        warm = ray.remote(num_cpus=0)(_warm)
        refs, pgs = [], []
        for node in self.manager.ledger.nodes:
            g = self.manager.ledger.free(node)
            if g < 1:
                continue
            pg = placement_group(
                [{"GPU": float(g)}],
                strategy="STRICT_PACK",
                bundle_label_selector=[{"ray.io/node-id": str(self.manager.ledger.node_id(node))}],
            )
            pgs.append(pg)
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0)
            refs += [warm.options(num_gpus=1, scheduling_strategy=strategy).remote(self.board) for _ in range(g)]
        try:
            ray.get(refs)
        finally:
            for pg in pgs:
                remove_placement_group(pg)

    def launch(self, spec: LaunchSpec) -> None:
        if spec.step_time_s is None:
            raise ValueError(f"task {spec.task!r}: an emulated segment needs the profile's step time")
        from ray_saturn.sim.workload import truth_key

        key = truth_key(spec.task, spec.strategy, spec.gpus, len(spec.nodes), spec.gpu_type)
        true_step = self.truth.get(key, spec.step_time_s)
        wall_step = true_step * self.time_scale
        ref = self._remote.options(
            num_gpus=spec.gpus_per_node,
            scheduling_strategy=self.manager.bundle_strategy(spec.task, 0),
            name=f"saturn-emulated:{spec.task}:{spec.attempt}",
        ).remote(spec, self.board, wall_step, self.report_interval_s, spec.startup_s * self.time_scale)
        self._running[ref] = spec
        self._by_task[spec.task] = spec

    def stop(self, task: str) -> None:
        spec = self._by_task.get(task)
        if spec is not None:
            self.board.request_stop.remote(task, spec.attempt)

    def discard(self, task: str) -> None:
        import ray

        spec = self._by_task.pop(task, None)
        for ref, s in list(self._running.items()):
            if s is spec:
                del self._running[ref]
                ray.cancel(ref, force=True)

    def poll(self, timeout_s: float) -> list[LauncherEvent]:
        import ray

        refs = list(self._running)
        done: list[Any] = []
        if refs:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        elif timeout_s > 0:
            time.sleep(timeout_s)
        events: list[LauncherEvent] = drain_board(self.board)
        now = time.time()
        for ref in done:
            spec = self._running.pop(ref)
            if self._by_task.get(spec.task) is spec:
                del self._by_task[spec.task]
            try:
                out = ray.get(ref)
                events.append(Exited(spec.task, spec.attempt, now, out["status"], int(out["step"])))
            except Exception as exc:  # the worker died or raised
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                events.append(
                    Exited(
                        spec.task,
                        spec.attempt,
                        now,
                        "failed",
                        self.checkpointed_step(spec.checkpoint_dir),
                        f"{type(exc).__name__}: {reason}",
                    )
                )
        return events

    def checkpointed_step(self, checkpoint_dir: str) -> int:
        return latest_emulated_step(checkpoint_dir)

    def shutdown(self) -> None:
        import ray

        for ref in list(self._running):
            ray.cancel(ref, force=True)
        self._running.clear()
        self._by_task.clear()
