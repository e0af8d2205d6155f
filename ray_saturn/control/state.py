"""What the control plane knows about each task: its state and its progress.

A task moves through these states::

    PENDING --arrive--> QUEUED --launch--> RUNNING --finish--> FINISHED
                          ^                   |
                          +--- move / fail ---+        (fails too often) --> FAILED

- PENDING: in the profile but not arrived yet (never planned).
- QUEUED: arrived, waiting for its planned GPUs (possibly after a move or a
  failure, with the progress it kept).
- RUNNING: on a configuration and nodes (a :class:`Segment`).
- FINISHED / FAILED: done; FAILED carries the reason.

Progress is what the driver reports (steps done, measured seconds per step);
between reports it is extrapolated with the measured (else planned) step
time, so a re-plan at any instant sees a current estimate.

Example:
    >>> p = TaskProgress("a", total_steps=100)
    >>> p.state
    <TaskState.PENDING: 'pending'>
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.stepping import steps_done_by

__all__ = ["RECENT_REPORTS", "Placement", "Segment", "TaskProgress", "TaskState"]

#: How many recent step-time reports a task's measured step time is the mean of.
RECENT_REPORTS = 8


class TaskState(str, enum.Enum):
    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


Devices = tuple[tuple[str, tuple[tuple[int, float], ...]], ...]


@dataclass(frozen=True)
class Placement:
    """A configuration on concrete nodes: ``gpus`` split evenly over ``nodes``.

    ``gpus`` may be a share 1/k of one device (one node). ``gpu_type`` is the
    GPU type of the profile row it runs (``None``: the untyped row);
    ``devices`` per node the devices it holds and its share of each (``None``:
    whole GPUs somewhere on its nodes). Give ``devices`` as a mapping
    ``{node: [(device, share), ...]}``; it is kept as a tuple (hashable) and
    read back with :meth:`device_map`. Two placements with the same
    configuration and nodes are the same placement whatever their devices
    (:meth:`same_config`).

    Example:
        >>> p = Placement("single", 0.25, ("node-0",), devices={"node-0": [(1, 0.25)]})
        >>> p.per_node, p.config_key, p.device_map()
        (0.25, ('single', 0.25, 1, None), {'node-0': ((1, 0.25),)})
    """

    strategy: str
    gpus: int | float
    nodes: tuple[str, ...]
    gpu_type: str | None = None
    devices: Devices | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if self.devices is not None:
            items = self.devices.items() if isinstance(self.devices, Mapping) else self.devices
            object.__setattr__(
                self, "devices", tuple(sorted((str(n), tuple((int(d), float(x)) for d, x in v)) for n, v in items))
            )

    @property
    def is_share(self) -> bool:
        return self.gpus < 1

    @property
    def per_node(self) -> int | float:
        return self.gpus if self.gpus < 1 else int(self.gpus) // len(self.nodes)

    @property
    def config_key(self) -> tuple[str, int | float, int, str | None]:
        """(strategy, gpus, node count, GPU type): the profile row, independent of the node names."""
        return (self.strategy, self.gpus, len(self.nodes), self.gpu_type)

    def device_map(self) -> dict[str, tuple[tuple[int, float], ...]] | None:
        """``devices`` as ``{node: ((device, share), ...)}`` (``None`` when not named)."""
        return None if self.devices is None else dict(self.devices)

    def same_config(self, other: Placement) -> bool:
        """The same configuration on the same nodes (devices aside)."""
        return (self.config_key, self.nodes) == (other.config_key, other.nodes)

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"strategy": self.strategy, "gpus": self.gpus, "nodes": list(self.nodes)}
        if self.gpu_type is not None:
            out["gpu_type"] = self.gpu_type
        if self.devices is not None:
            out["devices"] = {n: [[d, x] for d, x in v] for n, v in self.devices}
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Placement:
        """Read :meth:`to_dict`'s form (raises ``KeyError``/``TypeError``/``ValueError`` when malformed)."""
        g = float(d["gpus"])
        devices = d.get("devices")
        return cls(
            str(d["strategy"]),
            g if g < 1 else int(g),
            tuple(str(n) for n in d.get("nodes") or ()),
            None if d.get("gpu_type") is None else str(d["gpu_type"]),
            None if devices is None else {str(n): [(int(x), float(y)) for x, y in v] for n, v in devices.items()},
        )


