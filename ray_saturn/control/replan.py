"""Re-planning: when to re-plan (policy objects) and what the solver is given.

:func:`build_replan_input` turns the controller's view of a run into a
solver input, with times relative to now:

- one profile row per original row of every task that is queued or running,
  with ``steps`` = the remaining steps and ``step_time_s`` = the measured one
  for the configuration a task runs on (its set-up and start-up still to go
  folded in), and for the other configurations the profiled time scaled by
  the task's measured slowdown (measured / profiled on the configuration it
  ran); start-up and checkpoint columns are kept (a segment launched on a
  row pays its ``startup_s``);
- the cluster of the nodes alive now;
- a :class:`~ray_saturn.context.PlanningContext` with every running task
  pinned where it runs, ``restart_s`` the cost of moving it besides the
  target's start-up (the stop, plus its row's checkpoint save and load), and
  ``movable`` false when the policy does not move running tasks; and the
  plan being followed as the incumbent, so the solver starts from it.

Re-planning policies (:class:`ReplanPolicy`) only say *when* to re-plan
beyond the re-plans every policy must make (a task arrived, failed or lost
its node: those tasks are not in the current plan). All of them call the
same solver through the controller:

- ``saturn-static`` (and every baseline solver under its own name, e.g.
  ``fifo-whole-node``): keeps its plan; tasks keep their planned configuration
  and per-node order but start as soon as their GPUs are free; never moves a
  running task;
- ``saturn-replan``: also re-plans on the events that make the plan stale:
  a task runs more than 10% off its estimate, or off enough to move its end
  by more than 2% of the plan's horizon (once found off, its measured rate
  is the estimate, and it re-plans again only when both hold); a task
  finishes away from its planned end by more than 10% of its planned run
  or 2% of the plan's horizon while other tasks wait to start; GPUs fall
  idle with no queued task planned on their node while other tasks run on
  (:class:`~ray_saturn.control.events.GpusIdle`); a node is added. It may move running tasks;
- ``saturn-periodic``: also re-plans every ``interval_s`` (as the original
  Saturn did); may move running tasks.

Example:
    >>> get_replan_policy("saturn-replan").allows_moves
    True
    >>> get_replan_policy("fifo-whole-node").solver_policy
    'fifo-whole-node'
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from ray_saturn.context import Incumbent, PlanningContext, RunningTask
from ray_saturn.control.events import Event, GpusIdle, NodeAdded, TaskFinished, TaskOffEstimate, Tick
from ray_saturn.control.state import TaskProgress, TaskState
from ray_saturn.errors import SaturnError
from ray_saturn.profile_table import Config, ProfileTable
from ray_saturn.spec import ClusterSpec

__all__ = [
    "EventReplan",
    "PeriodicReplan",
    "ReplanInput",
    "ReplanPolicy",
    "ReplanView",
    "StaticReplan",
    "build_replan_input",
    "get_replan_policy",
    "replan_policy_names",
]

#: A task more than this far off its estimate (relative) is reported off-estimate.
OFF_ESTIMATE = 0.10
#: A finish this far from its planned end, relative to the plan's horizon, makes the plan stale.
HORIZON_DRIFT = 0.02


@dataclass(frozen=True)
class ReplanView:
    """What a policy sees of the run when it is asked about an event (absolute times).

    ``task`` is the event's task, if any, and ``planned_end_s`` its end in the
    current plan; ``plan_made_s`` and ``plan_end_s`` are when the current plan
    was made and when it ends (its makespan), ``None`` before the first plan;
    ``queued`` how many tasks wait to start.
    """

    task: TaskProgress | None = None
    planned_end_s: float | None = None
    plan_made_s: float | None = None
    plan_end_s: float | None = None
    queued: int = 0


@dataclass(frozen=True)
class ReplanInput:
    """What the solver is given at a re-plan; times relative to ``now_s``."""

    now_s: float
    profile: ProfileTable
    cluster: ClusterSpec
    context: PlanningContext
    tasks: tuple[str, ...]


def _scaled(c: Config, steps: int, step_time: float | None) -> Config:
    return replace(c, step_time_s=step_time if c.feasible else None, steps=steps)


def build_replan_input(
    profile: ProfileTable,
    progress: Mapping[str, TaskProgress],
    cluster: ClusterSpec,
    now_s: float,
    *,
    restart_s: float,
    movable: bool,
    only: Collection[str] | None = None,
    incumbent: Incumbent | None = None,
    pinned: Collection[str] = (),
    area_share: Mapping[str, float] | None = None,
) -> ReplanInput | None:
    """The solver input for the queued and running tasks at ``now_s`` (``None`` if there are none).

    ``profile`` is the original profile (total steps, profiled step times);
    ``cluster`` the nodes alive now; ``only``, if given, limits the queued
    tasks to those named (a rolling-horizon window; running tasks are always in);
    ``incumbent`` the plan being followed, passed on to the solver;
    ``pinned`` running tasks that stay where they run even when ``movable``;
    ``area_share`` the context's per-task share of the arrival price (tasks of the input only).

    Example:
        >>> prof = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1,
        ...                                 "step_time_s": 1.0, "steps": 10}])
        >>> p = TaskProgress("a", 10, state=TaskState.QUEUED, steps_done=4, arrived_s=0.0)
        >>> inp = build_replan_input(prof, {"a": p}, ClusterSpec.uniform(1, 1), 5.0,
        ...                          restart_s=2.0, movable=True)
        >>> inp.profile.get("a", "ddp", 1).steps
        6
    """
    active = [
        p
        for p in progress.values()
        if p.state is TaskState.RUNNING or (p.state is TaskState.QUEUED and (only is None or p.task in only))
    ]
    if not active:
        return None
    order = {t: i for i, t in enumerate(profile.tasks)}
    active.sort(key=lambda p: (p.arrived_s if p.arrived_s is not None else 0.0, order[p.task]))
    alive = set(cluster.names)
    rows: list[Config] = []
    running: list[RunningTask] = []
    for p in active:
        done = p.steps_at(now_s) if p.state is TaskState.RUNNING else p.steps_done
        remaining = max(1, p.total_steps - done)
        current = p.placement if p.state is TaskState.RUNNING else None
        for c in profile.configs(p.task):
            if not c.feasible:
                rows.append(_scaled(c, remaining, None))
                continue
            st = c.step_time_s * p.slowdown
            if current is not None and (*c.key[1:], c.gpu_type) == current.config_key:
                st = p.step_time_s() or st
                setup_left = p.setup_left_s(now_s)
                if setup_left > 0:
                    st = (setup_left + remaining * st) / remaining
            rows.append(_scaled(c, remaining, st))
        if current is not None:
            if not set(current.nodes) <= alive:
                raise SaturnError(f"task {p.task!r} is running on a node that is gone; report NodeLost first")
            here = profile.get(p.task, *current.config_key)
            running.append(
                RunningTask(
                    p.task,
                    current.strategy,
                    current.gpus,
                    current.nodes,
                    # stop + save + load; the target's start-up is in its row
                    restart_s=restart_s + here.move_cost_s,
                    movable=movable and p.setup_left_s(now_s) <= 0 and p.task not in pinned,
                    gpu_type=current.gpu_type,
                    devices=current.device_map(),  # kept in place, it keeps the devices it holds
                )
            )
    table = ProfileTable.from_configs(rows, source=f"{profile.source}@{now_s:.0f}s")
    names = {p.task for p in active}
    share = {t: v for t, v in (area_share or {}).items() if t in names}
    ctx = PlanningContext(running=tuple(running), incumbent=incumbent, area_share=share)
    return ReplanInput(now_s, table, cluster, ctx, tuple(p.task for p in active))


class ReplanPolicy(ABC):
    """When to re-plan, besides the re-plans every policy makes.

    ``solver_policy`` is the registered solver policy called at every plan
    (``saturn`` or a baseline); ``allows_moves`` whether running tasks may be
    moved (checkpoint-restart) by a re-plan.
    """

    name: str
    solver_policy: str = "saturn"
    allows_moves: bool = False
    #: how far off its estimate (relative) a task's measured step time may be
    tolerance: float = OFF_ESTIMATE
    #: how far a task's end may move, relative to the plan's horizon
    horizon_drift: float = HORIZON_DRIFT

    @abstractmethod
    def wants_replan(self, event: Event, view: ReplanView) -> str | None:
        """The reason to re-plan on ``event`` (``None``: keep the plan)."""

    def off_estimate(
        self, relative_error: float, end_shift_s: float, horizon_s: float, *, measured_estimate: bool = False
    ) -> bool:
        """Whether a task whose measured step time is ``relative_error`` off its estimate (beyond
        the measurement's noise), moving its end by ``end_shift_s``, is off its estimate: more than
        ``tolerance``, or, against the plan's own estimate, by more than ``horizon_drift`` x
        ``horizon_s``. Against an estimate that is itself a measurement (``measured_estimate``:
        the task was found off once already) it must be both, so a short task's jitter around
        its measured rate, which moves no end by much, re-plans no more. The controller raises
        :class:`TaskOffEstimate` then."""
        beyond_tolerance = relative_error > self.tolerance
        moves_the_end = end_shift_s > self.horizon_drift * horizon_s
        if measured_estimate:
            return beyond_tolerance and moves_the_end
        return beyond_tolerance or moves_the_end

    def next_tick_s(self, last_plan_s: float, horizon_s: float) -> float | None:
        """The next time the controller should wake up to re-plan (``None``: never)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, solver_policy={self.solver_policy!r})"


