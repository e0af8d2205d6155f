"""Typed events the control plane reacts to.

Every event carries ``time_s``: the clock of whoever feeds the controller
(seconds of a simulated clock in the simulator, seconds since the run
started in the runtime). Events are immutable values; the controller keeps
them in its log with the decision they caused.

Example:
    >>> TaskFinished(time_s=12.0, task="bert-0").kind
    'task_finished'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from ray_saturn.spec import NodeSpec

__all__ = [
    "Event",
    "NodeAdded",
    "NodeLost",
    "TaskArrived",
    "TaskFailed",
    "TaskFinished",
    "TaskOffEstimate",
    "Tick",
]


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base class: something happened at ``time_s``."""

    time_s: float
    kind: ClassVar[str] = "event"

    def to_dict(self) -> dict:
        out = {"kind": self.kind}
        for k, v in self.__dict__.items():
            out[k] = v.name if isinstance(v, NodeSpec) else (dict(v) if isinstance(v, Mapping) else v)
        return out


@dataclass(frozen=True, kw_only=True)
class TaskArrived(Event):
    """``task`` (it must have rows in the controller's profile) may start from now on."""

    task: str
    kind: ClassVar[str] = "task_arrived"


@dataclass(frozen=True, kw_only=True)
class TaskFinished(Event):
    """``task`` ran all its steps, or its driver ended it as done (a Tune scheduler's early stop),
    also between segments (stopped for a move, not yet started again); its GPUs are free."""

    task: str
    kind: ClassVar[str] = "task_finished"


@dataclass(frozen=True, kw_only=True)
class TaskOffEstimate(Event):
    """``task`` runs at ``measured_step_time_s`` per step, off ``estimate_step_time_s`` by more
    than 10%, or by enough to move its end ``end_shift_s`` by more than 2% of the plan's horizon.

    The controller raises this itself from :meth:`Controller.report_progress`;
    a driver does not need to detect it.
    """

    task: str
    measured_step_time_s: float
    estimate_step_time_s: float
    end_shift_s: float = 0.0
    kind: ClassVar[str] = "task_off_estimate"


@dataclass(frozen=True, kw_only=True)
class TaskFailed(Event):
    """``task`` stopped with an error. ``steps_done`` is the progress it keeps
    (its last checkpoint); ``None`` keeps the last reported progress.
    ``final``: the caller will not run it again (e.g. Ray Tune gave up on the
    trial), so it is FAILED at once instead of re-queued."""

    task: str
    reason: str = ""
    steps_done: int | None = None
    final: bool = False
    kind: ClassVar[str] = "task_failed"


@dataclass(frozen=True, kw_only=True)
class NodeLost(Event):
    """``node`` is gone; its tasks were interrupted. ``steps_done`` maps each of
    them to the progress it keeps (last checkpoint); missing ones keep the last
    reported progress."""

    node: str
    steps_done: Mapping[str, int] = field(default_factory=dict)
    kind: ClassVar[str] = "node_lost"


@dataclass(frozen=True, kw_only=True)
class NodeAdded(Event):
    """``node`` joined (or came back) and its GPUs may be used from now on."""

    node: NodeSpec
    kind: ClassVar[str] = "node_added"


@dataclass(frozen=True, kw_only=True)
class GpusIdle(Event):
    """``gpus`` GPUs of ``node`` are free now and the plan puts no queued task on that node,
    while other tasks run on for at least ``busy_for_s`` more.

    The controller raises this one itself after launching what it can (the
    driver never sends it): the idle GPUs might shorten the run if a running
    task moved onto more of them, or the queue were ordered differently.
    """

    node: str
    gpus: int
    busy_for_s: float
    kind: ClassVar[str] = "gpus_idle"


@dataclass(frozen=True, kw_only=True)
class Tick(Event):
    """The clock reached a wake-up time the controller asked for (``next_wakeup_s``)."""

    kind: ClassVar[str] = "tick"
