"""A launcher and a placement manager without Ray, on a stepped clock: for testing the driver.

:class:`FakeLauncher` runs every segment at a true step time you choose
(default: the profile's), checkpoints every ``checkpoint_every`` steps, can
be told to fail a task (per strategy or always), and advances its clock by
the ``timeout_s`` of each :meth:`FakeLauncher.poll`, so a whole run is
stepped in milliseconds. :class:`LedgerManager` is the placement manager's
ledger without placement groups.

Example:
    >>> from ray_saturn import ClusterSpec
    >>> launcher = FakeLauncher(launch_latency_s=1.0)
    >>> launcher.launch(LaunchSpec("a", 0, "ddp", 1, ("node-0",), 10, "ckpt/a", 5, step_time_s=1.0))
    >>> [type(e).__name__ for e in launcher.poll(2.0)]
    ['Started', 'Progress']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ray_saturn.runtime.launcher import (
    Exited,
    Launcher,
    LauncherEvent,
    LaunchSpec,
    Progress,
    Started,
)
from ray_saturn.runtime.ledger import GpuLedger, Reservation
from ray_saturn.runtime.pg_manager import NodeChanges
from ray_saturn.spec import ClusterSpec, NodeSpec
from ray_saturn.stepping import steps_done_by

__all__ = ["FakeLauncher", "LedgerManager"]


@dataclass
class _Segment:
    spec: LaunchSpec
    launched: float
    step0: int
    step_time: float
    started: bool = False
    stop_at: float | None = None
    fail_reason: str | None = None
    fail_at_step: int | None = None
    latency: float = 0.0


class FakeLauncher(Launcher):
    """Segments that advance on the launcher's own clock.

    Args:
        true_step_time: seconds per step for a spec (default: ``spec.step_time_s``).
        launch_latency_s: time from launch to the first step, on top of the spec's ``startup_s``.
        fail: ``fail(spec) -> reason or None``; a segment with a reason fails
            after its first step (at ``fail_after_steps``).
        reuse_latency_s: ``None`` (default): no worker reuse. Else a finished segment's workers park
            (as the TorchTrainer launcher's do) and a launch that claims them reaches its first step
            after this many seconds instead of its start-up; :attr:`released` counts the groups let go.
    """

    def __init__(
        self,
        *,
        true_step_time: Callable[[LaunchSpec], float] | None = None,
        launch_latency_s: float = 1.0,
        fail: Callable[[LaunchSpec], str | None] | None = None,
        fail_after_steps: int = 1,
        reuse_latency_s: float | None = None,
    ) -> None:
        self.clock = 0.0
        self.reuse_latency_s = reuse_latency_s
        self.parked: list[tuple[tuple[str, ...], int | float]] = []  # (nodes, GPUs per node) of parked groups
        self.reused: list[str] = []  # tasks launched onto parked workers
        self.released = 0
        self._claims: dict[str, tuple[tuple[str, ...], int | float]] = {}
        self.true_step_time = true_step_time or (lambda s: float(s.step_time_s or 1.0))
        self.launch_latency_s = launch_latency_s
        self.fail = fail or (lambda s: None)
        self.fail_after_steps = fail_after_steps
        self.checkpoints: dict[str, int] = {}
        self.launched: list[LaunchSpec] = []
        self._running: dict[str, _Segment] = {}

    def now(self) -> float:
        return self.clock

    def claim_parked(self, task: str, nodes: tuple[str, ...], gpus_per_node: int | float) -> bool:
        shape = (tuple(sorted(nodes)), gpus_per_node)
        if self.reuse_latency_s is None or shape not in self.parked:
            return False
        self.parked.remove(shape)
        self._claims[task] = shape
        return True

    def release_parked(self) -> None:
        self.released += len(self.parked) + len(self._claims)
        self.parked.clear()
        self._claims.clear()

    def launch(self, spec: LaunchSpec) -> None:
        step0 = self.checkpoints.get(spec.checkpoint_dir, 0)
        latency = self.launch_latency_s + spec.startup_s
        if self._claims.pop(spec.task, None) is not None:
            latency = float(self.reuse_latency_s or 0.0)
            self.reused.append(spec.task)
        seg = _Segment(spec, self.clock, step0, self.true_step_time(spec), latency=latency)
        reason = self.fail(spec)
        if reason:
            seg.fail_reason = reason
            seg.fail_at_step = min(spec.target_step, step0 + self.fail_after_steps)
        self._running[spec.task] = seg
        self.launched.append(spec)

    def stop(self, task: str) -> None:
        seg = self._running.get(task)
        if seg is not None and seg.stop_at is None:
            seg.stop_at = self.clock

    def discard(self, task: str) -> None:
        self._running.pop(task, None)

    def kill(self, task: str, reason: str = "worker killed") -> None:
        """Make the running segment of ``task`` fail now (a killed worker)."""
        seg = self._running.get(task)
        if seg is not None:
            seg.fail_reason = reason
            seg.fail_at_step = self._step(seg, self.clock)

    def checkpointed_step(self, checkpoint_dir: str) -> int:
        return self.checkpoints.get(checkpoint_dir, 0)

    def _step(self, seg: _Segment, t: float) -> int:
        # step0 + 1 + i ends at launched + latency + i * step_time (as _time_of computes it)
        first_s = seg.launched + seg.latency
        if t < first_s:
            return seg.step0
        left = seg.spec.target_step - seg.step0 - 1
        return min(seg.spec.target_step, seg.step0 + 1 + steps_done_by(t, first_s, seg.step_time, max(left, 0)))

    def _time_of(self, seg: _Segment, step: int) -> float:
        return seg.launched + seg.latency + (step - seg.step0 - 1) * seg.step_time

    def poll(self, timeout_s: float) -> list[LauncherEvent]:
        t_end = self.clock + max(timeout_s, 0.0)
        # Stop at the first segment end inside the window, so events come in time order.
        for seg in self._running.values():
            end_step = seg.fail_at_step if seg.fail_reason else seg.spec.target_step
            t_done = self._time_of(seg, end_step)
            if seg.stop_at is not None:
                t_done = min(t_done, seg.stop_at)
            t_end = min(t_end, max(t_done, self.clock))
        self.clock = t_end
        events: list[LauncherEvent] = []
        for task, seg in list(self._running.items()):
            step = self._step(seg, self.clock)
            every = max(1, seg.spec.checkpoint_every)
            ckpt = step if step == seg.spec.target_step else step - step % every
            if ckpt > self.checkpoints.get(seg.spec.checkpoint_dir, 0):
                self.checkpoints[seg.spec.checkpoint_dir] = ckpt
            if step > seg.step0 and not seg.started:
                seg.started = True
                events.append(Started(task, seg.spec.attempt, self.clock, step))
            if seg.stop_at is not None:
                self.checkpoints[seg.spec.checkpoint_dir] = step
                events.append(Exited(task, seg.spec.attempt, self.clock, "stopped", step))
                del self._running[task]
            elif seg.fail_reason and step >= (seg.fail_at_step or 0):
                events.append(
                    Exited(
                        task,
                        seg.spec.attempt,
                        self.clock,
                        "failed",
                        self.checkpoints.get(seg.spec.checkpoint_dir, 0),
                        seg.fail_reason,
                    )
                )
                del self._running[task]
            elif step >= seg.spec.target_step:
                events.append(Exited(task, seg.spec.attempt, self.clock, "finished", step))
                del self._running[task]
                if self.reuse_latency_s is not None and seg.spec.gpus >= 1:
                    self.parked.append((tuple(sorted(seg.spec.nodes)), seg.spec.gpus_per_node))
            elif seg.started:
                events.append(Progress(task, seg.spec.attempt, self.clock, step, seg.step_time))
        return events


class LedgerManager:
    """The placement manager's interface on a bare ledger (no Ray): holds are ready at once."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.ledger = GpuLedger(cluster)
        self._lost: list[str] = []
        self._added: list[NodeSpec] = []

    def reserve(
        self, task: str, nodes: tuple[str, ...], gpus_per_node: int | float, *, devices=None, gpu_type=None,
        hold: bool = True,
    ) -> Reservation:
        return self.ledger.reserve(task, nodes, gpus_per_node, devices=devices, gpu_type=gpu_type)

    def is_ready(self, task: str) -> bool:
        return self.ledger.holder(task) is not None

    def release(self, task: str) -> Reservation | None:
        return self.ledger.release(task)

    def release_all(self) -> None:
        for r in self.ledger.reservations():
            self.ledger.release(r.task)

    def lose_node(self, node: str) -> None:
        """Test hook: the next :meth:`sync_nodes` reports ``node`` lost."""
        self._lost.append(node)

    def add_node(self, node: NodeSpec) -> None:
        self._added.append(node)

    def sync_nodes(self) -> NodeChanges:
        changes = NodeChanges()
        for n in self._lost:
            changes.dropped += self.ledger.remove_node(n)
            changes.lost.append(n)
        for spec in self._added:
            self.ledger.add_node(spec)
            changes.added.append(spec)
        self._lost, self._added = [], []
        return changes