@dataclass
class Segment:
    """One stretch of a task on one placement, from ``start_s`` to ``end_s``.

    The one segment type of the project: the controller records what it
    launched (``setup_s``: the restart set-up the plan allowed before the
    steps resume), the runtime's driver what really ran (``first_step_s``:
    when training began; ``status``, ``attempt``, ``reason``), the simulator
    what it simulated, and reports read them back (:meth:`from_dict`).
    ``steps_start`` / ``steps_end`` are absolute step counts of the task.

    ``status``: ``launching`` (no step yet), ``running``, ``stopping`` (a
    move asked it to stop), then ``finished``, ``stopped``, ``failed`` or
    ``interrupted`` (its node or its driver went away).

    Example:
        >>> s = Segment(Placement("ddp", 2, ("node-0",)), 5.0, end_s=9.0)
        >>> s.strategy, s.gpus, s.nodes, Segment.from_dict(s.to_dict()) == s
        ('ddp', 2, ('node-0',), True)
    """

    placement: Placement
    start_s: float
    setup_s: float = 0.0
    end_s: float | None = None
    steps_start: int = 0
    steps_end: int | None = None
    first_step_s: float | None = None
    status: str = "running"
    attempt: int = 0
    reason: str = ""

    @property
    def strategy(self) -> str:
        return self.placement.strategy

    @property
    def gpus(self) -> int:
        return self.placement.gpus

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.placement.nodes

    @property
    def open(self) -> bool:
        """True while the segment has not ended."""
        return self.end_s is None

    def to_dict(self) -> dict:
        out = self.placement.to_dict()
        out.update(
            start_s=self.start_s,
            end_s=self.end_s,
            first_step_s=self.first_step_s,
            steps_start=self.steps_start,
            steps_end=self.steps_end,
            status=self.status,
            attempt=self.attempt,
            reason=self.reason,
        )
        if self.setup_s:
            out["setup_s"] = self.setup_s
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Segment:
        """Read :meth:`to_dict`'s form (also the older ``launch_s`` key for ``start_s``).

        Raises ``KeyError``/``TypeError``/``ValueError`` on a malformed segment.
        """
        start = d["start_s"] if "start_s" in d else d["launch_s"]

        def opt_float(key: str) -> float | None:
            v = d.get(key)
            return None if v is None else float(v)

        end = d.get("steps_end")
        return cls(
            Placement.from_dict(d),
            float(start),
            setup_s=float(d.get("setup_s") or 0.0),
            end_s=opt_float("end_s"),
            steps_start=int(d.get("steps_start") or 0),
            steps_end=None if end is None else int(end),
            first_step_s=opt_float("first_step_s"),
            status=str(d.get("status", "running")),
            attempt=int(d.get("attempt") or 0),
            reason=str(d.get("reason") or ""),
        )


@dataclass
class TaskProgress:
    """One task as the controller sees it.

    ``estimate_step_time_s`` is the step time the current plan assumed for the
    running configuration; ``measured_step_time_s`` the latest measurement on
    it (``None`` until the driver reports one).
    """

    task: str
    total_steps: int
    state: TaskState = TaskState.PENDING
    steps_done: int = 0
    reported_at_s: float = 0.0
    arrived_s: float | None = None
    finished_s: float | None = None
    placement: Placement | None = None
    estimate_step_time_s: float | None = None
    measured_step_time_s: float | None = None
    #: measured / profiled step time of the last measured configuration (1.0 if none yet)
    slowdown: float = 1.0
    #: true once the estimate is a measurement (it replaced the plan's after a drift or a re-plan)
    estimate_measured: bool = False
    #: the last reports' step times on the running configuration (the measurement is their mean)
    recent_step_times: list[float] = field(default_factory=list)
    failures: int = 0
    reason: str | None = None
    segments: list[Segment] = field(default_factory=list)

    def observe_step_time(self, step_time_s: float) -> tuple[float, float]:
        """Record one reported step time; returns the measured step time (the mean of the last
        :data:`RECENT_REPORTS` reports on this configuration) and its standard error (0 with
        one report)."""
        xs = self.recent_step_times
        xs.append(step_time_s)
        del xs[:-RECENT_REPORTS]
        self.measured_step_time_s = statistics.fmean(xs)
        se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
        return self.measured_step_time_s, se

    def forget_measurements(self) -> None:
        """A new configuration: nothing measured on it yet."""
        self.measured_step_time_s = None
        self.recent_step_times.clear()

    @property
    def remaining_steps(self) -> int:
        return max(0, self.total_steps - self.steps_done)

    @property
    def can_finish(self) -> bool:
        """Whether a ``TaskFinished`` may end it: it runs, or it ran and waits between segments (its
        driver may end it there as done, e.g. a Tune scheduler's early stop of a trial paused for a move)."""
        return self.state is TaskState.RUNNING or (self.state is TaskState.QUEUED and bool(self.segments))

    @property
    def running_segment(self) -> Segment | None:
        if self.state is TaskState.RUNNING and self.segments:
            return self.segments[-1]
        return None

    def step_time_s(self) -> float | None:
        """Best current estimate of seconds per step on the running configuration."""
        return self.measured_step_time_s if self.measured_step_time_s is not None else self.estimate_step_time_s

    def steps_at(self, now_s: float) -> int:
        """Steps done by ``now_s``, extrapolated from the last report (never past the total)."""
        seg = self.running_segment
        st = self.step_time_s()
        if seg is None or st is None or st <= 0:
            return self.steps_done
        since_s = max(self.reported_at_s, seg.start_s + seg.setup_s)
        return self.steps_done + steps_done_by(now_s, since_s, st, self.total_steps - self.steps_done)

    def setup_left_s(self, now_s: float) -> float:
        """Restart set-up still to go at ``now_s`` (0 when not restarting)."""
        seg = self.running_segment
        if seg is None:
            return 0.0
        return max(0.0, seg.start_s + seg.setup_s - now_s)

    def time_left_s(self, now_s: float) -> float:
        """Seconds of set-up and steps still to run at ``now_s``, at the current step-time estimate."""
        st = self.step_time_s() or 0.0
        return self.setup_left_s(now_s) + max(0, self.total_steps - self.steps_at(now_s)) * st

    def to_dict(self) -> dict:
        return {
            "task": self.task,
            "state": self.state.value,
            "steps_done": self.steps_done,
            "total_steps": self.total_steps,
            "failures": self.failures,
            "reason": self.reason,
            "segments": [s.to_dict() for s in self.segments],
        }
