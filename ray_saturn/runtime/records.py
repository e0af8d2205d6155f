"""What a run records: per task a :class:`TaskRecord`, per run a :class:`DriverResult`.

A task's state is the control plane's (:class:`~ray_saturn.control.TaskProgress`:
queued, running, finished, failed) refined by what only the runtime knows
of its current :class:`~ray_saturn.control.Segment` (launching before its
first step, stopping while a move stops it). The record keeps no copy of
it: :attr:`TaskRecord.state` reads both.

Both round-trip through JSON (``state.json``, the driver actor's answer).

Example:
    >>> rec = TaskRecord("a", total_steps=10)
    >>> rec.state
    'queued'
    >>> TaskRecord.from_dict(rec.to_dict(0.0)).to_dict(0.0) == rec.to_dict(0.0)
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.control.state import Segment, TaskProgress, TaskState

__all__ = ["DriverResult", "RunOutcome", "TaskRecord"]

#: Segment statuses of a segment that has not ended.
OPEN_STATUSES = ("launching", "running", "stopping")


@dataclass
class TaskRecord:
    """What the driver knows of one task, in absolute steps (persisted in ``state.json``).

    ``progress`` is the control plane's state of the task (the driver hands
    in the controller's own object); ``waiting`` is true while a launch the
    plan asked for waits for its GPUs.
    """

    task: str
    total_steps: int
    progress: TaskProgress | None = None
    steps_done: int = 0
    checkpointed_step: int = 0
    step_time_s: float | None = None
    planned_step_time_s: float | None = None
    loss: float | None = None
    reason: str = ""
    attempts: int = 0
    segments: list[Segment] = field(default_factory=list)
    waiting: bool = False

    def __post_init__(self) -> None:
        if self.progress is None:
            self.progress = TaskProgress(self.task, self.total_steps, state=TaskState.QUEUED)

    @property
    def state(self) -> str:
        """queued, launching, running, stopping, finished or failed (see the module docstring)."""
        assert self.progress is not None
        if self.progress.state in (TaskState.FINISHED, TaskState.FAILED):
            return self.progress.state.value
        cur = self.current
        if cur is not None:
            return cur.status
        if self.segments and self.segments[-1].status == "finished":
            return "finished"  # its finish is on the way to the control plane
        return "launching" if self.waiting else "queued"

    @property
    def current(self) -> Segment | None:
        return self.segments[-1] if self.segments and self.segments[-1].end_s is None else None

    def eta_s(self, now: float) -> float | None:
        if self.state == "finished":
            return 0.0
        st = self.step_time_s or self.planned_step_time_s
        if st is None:
            return None
        return (self.total_steps - self.steps_done) * st

    def to_dict(self, now: float) -> dict[str, Any]:
        where = self.current or (self.segments[-1] if self.segments else None)
        eta = self.eta_s(now)
        return {
            "task": self.task,
            "state": self.state,
            "steps_done": self.steps_done,
            "total_steps": self.total_steps,
            "checkpointed_step": self.checkpointed_step,
            "strategy": where.strategy if where else None,
            "gpus": where.gpus if where else None,
            "nodes": list(where.nodes) if where else [],
            "step_time_s": self.step_time_s,
            "planned_step_time_s": self.planned_step_time_s,
            "loss": self.loss,
            "eta_s": None if eta is None else round(eta, 3),
            "reason": self.reason,
            "attempts": self.attempts,
            "segments": [s.to_dict() for s in self.segments],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TaskRecord:
        state = str(d.get("state", "queued"))
        total = int(d["total_steps"])
        known = {s.value for s in TaskState}
        progress = TaskProgress(
            str(d["task"]),
            total,
            state=TaskState(state) if state in known else TaskState.QUEUED,
            steps_done=int(d.get("steps_done", 0)),
            reason=d.get("reason") or None,
        )
        loss = d.get("loss")
        rec = cls(
            str(d["task"]),
            total,
            progress=progress,
            steps_done=int(d.get("steps_done", 0)),
            checkpointed_step=int(d.get("checkpointed_step", 0)),
            step_time_s=d.get("step_time_s"),
            planned_step_time_s=d.get("planned_step_time_s"),
            loss=None if loss is None else float(loss),
            reason=str(d.get("reason") or ""),
            attempts=int(d.get("attempts", 0)),
            segments=[Segment.from_dict(s) for s in d.get("segments", [])],
        )
        rec.waiting = state == "launching" and rec.current is None
        return rec


@dataclass(frozen=True)
class RunOutcome:
    """A run's state as the user is told it. The driver ends "finished" when nothing is left to
    run, so a run whose every task failed is reported "failed"; one where some failed says how many.

    Example:
        >>> o = RunOutcome.of("finished", {"a": "failed", "b": "finished"})
        >>> o.state, o.failed, o.headline
        ('finished', ('a',), 'finished with 1 of 2 tasks failed')
        >>> RunOutcome.of("finished", {"a": "failed"}).state
        'failed'
    """

    state: str | None
    failed: tuple[str, ...]
    tasks: int
    #: Whether ``state`` is "failed" because every task failed (the driver said "finished").
    every_task_failed: bool = False

    @classmethod
    def of(cls, driver_state: str | None, task_states: Mapping[str, str]) -> RunOutcome:
        failed = tuple(t for t, s in task_states.items() if s == "failed")
        if driver_state == "finished" and failed and len(failed) == len(task_states):
            return cls("failed", failed, len(task_states), True)
        return cls(driver_state, failed, len(task_states))

    @property
    def headline(self) -> str:
        """The state, with how many tasks failed when the run finished with some failed."""
        if self.state == "finished" and self.failed:
            return f"finished with {len(self.failed)} of {self.tasks} tasks failed"
        return str(self.state)


@dataclass
class DriverResult:
    """How a run ended: final state, makespans (driver-clock seconds) and per-task records."""

    state: str
    planned_makespan_s: float | None
    realised_makespan_s: float
    replans: int
    moves: int
    tasks: dict[str, TaskRecord]
    reason: str = ""

    @property
    def failed_tasks(self) -> list[str]:
        return [t for t, r in self.tasks.items() if r.state == "failed"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "planned_makespan_s": self.planned_makespan_s,
            "realised_makespan_s": round(self.realised_makespan_s, 3),
            "replans": self.replans,
            "moves": self.moves,
            "tasks": [r.to_dict(self.realised_makespan_s) for r in self.tasks.values()],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DriverResult:
        """The inverse of :meth:`to_dict` (e.g. the driver actor's answer)."""
        tasks = {r["task"]: TaskRecord.from_dict(r) for r in d["tasks"]}
        planned = d.get("planned_makespan_s")
        return cls(
            state=str(d["state"]),
            planned_makespan_s=None if planned is None else float(planned),
            realised_makespan_s=float(d["realised_makespan_s"]),
            replans=int(d["replans"]),
            moves=int(d["moves"]),
            tasks=tasks,
            reason=str(d.get("reason", "")),
        )
