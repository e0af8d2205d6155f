"""Live metrics for the Ray dashboard (and Prometheus/Grafana behind it).

Everything goes through :mod:`ray.util.metrics`, so the series appear on every
node's Prometheus endpoint (``ray start --metrics-export-port`` /
``ray.init(_metrics_export_port=...)``) with Ray's ``ray_`` prefix, e.g.
``ray_saturn_task_progress{run="sweep-1", task="gpt-w64-lr1e-3"}``.

Series (tags in brackets):

==============================  =======  ===========================================
name                            kind     meaning
==============================  =======  ===========================================
saturn_task_state               gauge    1 for the task's current state, 0 for the
                                         others [run, task, state]
saturn_task_progress            gauge    fraction of the task's steps done, 0..1
                                         [run, task]
saturn_task_steps_done          gauge    optimizer steps done [run, task]
saturn_task_gpus                gauge    GPUs the task holds now (0 when not
                                         running) [run, task]
saturn_task_step_time_s         gauge    last measured seconds per step [run, task]
saturn_run_planned_makespan_s   gauge    makespan of the current plan [run]
saturn_run_lower_bound_s        gauge    the plan's lower bound [run]
saturn_run_replans              counter  re-plans so far [run]
saturn_run_moves                counter  checkpoint-restart moves so far [run]
==============================  =======  ===========================================

:class:`RunMetrics` is the small API the runtime's driver calls; it works
in any Ray process (driver actor, Tune scheduler, script). Metric objects
are created lazily, once per process. Outside Ray (``ray.is_initialized()``
false) every call is a no-op, so the simulator and unit tests can hold one.

Example:
    >>> m = RunMetrics("sweep-1")
    >>> m.plan(planned_makespan_s=120.0, lower_bound_s=100.0)
    >>> m.task_state("gpt-a", "running", gpus=2)
    >>> m.task_progress("gpt-a", steps_done=50, total_steps=100, step_time_s=0.2)
    >>> m.replanned()
    >>> m.snapshot()["tasks"]["gpt-a"]["progress"]
    0.5
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.errors import SaturnError

__all__ = ["TASK_STATES", "MetricsError", "RunMetrics"]

logger = logging.getLogger(__name__)

#: The task states exported (the control plane's TaskState values).
TASK_STATES = ("pending", "queued", "running", "finished", "failed")


class MetricsError(SaturnError, ValueError):
    """A metrics update with a bad value (unknown state, negative number)."""


class _Series:
    """The process-wide ray.util.metrics objects (created once, on first use)."""

    _lock = threading.Lock()
    _made: dict[str, Any] | None = None

    @classmethod
    def get(cls) -> dict[str, Any]:
        with cls._lock:
            if cls._made is None:
                from ray.util.metrics import Counter, Gauge

                task = ("run", "task")
                cls._made = {
                    "state": Gauge(
                        "saturn_task_state", "1 for the task's current state, 0 otherwise", ("run", "task", "state")
                    ),
                    "progress": Gauge("saturn_task_progress", "fraction of the task's steps done (0..1)", task),
                    "steps": Gauge("saturn_task_steps_done", "optimizer steps done", task),
                    "gpus": Gauge("saturn_task_gpus", "GPUs the task holds now", task),
                    "step_time": Gauge("saturn_task_step_time_s", "last measured seconds per optimizer step", task),
                    "makespan": Gauge("saturn_run_planned_makespan_s", "makespan of the current plan (s)", ("run",)),
                    "bound": Gauge("saturn_run_lower_bound_s", "lower bound of the current plan (s)", ("run",)),
                    "replans": Counter("saturn_run_replans", "re-plans so far", ("run",)),
                    "moves": Counter("saturn_run_moves", "checkpoint-restart moves so far", ("run",)),
                }
            return cls._made


@dataclass
class _TaskView:
    state: str = "pending"
    steps_done: int = 0
    total_steps: int = 0
    gpus: int = 0
    step_time_s: float | None = None

    @property
    def progress(self) -> float:
        return 0.0 if self.total_steps <= 0 else min(1.0, self.steps_done / self.total_steps)


@dataclass
class RunMetrics:
    """Per-run and per-task series of one run, tagged ``run=<run>`` (and ``task=<name>``).

    The driver calls, in any order:

    - :meth:`plan` after every (re-)plan, with the plan's makespan and bound
      (or :meth:`plan_from` with a :class:`~ray_saturn.Plan`);
    - :meth:`replanned` once per re-plan, :meth:`moved` once per move;
    - :meth:`task_state` on every state change (with ``gpus`` held then);
    - :meth:`task_progress` on progress reports (any rate; cheap).

    ``snapshot()`` returns what was last recorded, for reports and tests.
    """

    run: str
    _tasks: dict[str, _TaskView] = field(default_factory=dict, init=False, repr=False)
    _run: dict[str, float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.run, str) or not self.run:
            raise MetricsError(f"run name {self.run!r} must be a non-empty string")
        self._run = {"planned_makespan_s": 0.0, "lower_bound_s": 0.0, "replans": 0, "moves": 0}

    # ------------------------------------------------------------------ helpers
    def _series(self) -> dict[str, Any] | None:
        try:
            import ray
        except ImportError:  # pragma: no cover - ray is a dependency
            return None
        if not ray.is_initialized():
            return None
        return _Series.get()

    def _task(self, task: str) -> _TaskView:
        if not isinstance(task, str) or not task:
            raise MetricsError(f"task name {task!r} must be a non-empty string")
        return self._tasks.setdefault(task, _TaskView())

    @staticmethod
    def _nonneg(value: float, what: str) -> float:
        if value is None or not (float(value) >= 0.0):
            raise MetricsError(f"{what} is {value!r}; it must be a number >= 0")
        return float(value)

    # --------------------------------------------------------------- run level
    def plan(self, *, planned_makespan_s: float, lower_bound_s: float) -> None:
        """Record the current plan's makespan and lower bound (seconds)."""
        ms = self._nonneg(planned_makespan_s, "planned makespan")
        lb = self._nonneg(lower_bound_s, "lower bound")
        self._run["planned_makespan_s"], self._run["lower_bound_s"] = ms, lb
        s = self._series()
        if s is not None:
            s["makespan"].set(ms, tags={"run": self.run})
            s["bound"].set(lb, tags={"run": self.run})

    def plan_from(self, plan: Any) -> None:
        """Record a :class:`~ray_saturn.Plan`'s makespan and lower bound."""
        self.plan(planned_makespan_s=plan.makespan_s, lower_bound_s=plan.lower_bound_s)

    def replanned(self, count: int = 1) -> None:
        """Count ``count`` re-plans."""
        n = int(self._nonneg(count, "re-plan count"))
        self._run["replans"] += n
        s = self._series()
        if s is not None and n:
            s["replans"].inc(n, tags={"run": self.run})

    def moved(self, count: int = 1) -> None:
        """Count ``count`` checkpoint-restart moves."""
        n = int(self._nonneg(count, "move count"))
        self._run["moves"] += n
        s = self._series()
        if s is not None and n:
            s["moves"].inc(n, tags={"run": self.run})

    # -------------------------------------------------------------- task level
    def task_state(self, task: str, state: str, *, gpus: int | None = None) -> None:
        """Record ``task``'s state (one of :data:`TASK_STATES`) and the GPUs it holds.

        ``gpus`` defaults to the last value while running and to 0 otherwise.
        """
        state = getattr(state, "value", state)
        if state not in TASK_STATES:
            raise MetricsError(f"task state {state!r} is not one of {', '.join(TASK_STATES)}")
        view = self._task(task)
        view.state = state
        if gpus is not None:
            view.gpus = int(self._nonneg(gpus, f"task {task!r} gpus"))
        elif state != "running":
            view.gpus = 0
        s = self._series()
        if s is not None:
            for st in TASK_STATES:
                s["state"].set(1.0 if st == state else 0.0, tags={"run": self.run, "task": task, "state": st})
            s["gpus"].set(view.gpus, tags={"run": self.run, "task": task})

    def task_progress(
        self, task: str, *, steps_done: int, total_steps: int, step_time_s: float | None = None
    ) -> None:
        """Record ``steps_done`` of ``total_steps`` and the last measured step time."""
        view = self._task(task)
        view.steps_done = int(self._nonneg(steps_done, f"task {task!r} steps_done"))
        view.total_steps = int(self._nonneg(total_steps, f"task {task!r} total_steps"))
        if step_time_s is not None:
            view.step_time_s = self._nonneg(step_time_s, f"task {task!r} step_time_s")
        s = self._series()
        if s is not None:
            tags = {"run": self.run, "task": task}
            s["progress"].set(view.progress, tags=tags)
            s["steps"].set(view.steps_done, tags=tags)
            if view.step_time_s is not None:
                s["step_time"].set(view.step_time_s, tags=tags)

    # ----------------------------------------------------------------- reading
    def snapshot(self) -> dict[str, Any]:
        """What was last recorded: ``{"run": {...}, "tasks": {name: {...}}}``."""
        return {
            "run": dict(self._run),
            "tasks": {
                name: {
                    "state": v.state,
                    "progress": v.progress,
                    "steps_done": v.steps_done,
                    "total_steps": v.total_steps,
                    "gpus": v.gpus,
                    "step_time_s": v.step_time_s,
                }
                for name, v in self._tasks.items()
            },
        }