class StaticReplan(ReplanPolicy):
    """Keep the plan: only the re-plans every policy must make; never move a running task."""

    allows_moves = False

    def __init__(self, solver_policy: str = "saturn", name: str | None = None) -> None:
        self.solver_policy = solver_policy
        self.name = name or (solver_policy if solver_policy != "saturn" else "saturn-static")

    def wants_replan(self, event, view):
        return None


class EventReplan(ReplanPolicy):
    """Re-plan on the events that make the plan stale (see the module docstring).

    ``tolerance``: how far off its estimate (relative) a task may run, and how
    far from its planned end (relative to its planned run) it may finish;
    ``horizon_drift``: how far from its planned end a task may finish,
    relative to the plan's horizon (a long task's 10% can be a large hole).
    """

    name = "saturn-replan"
    allows_moves = True

    def __init__(
        self, solver_policy: str = "saturn", tolerance: float = OFF_ESTIMATE, horizon_drift: float = HORIZON_DRIFT
    ) -> None:
        if not tolerance > 0 or not horizon_drift > 0:
            raise SaturnError(f"tolerance {tolerance} and horizon_drift {horizon_drift} must be > 0")
        self.solver_policy = solver_policy
        self.tolerance = tolerance
        self.horizon_drift = horizon_drift

    def wants_replan(self, event, view):
        if isinstance(event, TaskOffEstimate):
            return (
                f"{event.task} runs at {event.measured_step_time_s:.3g} s/step, "
                f"estimate {event.estimate_step_time_s:.3g} (end {event.end_shift_s:.0f} s off)"
            )
        if isinstance(event, NodeAdded):
            return f"node {event.node.name} added"
        if isinstance(event, GpusIdle):
            return f"{event.gpus} GPU(s) idle on {event.node}, others busy {event.busy_for_s:.0f} s more"
        task, planned_end = view.task, view.planned_end_s
        if isinstance(event, TaskFinished) and view.queued == 0:
            return None  # nothing waits for its GPUs; running tasks that could use them raise GpusIdle
        if isinstance(event, TaskFinished) and task is not None and planned_end is not None and task.segments:
            off = event.time_s - planned_end
            allowed = self.tolerance * max(1e-9, planned_end - task.segments[0].start_s)
            if view.plan_made_s is not None and view.plan_end_s is not None:
                allowed = min(allowed, self.horizon_drift * max(1e-9, view.plan_end_s - view.plan_made_s))
            if abs(off) > allowed:
                return f"{event.task} finished {off:+.0f} s from its planned end"
        return None


