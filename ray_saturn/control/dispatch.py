"""The dispatcher: which queued tasks to launch now, and where.

The plan fixes, per task, a configuration, its nodes and a start time. The
dispatcher executes it *work-conserving*: a task keeps its planned
configuration and nodes and its place in each of its nodes' order, but it
starts as soon as its GPUs are free, which may be before its planned start
(tasks ahead ran shorter) or after it (they ran longer). Concretely, queued
tasks are visited in planned-start order; a task launches when every task
planned before it on any of its nodes has launched and its nodes have the
GPUs free now. The per-node orders come from a valid schedule, so they are
acyclic and the execution never deadlocks. With shares of one GPU the GPUs
are devices: a task launches when its nodes have devices with room for it
(:mod:`ray_saturn.control.occupancy`).

Example:
    >>> from ray_saturn.control.state import Placement
    >>> q = [PlannedTask("a", Placement("ddp", 2, ("node-0",)), 0.0, 10.0),
    ...      PlannedTask("b", Placement("ddp", 2, ("node-0",)), 10.0, 20.0)]
    >>> [x.task for x in dispatch(q, {"node-0": 2}, now_s=0.0)]
    ['a']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from ray_saturn.control.occupancy import Occupancy
from ray_saturn.control.state import Placement

__all__ = ["Launch", "PlannedTask", "Stop", "dispatch"]


@dataclass(frozen=True)
class PlannedTask:
    """A plan's assignment in absolute time (the controller's clock)."""

    task: str
    placement: Placement
    start_s: float
    end_s: float
    setup_s: float = 0.0


@dataclass(frozen=True)
class Launch:
    """Start ``task`` on ``placement`` now, resuming at ``steps_done``.

    ``setup_s`` is the time before its first step the plan allowed: the restart
    set-up of a moved task plus the configuration's start-up (profile column
    ``startup_s``); ``planned_start_s`` when the plan
    expected it to start; ``estimate_step_time_s`` the step time the plan
    assumed.
    """

    task: str
    placement: Placement
    steps_done: int
    setup_s: float
    planned_start_s: float
    estimate_step_time_s: float | None = None
    kind: str = "launch"

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "task": self.task,
            **self.placement.to_dict(),
            "steps_done": self.steps_done,
            "setup_s": self.setup_s,
            "planned_start_s": round(self.planned_start_s, 3),
        }


@dataclass(frozen=True)
class Stop:
    """Checkpoint and stop running ``task`` now (it was moved; it relaunches on ``target``)."""

    task: str
    reason: str
    target: Placement
    kind: str = "stop"

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "task": self.task,
            "reason": self.reason,
            "target": self.target.to_dict(),
        }


def dispatch(
    queue: Iterable[PlannedTask], free: Mapping[str, int] | Occupancy, *, now_s: float
) -> list[PlannedTask]:
    """The queued planned tasks to launch now (see the module docstring).

    ``queue`` holds the planned tasks that are waiting; ``free`` the free GPUs
    per node, or the device :class:`~ray_saturn.control.occupancy.Occupancy`
    of the running tasks (nodes missing from it are treated as gone). A task
    that names devices (shares of one GPU, plans of GPU types) is returned
    with the devices it gets now: its planned ones when they have room, else
    others of its planned nodes (:meth:`Occupancy.fit`).
    """
    occ = free if isinstance(free, Occupancy) else Occupancy(free)
    blocked: set[str] = set()
    out: list[PlannedTask] = []
    for p in sorted(queue, key=lambda p: (p.start_s, p.task)):
        nodes = p.placement.nodes
        if blocked.intersection(nodes):
            blocked.update(nodes)
            continue
        placed = occ.fit(p.placement)
        if placed is not None:
            occ.take(placed)
            out.append(p if placed == p.placement else replace(p, placement=placed))
        else:
            blocked.update(nodes)
    return out
