"""The controller: one object that a driver loop steps one event at a time.

It owns the task states, the current plan and a GPU ledger, and composes the
pieces of this package: re-planning policy (when), re-planning input and
solver (what), move decisions (whether to move running tasks) and the
dispatcher (what to launch now). It has no clock and no Ray: every call
carries the time, and it answers with typed actions the caller executes.

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> prof = ProfileTable.from_rows([
    ...     {"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10},
    ...     {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10},
    ... ])
    >>> ctl = Controller(prof, ClusterSpec.uniform(1, 1), "saturn-static", solver_time_limit_s=1)
    >>> [a.task for a in ctl.start(0.0)]
    ['a']
    >>> [a.task for a in ctl.handle(TaskFinished(time_s=10.0, task="a"))]
    ['b']
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from ray_saturn import defaults
from ray_saturn.context import Incumbent
from ray_saturn.control.dispatch import Launch, PlannedTask, Stop, dispatch
from ray_saturn.control.events import (
    Event,
    GpusIdle,
    NodeAdded,
    NodeLost,
    TaskArrived,
    TaskFailed,
    TaskFinished,
    TaskOffEstimate,
    Tick,
)
from ray_saturn.control.moves import MoveDecision, decide_moves, moved_tasks
from ray_saturn.control.occupancy import Occupancy
from ray_saturn.control.replan import (
    ReplanInput,
    ReplanPolicy,
    ReplanView,
    build_replan_input,
    get_replan_policy,
)
from ray_saturn.control.state import RECENT_REPORTS, Placement, Segment, TaskProgress, TaskState
from ray_saturn.errors import SaturnError
from ray_saturn.limits import solver_gap as check_gap
from ray_saturn.plan import Plan
from ray_saturn.profile_table import ProfileTable
from ray_saturn.solver.objective import (
    is_background,
    objective_gain,
    parse_objective,
    solver_policy,
    task_weights,
)
from ray_saturn.spec import ClusterSpec, NodeSpec

__all__ = ["Action", "Controller", "ReplanRecord", "SolveFn"]

logger = logging.getLogger(__name__)

Action = Launch | Stop
#: ``online``: the arrival rate that prices a plan's GPU-seconds is measured over this window (s).
ARRIVAL_WINDOW_S = 3600.0
#: Backfill: a queued task runs ahead of its plan on idle GPUs when the time the steps it makes there
#: take off its planned run is at least this many times what the backfill costs (its row's start-up,
#: and the checkpoint and restart when the plan takes the GPUs back).
BACKFILL_GAIN = 10.0
#: ``solve(profile, cluster, policy, *, context, time_limit_s, seed) -> Plan``,
#: as :func:`ray_saturn.solver.solve`.
SolveFn = Callable[..., Plan]


@dataclass
class ReplanRecord:
    """One (re-)plan: when, why, what it cost and what it decided."""

    time_s: float
    reasons: list[str]
    solver_time_s: float
    planned_makespan_s: float
    lower_bound_s: float
    tasks: int
    moves: list[MoveDecision] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "kind": "replan",
            "time_s": round(self.time_s, 3),
            "reasons": self.reasons,
            "solver_time_s": round(self.solver_time_s, 4),
            "planned_makespan_s": round(self.planned_makespan_s, 3),
            "lower_bound_s": round(self.lower_bound_s, 3),
            "tasks": self.tasks,
            "moves": [m.to_dict() for m in self.moves],
        }


class Controller:
    """The control plane of one run (see the package docstring for the loop).

    Args:
        profile: the original profile (total steps, profiled step times).
        cluster: the nodes at the start.
        policy: a :class:`ReplanPolicy` or its name (``saturn-replan``, ...).
        restart_s: the cost of moving a running task (checkpoint, stop,
            relaunch); update it with :meth:`set_restart_cost` once measured.
        solver_time_limit_s: time limit of each solver call.
        min_replan_gap_s: re-plans closer than this to the previous one are
            deferred to a wake-up (see :meth:`next_wakeup_s`); the gap is at
            least ``min_replan_gap_fraction`` x :attr:`horizon_s` (the longest plan so far).
        drift_replan_gap_s: the same for re-plans that only drift asked for (a
            task off its estimate, GPUs idle): at most one per this many
            seconds, at least ``drift_replan_gap_fraction`` x :attr:`horizon_s`.
            A finish, failure, arrival or node change re-plans at
            once (subject to ``min_replan_gap_s`` only) and takes the deferred
            drift reasons with it.
        min_reports: step-time reports a task needs on a configuration before
            it is judged off its estimate (noisy measurements need a few).
        max_replan_tasks: a rolling horizon for large runs: a re-plan solves
            the running tasks and at most this many queued ones (those not yet
            planned, then the earliest planned); the others keep their planned
            configuration, nodes and order until they come into the window.
        on_plan: called with every plan the controller installs and the
            :class:`ReplanInput` it was solved for (e.g. to persist or check it).
        max_failures: a task that fails more often than this is FAILED.
        solve: the solver function (default :func:`ray_saturn.solver.solve`).
        deterministic: ask the solver policy for its deterministic mode (limits
            counted in work, not seconds), so a run depends only on its inputs.
        steps_done: progress tasks already made (e.g. a resumed run: each
            task's last checkpoint), in steps of the profile's totals; a task
            with all its steps done starts FINISHED.
        failed: tasks given up earlier (task -> reason); they start FAILED and
            are never planned.
        objective: what plans optimise: ``makespan`` (default), ``completion``
            or ``online`` (:mod:`ray_saturn.solver.objective`); it is passed
            to the solver policy and decides whether moving running tasks pays.
        relocations: whether a move may keep a task's GPU count (another node,
            or the same GPUs later: room made for another task). ``False``
            (Ray Tune, where a move is a pause and a resize) pins every task a
            plan would move without resizing it and solves again, so every
            move changes a task's GPU count.
        solver_gap: each plan's search stops once its makespan is within this
            fraction of the lower bound (solver policies with a ``gap`` option;
            0: the whole time limit). A real run's driver sets it: its solver
            shares the CPU with the training it plans.
        backfill: let queued tasks run ahead of their plan on GPUs it leaves
            idle now (a plan gives each task one configuration, so a task
            waiting for a wide row leaves the GPUs that free up before it idle
            until then). A queued task takes the row that fits in the idle GPUs
            and makes the most steps before the plan needs them (its own
            planned start, or that of a task planned on those nodes), when the
            time those steps take off its planned run is at least
            :data:`BACKFILL_GAIN` x the row's start-up plus the checkpoint and
            restart. The plan takes the GPUs back when it launches a task on
            their nodes (the backfilled task stops and waits for its planned
            turn, which now has fewer steps to go), and a re-plan sees it as
            queued with its progress (kept where it runs if the new plan starts
            it there at once). ``None`` (default): on for the ``online``
            objective when relocations are allowed (not under Ray Tune, where
            a move is a pause and a resize).
    """

    def __init__(
        self,
        profile: ProfileTable,
        cluster: ClusterSpec,
        policy: ReplanPolicy | str,
        *,
        restart_s: float = defaults.RESTART_S,
        solver_time_limit_s: float = defaults.SOLVER_TIME_LIMIT_S,
        seed: int = 0,
        min_replan_gap_s: float = 0.0,
        min_replan_gap_fraction: float = 0.0,
        drift_replan_gap_s: float = 0.0,
        drift_replan_gap_fraction: float = 0.0,
        min_reports: int = 1,
        max_replan_tasks: int | None = None,
        on_plan: Callable[[Plan, ReplanInput], None] | None = None,
        max_failures: int = 3,
        solve: SolveFn | None = None,
        deterministic: bool = False,
        steps_done: Mapping[str, int] | None = None,
        failed: Mapping[str, str] | None = None,
        objective: str = "makespan",
        relocations: bool = True,
        solver_gap: float = 0.0,
        backfill: bool | None = None,
    ) -> None:
        check_gap(solver_gap, "solver gap", error=SaturnError)
        if restart_s < 0 or not math.isfinite(restart_s):
            raise SaturnError(f"restart cost is {restart_s} s; give a finite number >= 0")
        if solver_time_limit_s <= 0:
            raise SaturnError(f"solver time limit is {solver_time_limit_s} s; give a positive number")
        profile.check_feasible()
        self.profile = profile
        self.policy = get_replan_policy(policy) if isinstance(policy, str) else policy
        self.restart_s = float(restart_s)
        self.solver_time_limit_s = solver_time_limit_s
        self.seed = seed
        self._min_gap_s = min_replan_gap_s
        self._min_gap_fraction = min_replan_gap_fraction
        self._drift_gap_s = drift_replan_gap_s
        self._drift_gap_fraction = drift_replan_gap_fraction
        if not 1 <= min_reports <= RECENT_REPORTS:
            raise SaturnError(
                f"min_reports is {min_reports}; give 1 to {RECENT_REPORTS} (a task's measured step time "
                f"is the mean of its last {RECENT_REPORTS} reports, so more could never be judged)"
            )
        self.min_reports = int(min_reports)
        self._on_plan = on_plan
        if max_replan_tasks is not None and max_replan_tasks < 1:
            raise SaturnError(f"max_replan_tasks is {max_replan_tasks}; give at least 1 (or None for all)")
        self.max_replan_tasks = max_replan_tasks
        self._window: set[str] | None = None
        self.max_failures = max_failures
        if solve is None:
            from ray_saturn.solver import solve as default_solve

            solve = default_solve
        self._solve = solve
        self.objective = parse_objective(objective)
        self.relocations = bool(relocations)
        self._deterministic = deterministic
        self._solver_gap = float(solver_gap)
        self._solver_policy = self.policy.solver_policy
        if deterministic or self.objective != "makespan" or solver_gap:
            self._solver_policy = solver_policy(
                self.policy.solver_policy, objective=self.objective, deterministic=deterministic, gap=solver_gap
            )
        self._weights = dict(zip(profile.tasks, task_weights(profile, profile.tasks), strict=True))
        self.nodes: dict[str, NodeSpec] = {n.name: n for n in cluster.nodes}
        #: every node the run has had (alive or not): a task that fits none of them can never run
        self._known_nodes: dict[str, NodeSpec] = dict(self.nodes)
        self.tasks: dict[str, TaskProgress] = {}
        for t in profile.tasks:
            self.tasks[t] = TaskProgress(t, max(c.steps for c in profile.configs(t)))
        for t, n in (steps_done or {}).items():
            p = self.state(t)
            if not 0 <= int(n) <= p.total_steps:
                raise SaturnError(f"task {t!r}: {n} steps done, but it has {p.total_steps}; give 0..{p.total_steps}")
            p.steps_done = int(n)
            if p.steps_done == p.total_steps:
                p.state = TaskState.FINISHED
        for t, why in (failed or {}).items():
            p = self.state(t)
            p.state, p.reason = TaskState.FAILED, why
        self.planned: dict[str, PlannedTask] = {}
        self._plan_step_time: dict[str, float] = {}
        self.plan: Plan | None = None
        self.plan_made_s = 0.0
        self._tick_base_s = 0.0
        self.first_makespan_s: float | None = None
        self._longest_plan_s = 0.0
        self.replans: list[ReplanRecord] = []
        self.log: list[dict] = []
        self.solver_time_s = 0.0
        self.moves = 0
        self._pending: list[tuple[str, bool]] = []  # (reason, only drift asked for it)
        self._idle_seen: set[str] = set()
        self._last_replan_s: float | None = None
        self._now = 0.0
        #: ``online``: per task, its share of the arrival price (set at each re-plan).
        self._area_share: dict[str, float] = {}
        self._least_area: dict[str, float] = {}
        #: ``online``: when the arrival price of the plan being followed lapses (a re-plan then).
        self._price_lapse_s: float | None = None
        #: tasks running ahead of their plan on GPUs it leaves idle (stopped when the plan needs them),
        #: each with the set-up its planned launch gets then (checkpoint and restart)
        self._backfilled: dict[str, float] = {}
        #: backfilled tasks a move left where they ran (counted as a move when they stop)
        self._in_place: set[str] = set()
        self.backfill = (self.objective == "online" and self.relocations) if backfill is None else bool(backfill)
        #: backfill launches so far
        self.backfills = 0

    # ------------------------------------------------------------ queries
    def state(self, task: str) -> TaskProgress:
        try:
            return self.tasks[task]
        except KeyError:
            raise SaturnError(f"task {task!r} is not in the profile") from None

    def cluster(self) -> ClusterSpec:
        """The nodes alive now."""
        if not self.nodes:
            raise SaturnError("no node is left in the cluster; add a node to continue")
        return ClusterSpec(tuple(self.nodes.values()))

    def occupancy(self) -> Occupancy:
        """The controller's ledger: which devices of the alive nodes the running tasks hold."""
        return Occupancy(
            {n: s.gpus for n, s in self.nodes.items()},
            [p.placement for p in self.tasks.values() if p.state is TaskState.RUNNING and p.placement is not None],
        )

    def _plan_running(self) -> dict[str, Placement]:
        """The running tasks as the plan sees them: backfills are waiting for their turn."""
        return {p.task: p.placement for p in self.tasks.values()
                if p.state is TaskState.RUNNING and p.placement is not None and p.task not in self._backfilled}

    def _plan_waits(self, p: TaskProgress) -> bool:
        """Whether the plan sees ``p`` as waiting: queued, or backfilled ahead of its turn."""
        return p.state is TaskState.QUEUED or p.task in self._backfilled

    def _plan_occupancy(self) -> Occupancy:
        """The ledger with the backfilled tasks' devices free (the plan may take them)."""
        return Occupancy({n: s.gpus for n, s in self.nodes.items()}, self._plan_running().values())

    def free_gpus(self) -> dict[str, int]:
        """Free whole GPUs per alive node (devices no running task holds any share of)."""
        return self.occupancy().free_gpus()

    @property
    def horizon_s(self) -> float:
        """The makespan of the longest plan made so far (the first one, unless tasks arrived since):
        the re-plan gaps' and the periodic interval's fractions are of it, so a first plan for the
        few tasks there at the start does not make them tiny."""
        return self._longest_plan_s

    @property
    def min_replan_gap_s(self) -> float:
        """The least time between two re-plans (later ones wait for a wake-up)."""
        return max(self._min_gap_s, self._min_gap_fraction * self.horizon_s)

    @property
    def drift_replan_gap_s(self) -> float:
        """The least time between a re-plan and one that only drift asks for."""
        return max(
            self.min_replan_gap_s, self._drift_gap_s, self._drift_gap_fraction * self.horizon_s
        )

    def _gap_now(self) -> float:
        """The gap the pending reasons must wait for."""
        if all(drift for _, drift in self._pending):
            return self.drift_replan_gap_s
        return self.min_replan_gap_s

    @property
    def done(self) -> bool:
        """True when every task is finished or failed."""
        return all(p.state in (TaskState.FINISHED, TaskState.FAILED) for p in self.tasks.values())

    def next_wakeup_s(self) -> float | None:
        """When to call :meth:`handle` with a :class:`Tick` next (``None``: no need)."""
        times = []
        if self._pending and self._last_replan_s is not None:
            times.append(self._last_replan_s + self._gap_now())
        if self._price_lapse_s is not None and not self.done:
            times.append(max(self._price_lapse_s, self._now))
        running = any(p.state is TaskState.RUNNING for p in self.tasks.values())
        if self.first_makespan_s is not None and running and not self._pending:
            # (a re-plan waiting for its gap is a wake-up already, and it starts the next interval;
            # with nothing running, queued tasks wait for a node, and a node added re-plans)
            t = self.policy.next_tick_s(self._tick_base_s, self.horizon_s)
            if t is not None:
                times.append(max(t, self._now))
        return min(times) if times else None

    # ------------------------------------------------------------ inputs
    def start(self, now_s: float = 0.0, arrived: Iterable[str] | None = None) -> list[Action]:
        """Mark ``arrived`` tasks (default: all not yet finished or failed) as arrived at ``now_s``;
        plan and launch."""
        names = [t for t, p in self.tasks.items() if p.state is TaskState.PENDING] if arrived is None else list(arrived)
        return self.handle(*[TaskArrived(time_s=now_s, task=t) for t in names])

    def set_restart_cost(self, restart_s: float) -> None:
        """Use a measured restart cost (seconds) from the next re-plan on."""
        if restart_s < 0 or not math.isfinite(restart_s):
            raise SaturnError(f"restart cost is {restart_s} s; give a finite number >= 0")
        self.restart_s = float(restart_s)

    def add_tasks(self, profile: ProfileTable) -> None:
        """Add tasks whose rows were not known when the controller was made.

        For online arrivals whose profile rows exist only once they arrive (a
        Ray Tune trial's rows come from its config). The new tasks are PENDING
        until a :class:`TaskArrived` for each is handled.

        Example:
            >>> ctl = Controller(ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1,
            ...                  "step_time_s": 1.0, "steps": 5}]), ClusterSpec.uniform(1, 1), "saturn-static")
            >>> ctl.add_tasks(ProfileTable.from_rows([{"task": "b", "strategy": "ddp", "gpus": 1,
            ...                                        "step_time_s": 1.0, "steps": 3}]))
            >>> ctl.state("b").total_steps, ctl.state("b").state.value
            (3, 'pending')
        """
        clash = [t for t in profile.tasks if t in self.tasks]
        if clash:
            raise SaturnError(f"task(s) {', '.join(clash[:5])} are already in this run; give new tasks new names")
        profile.check_feasible()
        self.profile = self.profile.with_rows(profile)
        for t in profile.tasks:
            self.tasks[t] = TaskProgress(t, max(c.steps for c in profile.configs(t)))

    def set_total_steps(self, task: str, total_steps: int) -> None:
        """Plan ``task`` for ``total_steps`` steps from now on (at least the steps it has done, at
        least 1), e.g. a Tune trial whose early-stopping scheduler may end it before its profile's
        steps: the horizon grows as the trial goes on. Takes effect at the next re-plan.

        Example:
            >>> ctl = Controller(ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1,
            ...                  "step_time_s": 1.0, "steps": 50}]), ClusterSpec.uniform(1, 1), "saturn-static")
            >>> ctl.set_total_steps("a", 10)
            >>> ctl.state("a").total_steps
            10
        """
        p = self.state(task)
        p.total_steps = max(1, p.steps_done, int(total_steps))

    def request_replan(self, now_s: float, reason: str) -> list[Action]:
        """Re-plan at ``now_s`` for a reason only the caller knows, e.g. a better plan
        finished in the background; the minimum gap between re-plans still applies (a reason
        asked for again while it waits is pending once)."""
        if (reason, False) not in self._pending:
            self._pending.append((reason, False))
        return self.handle(Tick(time_s=now_s))

    def report_progress(
        self, task: str, steps_done: int, now_s: float, step_time_s: float | None = None
    ) -> list[Action]:
        """The driver's progress report: ``steps_done`` so far, measured ``step_time_s``.

        The task's measured step time is the mean of its last reports on its
        configuration (at least ``min_reports`` of them). When it is off the
        plan's estimate, beyond two standard errors of the measurement, by more
        than the policy's ``tolerance``, or by enough to move the task's end by
        more than ``horizon_drift`` of the plan's makespan, the measured rate
        replaces the estimate and a :class:`TaskOffEstimate` is raised (and
        handled): one event per drift; the next one only if the task drifts
        again by more than the tolerance from the new estimate, judged on
        fresh reports.
        """
        p = self.state(task)
        if p.state is not TaskState.RUNNING:
            logger.debug("progress of %s ignored: it is %s", task, p.state.value)
            return []
        p.steps_done = min(p.total_steps, max(0, int(steps_done)))
        p.reported_at_s = now_s
        if step_time_s is None or step_time_s <= 0:
            return []
        measured, se = p.observe_step_time(float(step_time_s))
        assert p.placement is not None
        cfg = self.profile.get(task, *p.placement.config_key)
        if cfg.step_time_s:
            p.slowdown = measured / cfg.step_time_s
        est = p.estimate_step_time_s
        if not est or len(p.recent_step_times) < self.min_reports:
            return []
        # Only the part of the deviation the measurement's noise (two standard errors) cannot explain.
        dev = max(0.0, abs(measured - est) - 2.0 * se)
        shift = dev * p.remaining_steps
        horizon = self.plan.makespan_s if self.plan is not None else math.inf
        if not self.policy.off_estimate(dev / est, shift, horizon, measured_estimate=p.estimate_measured):
            return []
        p.estimate_step_time_s = measured  # the measured rate replaces the estimate ...
        p.estimate_measured = True
        p.recent_step_times.clear()  # ... and the next drift is judged on fresh reports
        return self.handle(
            TaskOffEstimate(
                time_s=now_s,
                task=task,
                measured_step_time_s=measured,
                estimate_step_time_s=est,
                end_shift_s=shift,
            )
        )

    def handle(self, *events: Event) -> list[Action]:
        """Apply ``events`` (all at the same time, in order), re-plan if needed, and return the
        actions to execute now: :class:`Stop` (moves) first, then :class:`Launch`."""
        for ev in events:
            self._now = max(self._now, ev.time_s)
            self.log.append({"time_s": round(ev.time_s, 3), **ev.to_dict()})
            reason = self._apply(ev)
            if reason:
                self._pending.append((reason, isinstance(ev, TaskOffEstimate)))
        now = self._now
        actions: list[Action] = []
        if self._price_lapse_s is not None and now >= self._price_lapse_s - 1e-9:
            # The plan was priced for arrivals that have stopped: plan again with the makespan guard.
            self._price_lapse_s = None
            self._pending.append(("no arrival for the pricing window: the arrival price lapsed", False))
        if not self._pending and self._tick_due(now):
            self._pending.append((self.policy.wants_replan(Tick(time_s=now), self._view()) or "tick", False))
        actions.extend(self._replan_if_due(now))
        actions.extend(self._dispatch(now))
        for ev in self._idle_events(now):
            self.log.append({"time_s": round(now, 3), **ev.to_dict()})
            reason = self.policy.wants_replan(ev, self._view())
            if reason:
                self._pending.append((reason, True))
        if self._pending:
            actions.extend(self._replan_if_due(now))
            actions.extend(self._dispatch(now))
            self._idle_seen &= self._idle_nodes()  # nodes those launches filled may fall idle again
        return actions

    # ------------------------------------------------------------ internals
    def _view(self, task: TaskProgress | None = None, planned: PlannedTask | None = None) -> ReplanView:
        plan_end = self.plan_made_s + self.plan.makespan_s if self.plan is not None else None
        return ReplanView(
            task,
            planned.end_s if planned else None,
            self.plan_made_s if self.plan is not None else None,
            plan_end,
            sum(p.state is TaskState.QUEUED for p in self.tasks.values()),
        )

    def _replan_if_due(self, now: float) -> list[Action]:
        if not self._pending:
            return []
        if self._last_replan_s is not None and now < self._last_replan_s + self._gap_now() - 1e-9:
            return []  # deferred to the wake-up at the end of the gap
        reasons, self._pending = [r for r, _ in self._pending], []
        return self._replan(now, reasons)

    def _idle_nodes(self, free: Mapping[str, int] | None = None) -> set[str]:
        """Nodes with free GPUs that no queued task is planned on."""
        free = self.free_gpus() if free is None else free
        planned_on = {
            n for t, e in self.planned.items() if self.tasks[t].state is TaskState.QUEUED for n in e.placement.nodes
        }
        return {n for n, g in free.items() if g > 0 and n not in planned_on}

    def _idle_events(self, now: float) -> list[GpusIdle]:
        """One :class:`GpusIdle` per node whose free GPUs newly have no planned queued task,
        while a running task has at least the restart cost left (else nothing could gain)."""
        free = self.free_gpus()
        idle = self._idle_nodes(free)
        self._idle_seen &= idle  # a node that filled up (or got planned work) may fall idle again
        fresh = sorted(idle - self._idle_seen)
        if not fresh:
            return []
        busy_for = max((p.time_left_s(now) for p in self.tasks.values() if p.state is TaskState.RUNNING), default=0.0)
        if busy_for <= self.restart_s:
            return []
        self._idle_seen.update(fresh)
        return [GpusIdle(time_s=now, node=n, gpus=free[n], busy_for_s=busy_for) for n in fresh]

    def _apply(self, ev: Event) -> str | None:
        if isinstance(ev, TaskArrived):
            p = self.state(ev.task)
            if p.state is not TaskState.PENDING:
                raise SaturnError(f"task {ev.task!r} arrived twice")
            p.state, p.arrived_s = TaskState.QUEUED, ev.time_s
            return f"{ev.task} arrived"
        if isinstance(ev, TaskFinished):
            p = self.state(ev.task)
            if not p.can_finish:
                raise SaturnError(f"task {ev.task!r} finished but it is {p.state.value}, not running")
            p.steps_done = p.total_steps
            self._close(p, ev.time_s, "finished")
            p.state, p.finished_s = TaskState.FINISHED, ev.time_s
            self._forget_backfill(ev.task)
            planned = self.planned.pop(ev.task, None)
            return self.policy.wants_replan(ev, self._view(p, planned))
        if isinstance(ev, TaskFailed):
            p = self.state(ev.task)
            if p.state not in (TaskState.RUNNING, TaskState.QUEUED):
                raise SaturnError(f"task {ev.task!r} failed but it is {p.state.value}")
            self._interrupt(p, ev.time_s, ev.steps_done, "failed")
            p.failures += 1
            p.reason = ev.reason
            if p.failures > self.max_failures or ev.final:
                p.state = TaskState.FAILED
                self.planned.pop(ev.task, None)
                logger.warning("task %s failed %d times; giving up: %s", ev.task, p.failures, ev.reason)
                return None
            return f"{ev.task} failed ({ev.reason})"
        if isinstance(ev, NodeLost):
            if ev.node not in self.nodes:
                raise SaturnError(f"node {ev.node!r} lost, but it is not in the cluster")
            del self.nodes[ev.node]
            for t in [t for t, e in self.planned.items() if ev.node in e.placement.nodes]:
                if self.tasks[t].state is TaskState.QUEUED:
                    del self.planned[t]  # planned on the lost node: plan it again
            for p in self.tasks.values():
                if p.state is TaskState.RUNNING and p.placement and ev.node in p.placement.nodes:
                    self._interrupt(p, ev.time_s, ev.steps_done.get(p.task), "interrupted")
            return f"node {ev.node} lost"
        if isinstance(ev, NodeAdded):
            if ev.node.name in self.nodes:
                raise SaturnError(f"node {ev.node.name!r} added, but it is already in the cluster")
            self.nodes[ev.node.name] = ev.node
            self._known_nodes[ev.node.name] = ev.node
            unplanned = sum(p.state is TaskState.QUEUED and t not in self.planned for t, p in self.tasks.items())
            return self.policy.wants_replan(ev, self._view()) or (
                f"node {ev.node.name} added; {unplanned} task(s) wait for a plan" if unplanned else None)
        if isinstance(ev, TaskOffEstimate):
            p = self.state(ev.task)
            return self.policy.wants_replan(ev, self._view(p, self.planned.get(ev.task)))
        if isinstance(ev, Tick | GpusIdle):
            return None  # a due periodic re-plan is checked after every batch of events; idle GPUs after dispatch
        raise SaturnError(f"unknown event {type(ev).__name__}")

    def _tick_due(self, now: float) -> bool:
        if self.first_makespan_s is None:
            return False
        t = self.policy.next_tick_s(self._tick_base_s, self.horizon_s)
        return t is not None and now >= t - 1e-9

    def _close(self, p: TaskProgress, now: float, status: str) -> None:
        seg = p.running_segment
        if seg is not None:
            seg.end_s, seg.status, seg.steps_end = now, status, p.steps_done

    def _forget_backfill(self, task: str) -> None:
        self._backfilled.pop(task, None)
        self._in_place.discard(task)

    def _interrupt(self, p: TaskProgress, now: float, steps_done: int | None, status: str) -> None:
        self._forget_backfill(p.task)
        if p.state is TaskState.RUNNING:
            p.steps_done = p.steps_at(now) if steps_done is None else min(p.total_steps, int(steps_done))
            self._close(p, now, status)
        p.state = TaskState.QUEUED
        p.placement = None
        p.forget_measurements()
        self.planned.pop(p.task, None)

    def _input(self, now: float, movable: bool, pinned: Collection[str] = ()) -> ReplanInput | None:
        tasks = self.tasks
        if self._backfilled:
            tasks = dict(tasks)
            for t in self._backfilled:
                p = tasks[t]
                tasks[t] = replace(p, state=TaskState.QUEUED, steps_done=p.steps_at(now), placement=None)
        return build_replan_input(
            self.profile,
            tasks,
            self.cluster(),
            now,
            restart_s=self.restart_s,
            movable=movable,
            only=self._window,
            incumbent=self._incumbent(),
            pinned=pinned,
            area_share=self._area_share,
        )

    def _incumbent(self) -> Incumbent | None:
        """The plan being followed: running tasks where they run, then queued ones in planned order."""
        if self.plan is None:
            return None
        queued = sorted((e.start_s, t) for t, e in self.planned.items() if self._plan_waits(self.tasks[t]))
        placements = self._plan_running()
        placements.update((t, self.planned[t].placement) for _, t in queued)
        return Incumbent(
            tuple(placements),
            {t: (pl.strategy, pl.gpus, pl.nodes) for t, pl in placements.items()},
        )

    def _choose_window(self, queued: list[TaskProgress]) -> set[str] | None:
        w = self.max_replan_tasks
        if w is None or len(queued) <= w:
            return None
        unplanned = [p.task for p in queued if p.task not in self.planned]
        planned = sorted((self.planned[p.task].start_s, p.task) for p in queued if p.task in self.planned)
        return set(unplanned) | {t for _, t in planned[: max(0, w - len(unplanned))]}

    def _call_solver(self, inp: ReplanInput, time_limit_s: float) -> Plan:
        t0 = time.perf_counter()
        plan = self._solve(
            inp.profile,
            inp.cluster,
            self._solver_policy,
            context=inp.context,
            time_limit_s=time_limit_s,
            seed=self.seed,
        )
        self.solver_time_s += time.perf_counter() - t0
        return plan

    def _replan(self, now: float, reasons: list[str]) -> list[Action]:
        self._tick_base_s = now
        queued = [p for p in self.tasks.values() if self._plan_waits(p)]
        if not queued and not self.policy.allows_moves:
            self._last_replan_s = now
            return []
        moves_ok = self.policy.allows_moves
        if not self.nodes:
            self._last_replan_s = now
            logger.warning("t=%.0f s: no node is alive; %d task(s) wait for one", now, len(queued))
            self.log.append({"time_s": round(now, 3), "kind": "waiting", "tasks": len(queued),
                             "reason": "no node is alive"})
            return []
        self._window = self._choose_window(queued)
        # Tasks too big for the nodes alive now, but not for the cluster as it was (a node is down).
        # One that fits no node ever seen is left in: the solver says which, in one line.
        homeless = sorted(p.task for p in queued if p.task not in self._backfilled
                          and not self._fits_now(p.task) and self._fits_now(p.task, self._known_nodes))
        if homeless:  # they wait for a node to be added
            logger.warning("t=%.0f s: %s fit(s) on no node alive now; waiting for a node", now, ", ".join(homeless))
            self.log.append({"time_s": round(now, 3), "kind": "waiting", "tasks": homeless,
                             "reason": "no configuration fits the nodes alive"})
            window = self._window if self._window is not None else {p.task for p in queued}
            self._window = set(window) - set(homeless)
        if self._window is not None:
            self._window |= set(self._backfilled)  # a re-plan sees them as queued: they are always in it
        self._area_share = {}
        inp = self._input(now, movable=moves_ok)
        if inp is None:
            self._last_replan_s = now
            return []
        t0 = time.perf_counter()
        running = self._plan_running()
        limit = self.solver_time_limit_s
        area_weight = self._future_load(inp, now)
        self._price_lapse_s = self._price_lapse() if area_weight > 0 else None
        if area_weight > 0:
            self._area_share = self._shares(inp)
            inp = replace(inp, context=replace(inp.context, area_share=self._area_share))
        if self.objective == "online":  # priced by the present arrival rate (0 once arrivals stop)
            self._solver_policy = solver_policy(
                self.policy.solver_policy, objective=self.objective, deterministic=self._deterministic,
                area_weight=area_weight, gap=self._solver_gap,
            )
        plan = self._call_solver(inp, limit)
        if moves_ok and running and not self.relocations:
            plan, inp = self._without_relocations(now, running, plan, inp, limit)
        decisions: list[MoveDecision] = []
        if moves_ok and running and moved_tasks(running, plan):
            keep_inp = self._input(now, movable=False)
            assert keep_inp is not None
            keep = self._call_solver(keep_inp, max(0.1, limit / 2))
            gain = objective_gain(keep, plan, self.objective, self._weights, area_weight, self._area_share,
                                  self._background(inp))
            decisions = decide_moves(
                running, plan, keep.makespan_s, self._move_costs(running, plan), gain_s=gain
            )
            if not all(d.move for d in decisions):
                plan, inp = keep, keep_inp
        solver_time = time.perf_counter() - t0
        self._install(plan, inp, now)
        record = ReplanRecord(
            now,
            list(reasons),
            solver_time,
            now + plan.makespan_s,
            now + plan.lower_bound_s,
            len(inp.tasks),
            decisions,
        )
        self.replans.append(record)
        self.log.append(record.to_dict())
        logger.info(
            "t=%.0f s: re-plan (%s): makespan %.0f s, %d move(s), solved in %.2f s",
            now,
            "; ".join(reasons)[:200],
            now + plan.makespan_s,
            sum(d.move for d in decisions),
            solver_time,
        )
        actions: list[Action] = []
        for d in decisions:
            if d.move:
                p = self.tasks[d.task]
                target = plan.assignment(d.task)
                if self.backfill and target.start_s > 1e-6:
                    # Moved to a later start: it runs on where it is until the plan needs its GPUs
                    # (its own turn included), a backfill in place; the plan's set-up has its restart.
                    self._backfilled[d.task] = 0.0
                    self._in_place.add(d.task)
                    continue
                self._interrupt(p, now, None, "stopped")
                self.planned[d.task] = self._planned_from(target, now)
                self.moves += 1
                actions.append(Stop(d.task, d.reason, d.target))
        return actions

    def _without_relocations(
        self, now: float, running: Mapping[str, Placement], plan: Plan, inp: ReplanInput, limit: float
    ) -> tuple[Plan, ReplanInput]:
        """``plan`` solved again with every running task it moves without resizing pinned, until
        no move keeps a GPU count (each round pins at least one more task, so it ends)."""
        pinned: set[str] = set()
        while True:
            same = {t for t, to in moved_tasks(running, plan).items() if to.gpus == running[t].gpus}
            if not same - pinned:
                return plan, inp
            pinned |= same
            again = self._input(now, movable=True, pinned=pinned)
            assert again is not None  # the same running tasks are still there
            plan, inp = self._call_solver(again, max(0.1, limit / 2)), again

    def _move_costs(self, running: Mapping[str, Placement], plan: Plan) -> dict[str, float]:
        """Per running task the plan moves: stop + save + load (``restart_s`` and its row's
        checkpoint columns) + the target configuration's start-up."""
        out = {}
        for t, target in moved_tasks(running, plan).items():
            here = self.profile.get(t, *running[t].config_key)
            there = self.profile.get(t, *target.config_key)
            out[t] = self.restart_s + here.move_cost_s + there.startup_s
        return out

    def _future_load(self, inp: ReplanInput, now: float) -> float:
        """``online``: task-seconds per GPU-second for the jobs expected to arrive while the present
        ones drain: (arrivals in the last :data:`ARRIVAL_WINDOW_S`, those at the run's first instant
        excepted) / window x (least GPU-seconds of the present tasks / GPUs), per GPU. 0 otherwise."""
        if self.objective != "online":
            return 0.0
        times = [p.arrived_s for p in self.tasks.values() if p.arrived_s is not None]
        if not times:
            return 0.0
        first = min(times)
        recent = sum(1 for t in times if t > first and t > now - ARRIVAL_WINDOW_S)
        if not recent:
            return 0.0
        rate = recent / min(ARRIVAL_WINDOW_S, max(1e-9, now - first))
        gpus = sum(n.gpus for n in inp.cluster.nodes)
        work = sum(
            min(c.runtime_s * c.gpus for c in inp.profile.configs(t, feasible_only=True)) for t in inp.tasks
        )
        return rate * (work / gpus) / gpus

    def _fits_now(self, task: str, nodes: Mapping[str, NodeSpec] | None = None) -> bool:
        """Whether some feasible row of ``task`` fits ``nodes`` (default: those alive now) by GPUs per
        node, node count and GPU type; a share of one GPU needs a node with a GPU."""
        nodes = self.nodes if nodes is None else nodes
        for c in self.profile.configs(task, feasible_only=True):
            per_node = c.gpus / c.nodes if c.gpus >= 1 else 1
            room = sum(n.gpus >= per_node and (c.gpu_type is None or n.gpu_type == c.gpu_type)
                       for n in nodes.values())
            if room >= c.nodes:
                return True
        return False

    def _least(self, task: str) -> float:
        """``task``'s least GPU-seconds over its feasible rows of the original profile."""
        v = self._least_area.get(task)
        if v is None:
            v = self._least_area[task] = _least_gpu_seconds(self.profile, task)
        return v

    def _shares(self, inp: ReplanInput) -> dict[str, float]:
        """``online``: per task of ``inp``, the share of the jobs arrived so far that are larger
        (least GPU-seconds) than its remaining work: of the jobs to come, those would queue behind
        it under shortest-remaining-work-first, the smaller ones pass it, so only the larger ones
        wait for the GPU-seconds it holds."""
        sizes = sorted(self._least(p.task) for p in self.tasks.values() if p.arrived_s is not None)
        if not sizes:
            return {}
        out = {}
        for t in inp.tasks:
            mine = _least_gpu_seconds(inp.profile, t)
            out[t] = (len(sizes) - bisect.bisect_right(sizes, mine)) / len(sizes)
        return out

    def _background(self, inp: ReplanInput) -> frozenset[str]:
        """``online``: the tasks of ``inp`` in the background (:func:`is_background`)."""
        gpus = sum(n.gpus for n in inp.cluster.nodes)
        return frozenset(t for t in inp.tasks
                         if is_background(self._area_share.get(t), _least_gpu_seconds(inp.profile, t), gpus))

    def _price_lapse(self) -> float | None:
        """When :meth:`_future_load` drops to 0 if nothing else arrives: the last arrival (those at
        the run's first instant excepted) + :data:`ARRIVAL_WINDOW_S`."""
        times = [p.arrived_s for p in self.tasks.values() if p.arrived_s is not None]
        if not times:
            return None
        first = min(times)
        later = [t for t in times if t > first]
        return max(later) + ARRIVAL_WINDOW_S if later else None

    def _planned_from(self, a, now: float) -> PlannedTask:
        return PlannedTask(
            a.task,
            Placement(a.strategy, a.gpus, a.nodes, a.gpu_type, a.devices),
            now + a.start_s,
            now + a.end_s,
            a.setup_s,
        )

    def _install(self, plan: Plan, inp: ReplanInput, now: float) -> None:
        self.plan, self.plan_made_s = plan, now
        if self._on_plan is not None:
            self._on_plan(plan, inp)
        self._last_replan_s = now
        if self.first_makespan_s is None:
            self.first_makespan_s = plan.makespan_s
        self._longest_plan_s = max(self._longest_plan_s, plan.makespan_s)
        # Queued tasks outside a rolling-horizon window keep their planned entries.
        self.planned = {
            t: e
            for t, e in self.planned.items()
            if self._window is not None and t not in self._window and self.tasks[t].state is TaskState.QUEUED
        }
        for a in plan.assignments:
            self.planned[a.task] = self._planned_from(a, now)
            if a.task in self._backfilled:
                cur = self.tasks[a.task].placement
                if a.start_s <= 1e-6 and cur is not None and Placement(
                        a.strategy, a.gpus, a.nodes, a.gpu_type, a.devices).same_config(cur):
                    self._forget_backfill(a.task)  # the new plan keeps it where it runs
                else:
                    # The new plan's set-up for it (a queued task's) gets the checkpoint and restart.
                    here = self.profile.get(a.task, *cur.config_key)
                    self._backfilled[a.task] = self.restart_s + here.move_cost_s
                    self._in_place.discard(a.task)
            cfg = inp.profile.get(a.task, a.strategy, a.gpus, len(a.nodes), a.gpu_type)
            self._plan_step_time[a.task] = float(cfg.step_time_s or 0.0)
            p = self.tasks[a.task]
            if p.state is TaskState.RUNNING and p.measured_step_time_s is not None:
                # Kept in place: the new plan's estimate is the measured step time.
                p.estimate_step_time_s = p.measured_step_time_s
                p.estimate_measured = True

    def _dispatch(self, now: float) -> list[Action]:
        queue = [self.planned[t] for t, p in self.tasks.items() if self._plan_waits(p) and t in self.planned]
        out: list[Action] = []
        chosen = dispatch(queue, self._plan_occupancy(), now_s=now) if queue else []
        if self._backfilled and chosen:
            stops, chosen = self._reclaim(chosen, now)
            out.extend(stops)
        for pt in chosen:
            # Before its first step: the restart set-up the plan allowed and the configuration's start-up.
            setup = pt.setup_s + self.profile.get(pt.task, *pt.placement.config_key).startup_s
            out.append(self._launch(pt.task, pt.placement, now, setup, pt.start_s, self._plan_step_time.get(pt.task)))
        if self.backfill and self.plan is not None:
            out.extend(self._fill(now))
        return out

    def _launch(self, task: str, placement: Placement, now: float, setup_s: float, planned_start_s: float,
                estimate_step_time_s: float | None) -> Launch:
        """Start a segment of ``task`` on ``placement`` now: its state, its segment, the action."""
        p = self.tasks[task]
        p.state = TaskState.RUNNING
        p.placement = placement
        p.reported_at_s = now + setup_s
        p.estimate_step_time_s = estimate_step_time_s
        p.estimate_measured = False
        p.forget_measurements()
        p.segments.append(Segment(placement, now, setup_s, steps_start=p.steps_done))
        return Launch(task, placement, p.steps_done, setup_s, planned_start_s, estimate_step_time_s)

    def _reclaim(self, chosen: list[PlannedTask], now: float) -> tuple[list[Stop], list[PlannedTask]]:
        """Stop the backfills the plan's launches ``chosen`` need: a task whose own turn came, and on
        a launch's nodes, backfills (the latest launched first) until the launch fits beside the rest.
        Returns the stops and the launches on the devices they get beside the backfills that stay."""
        stops = [self._end_backfill(pt.task, now) for pt in chosen if pt.task in self._backfilled]
        placed_all: list[PlannedTask] = []
        for pt in chosen:
            while True:
                occ = self.occupancy()
                for q in placed_all:
                    occ.take(q.placement, check=False)
                placed = occ.fit(pt.placement)
                if placed is not None:
                    break
                on_nodes = [t for t in self._backfilled if set(self.tasks[t].placement.nodes) & set(pt.placement.nodes)]
                if not on_nodes:  # cannot happen: dispatch fitted it with every backfill's GPUs free
                    raise SaturnError(f"t={now:.1f}: {pt.task} does not fit on {list(pt.placement.nodes)}")
                last = max(on_nodes, key=lambda t: (self.tasks[t].segments[-1].start_s, t))
                stops.append(self._end_backfill(last, now))
            placed_all.append(replace(pt, placement=placed, setup_s=self.planned[pt.task].setup_s))
        return stops, placed_all

    def _end_backfill(self, t: str, now: float) -> Stop:
        """Stop backfilled ``t``: the plan launches a task on its nodes (``t`` itself, or another)."""
        p = self.tasks[t]
        here = p.placement
        assert here is not None
        entry = self.planned.get(t)
        extra = self._backfilled[t]
        moved = t in self._in_place
        self._interrupt(p, now, None, "stopped")
        if entry is not None:
            self.planned[t] = entry = replace(entry, setup_s=entry.setup_s + extra)
        if moved:
            self.moves += 1
            return Stop(t, "moved: the plan needs its GPUs now", entry.placement if entry else here)
        return Stop(t, "backfill ends: the plan needs its GPUs", entry.placement if entry else here)

    def _fill(self, now: float) -> list[Launch]:
        """Backfill: queued tasks run ahead of their plan on GPUs it leaves idle now, while the
        steps they make there save more than the checkpoint and restart they cost."""
        occ = self.occupancy()
        free = occ.free_gpus()
        if not any(free.values()):
            return []
        queued = sorted((e.start_s, t) for t, e in self.planned.items() if self.tasks[t].state is TaskState.QUEUED)
        need = {n: math.inf for n in free}
        for s, t in queued:
            for n in self.planned[t].placement.nodes:
                if n in need:
                    need[n] = min(need[n], s)
        out = []
        for s, t in queued:
            if s <= now + 1e-6:
                continue
            p = self.tasks[t]
            entry = self.planned[t]
            planned_cfg = self.profile.get(t, *entry.placement.config_key)
            plan_st = (self._plan_step_time.get(t) or planned_cfg.step_time_s or 0.0)
            left = p.total_steps - p.steps_done
            best = None
            for c in self.profile.configs(t, feasible_only=True):
                if c.gpu_type is not None or c.gpus < 1 or c.gpus != int(c.gpus):
                    continue
                q, k = c.gpus // c.nodes, c.nodes
                fits = sorted((n for n, g in free.items() if g >= q), key=lambda n: (-need[n], free[n], n))
                if len(fits) < k:
                    continue
                nodes = tuple(sorted(fits[:k]))
                until = min([s] + [need[n] for n in nodes])
                st = c.step_time_s * p.slowdown
                steps = min(left, int(max(0.0, until - now - c.startup_s) / st))
                cost = self.restart_s + c.move_cost_s + c.startup_s
                gain = steps * plan_st
                if gain >= BACKFILL_GAIN * cost and gain > 0 and (best is None or gain > best[0]):
                    best = (gain, c, nodes, st)
            if best is None:
                continue
            _, c, nodes, st = best
            pl = Placement(c.strategy, c.gpus, nodes)
            placed = occ.fit(pl)
            if placed is None:
                continue
            occ.take(placed)
            free = occ.free_gpus()
            out.append(self._launch(t, placed, now, c.startup_s, now, st))
            self._backfilled[t] = self.restart_s + c.move_cost_s
            self.backfills += 1
            self.log.append({"time_s": round(now, 3), "kind": "backfill", "task": t, **placed.to_dict()})
        return out


def _least_gpu_seconds(profile: ProfileTable, task: str) -> float:
    """``task``'s least GPU-seconds (runtime x GPUs) over its feasible rows of ``profile``."""
    return min(c.runtime_s * c.gpus for c in profile.configs(task, feasible_only=True))