class PeriodicReplan(ReplanPolicy):
    """Re-plan every ``interval_s`` (default: 1/10 of the longest plan's makespan so far: the first
    plan's, unless tasks arrived since)."""

    name = "saturn-periodic"
    allows_moves = True

    def __init__(self, solver_policy: str = "saturn", interval_s: float | None = None, fraction: float = 0.1) -> None:
        if interval_s is not None and interval_s <= 0:
            raise SaturnError(f"re-planning interval is {interval_s} s; give a positive number")
        self.solver_policy = solver_policy
        self.interval_s = interval_s
        self.fraction = fraction

    def wants_replan(self, event, view):
        return "periodic" if isinstance(event, Tick) else None

    def next_tick_s(self, last_plan_s, horizon_s):
        interval = self.interval_s or max(1e-6, self.fraction * horizon_s)
        return last_plan_s + interval


_NAMED = {
    "saturn-static": StaticReplan,
    "saturn-replan": EventReplan,
    "saturn-periodic": PeriodicReplan,
}


def replan_policy_names() -> list[str]:
    """The saturn re-planning policies and every registered solver policy (as a static baseline)."""
    from ray_saturn.solver import policy_names

    return list(_NAMED) + [p for p in policy_names() if p != "saturn"]


def get_replan_policy(name: str, **kwargs) -> ReplanPolicy:
    """A re-planning policy by name: ``saturn-static``, ``saturn-replan``, ``saturn-periodic``,
    or a solver policy's name (run as a static plan, e.g. ``fifo-whole-node``)."""
    if name in _NAMED:
        return _NAMED[name](**kwargs)
    if name in replan_policy_names():
        if kwargs:
            raise SaturnError(f"policy {name!r} takes no options (got {', '.join(kwargs)})")
        return StaticReplan(solver_policy=name)
    raise SaturnError(f"unknown policy {name!r}; choose from: {', '.join(replan_policy_names())}")
