"""Discrete-event simulation of a run: the real control plane on a simulated clock.

The simulator plays the part of the runtime's driver and workers. It keeps
the *true* world (true step times, true progress, which node holds which
GPUs) and feeds the :class:`~ray_saturn.control.Controller` the same events a
driver would: arrivals, finishes, progress reports with measured step times,
node losses and additions, wake-ups. It executes the controller's actions
(a :class:`~ray_saturn.control.Launch` occupies GPUs until the task's true
finish; a :class:`~ray_saturn.control.Stop` checkpoints and frees them).

Model of the world:

- a task on a configuration runs its remaining steps at the configuration's
  true step time (see :mod:`ray_saturn.sim.workload`), after ``setup_s`` of
  restart when it was moved;
- the driver reports progress, with the measured step time, once a segment
  has run ``progress_fraction`` of its steps (at least one step), and the
  exact step count before every batch of events;
- a node failure interrupts its tasks, which keep the progress of their last
  checkpoint (one every ``checkpoint_interval_s``); a recovered node comes
  back empty;
- planning takes no simulated time (its wall time is reported as
  ``solver_time_s``).

The simulator checks the realised execution as it goes (a node never holds
more than its GPUs, a device never more than one GPU of shares, a task of a
GPU type's row runs only on nodes of that type, every task runs its steps
exactly once) and, at the end, the realised timeline with the plan
validator's per-device check (:func:`realised_plan`,
:func:`ray_saturn.devices.check_devices`); it raises
:class:`SimulationError` otherwise. Every plan the controller installs is
valid for its input (the solver validates it).

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> prof = ProfileTable.from_rows([
    ...     {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 10},
    ...     {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10},
    ... ])
    >>> r = simulate(prof, ClusterSpec.uniform(1, 2), "fifo-whole-node", SimConfig(noise=0.0))
    >>> r.makespan_s, r.moves
    (20.0, 0)
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ray_saturn import defaults
from ray_saturn.context import PlanningContext
from ray_saturn.control import (
    Controller,
    Launch,
    NodeAdded,
    NodeLost,
    ReplanInput,
    ReplanPolicy,
    Segment,
    Stop,
    TaskArrived,
    TaskFinished,
    Tick,
    get_replan_policy,
)
from ray_saturn.errors import SaturnError, SpecError
from ray_saturn.limits import MAX_NOISE, MAX_SEED, number, whole
from ray_saturn.plan import Assignment, Plan
from ray_saturn.profile_table import ProfileTable
from ray_saturn.sim.workload import NodeFailure, check_failures, true_step_times, truth_key
from ray_saturn.solver.objective import parse_objective
from ray_saturn.spec import ClusterSpec
from ray_saturn.stepping import steps_done_by

__all__ = [
    "SimConfig",
    "SimResult",
    "SimulationError",
    "TaskRecord",
    "compare",
    "oracle_completion_bound",
    "oracle_lower_bound",
    "realised_plan",
    "simulate",
]

logger = logging.getLogger(__name__)

_EPS = 1e-7
# Event kinds, in the order they are handled at the same instant.
_FINISH, _NODE_LOST, _NODE_BACK, _ARRIVAL, _PROGRESS, _WAKEUP = range(6)


class SimulationError(SaturnError):
    """The realised execution broke a rule (a bug in the control plane, never bad input)."""


@dataclass(frozen=True)
class SimConfig:
    """Everything about the simulated world and the controller besides the policy.

    Example:
        >>> SimConfig(noise=0.2, seed=1).noise
        0.2
    """

    noise: float = 0.0
    seed: int = 0
    restart_s: float = defaults.RESTART_S
    arrivals: Mapping[str, float] | None = None
    failures: Sequence[NodeFailure] = ()
    solver_time_limit_s: float = defaults.SIMULATE_SOLVER_TIME_LIMIT_S
    min_replan_gap_s: float = 0.0
    min_replan_gap_fraction: float = 0.0
    checkpoint_interval_s: float = defaults.CHECKPOINT_INTERVAL_S
    progress_fraction: float = 0.05
    keep_plans: bool = False
    deterministic: bool = False
    max_replan_tasks: int | None = None
    objective: str = "makespan"
    #: let queued tasks run ahead of their plan on idle GPUs (:class:`~ray_saturn.control.Controller`'s
    #: ``backfill``); ``None``: on for the ``online`` objective
    backfill: bool | None = None

    def __post_init__(self) -> None:
        number(self.noise, "noise (relative spread of true step times, 0.2 = 20%)", low=0, high=MAX_NOISE)
        whole(self.seed, "seed", low=0, high=MAX_SEED)
        number(self.restart_s, "restart cost (s)", low=0)
        number(self.solver_time_limit_s, "solver time limit (s)", low=0, low_open=True)
        number(self.min_replan_gap_s, "least gap between re-plans (s)", low=0)
        number(self.min_replan_gap_fraction, "least gap between re-plans (fraction of the makespan)", low=0)
        number(self.checkpoint_interval_s, "checkpoint interval (s)", low=0, low_open=True)
        number(self.progress_fraction, "progress fraction", low=0, low_open=True, high=1)
        if self.max_replan_tasks is not None:
            whole(self.max_replan_tasks, "re-plan window (tasks)")
        object.__setattr__(self, "objective", parse_objective(self.objective))
        check_failures(self.failures)


@dataclass
class TaskRecord:
    """What really happened to one task: its :class:`~ray_saturn.control.Segment` s."""

    task: str
    arrival_s: float
    finish_s: float | None
    segments: list[Segment] = field(default_factory=list)
    state: str = "finished"


def _planned_makespan(replans, arrivals: Mapping[str, float] | None) -> float:
    """The makespan of the first plan made once every task had arrived (earlier ones knew only some)."""
    last = max((arrivals or {}).values(), default=0.0)
    known = [r for r in replans if r.time_s >= last - 1e-9]
    return (known or replans)[0].planned_makespan_s if replans else 0.0


@dataclass
class SimResult:
    """One policy's run. ``utilisation`` = GPU-seconds held by tasks / GPU-seconds alive until
    the makespan; ``mean_completion_s`` = mean of (finish - arrival); ``planned_makespan_s`` the
    makespan of the first plan made once every task had arrived."""

    policy: str
    makespan_s: float
    mean_completion_s: float
    utilisation: float
    moves: int
    replans: int
    solver_time_s: float
    wall_s: float
    planned_makespan_s: float
    tasks: list[TaskRecord]
    usage: list[tuple[float, int]]
    capacity: list[tuple[float, int]]
    plans: list[tuple[Plan, ReplanInput]] = field(default_factory=list)
    log: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The per-policy object of contract 3."""
        return {
            "makespan_s": round(self.makespan_s, 3),
            "mean_completion_s": round(self.mean_completion_s, 3),
            "utilisation": round(self.utilisation, 4),
            "moves": self.moves,
            "replans": self.replans,
            "solver_time_s": round(self.solver_time_s, 3),
            "planned_makespan_s": round(self.planned_makespan_s, 3),
        }


@dataclass
class _Run:
    """A task's segment in the true world."""

    task: str
    seg: int
    nodes: tuple[str, ...]
    per_node: int | float
    start_s: float
    setup_s: float
    step_s: float
    steps_at_start: int
    finish_s: float
    record: Segment

    @property
    def stepping_s(self) -> float:
        """When the first step starts (after the set-up); step i ends at ``stepping_s + i * step_s``."""
        return self.start_s + self.setup_s

    def steps_at(self, now: float, total: int) -> int:
        left = total - self.steps_at_start
        return self.steps_at_start + steps_done_by(now, self.stepping_s, self.step_s, left)


class _World:
    def __init__(self, profile, cluster, policy, cfg: SimConfig, truth) -> None:
        self.profile, self.cfg, self.truth = profile, cfg, truth
        self.total = {t: max(c.steps for c in profile.configs(t)) for t in profile.tasks}
        self.done = dict.fromkeys(profile.tasks, 0)
        self.caps = {n.name: n.gpus for n in cluster.nodes}
        self.used: dict[str, float] = dict.fromkeys(self.caps, 0)
        # Per node: units (1/8 GPU) held on each device, and whole GPUs held on no named device.
        self.dev_units = {n: [0] * g for n, g in self.caps.items()}
        self.anon = dict.fromkeys(self.caps, 0)
        self.types = {n.name: n.gpu_type for n in cluster.nodes}
        self.alive = set(self.caps)
        self.running: dict[str, _Run] = {}
        self.records = {t: TaskRecord(t, 0.0, None) for t in profile.tasks}
        self.events: list = []
        self.seq = 0
        self.segs = 0
        self.usage: list[tuple[float, int]] = [(0.0, 0)]
        self.capacity: list[tuple[float, int]] = [(0.0, sum(self.caps.values()))]
        self.plans: list[tuple[Plan, ReplanInput]] = []
        self.nodes = {n.name: n for n in cluster.nodes}
        self.wakeups: set[float] = set()
        self.ctl = Controller(
            profile,
            cluster,
            policy,
            restart_s=cfg.restart_s,
            solver_time_limit_s=cfg.solver_time_limit_s,
            seed=cfg.seed,
            min_replan_gap_s=cfg.min_replan_gap_s,
            min_replan_gap_fraction=cfg.min_replan_gap_fraction,
            on_plan=self._on_plan if cfg.keep_plans else None,
            deterministic=cfg.deterministic,
            objective=cfg.objective,
            max_replan_tasks=cfg.max_replan_tasks,
            backfill=cfg.backfill,
        )

    def _on_plan(self, plan: Plan, inp: ReplanInput) -> None:
        self.plans.append((plan, inp))

    def push(self, t: float, kind: int, payload) -> None:
        heapq.heappush(self.events, (t, kind, self.seq, payload))
        self.seq += 1

    def _track(self, now: float) -> None:
        busy = sum(self.used.values())
        if self.usage[-1][0] == now:
            self.usage[-1] = (now, busy)
        else:
            self.usage.append((now, busy))

    def _track_capacity(self, now: float) -> None:
        cap = sum(self.caps[n] for n in self.alive)
        self.capacity.append((now, cap))

    # ------------------------------------------------------------ actions
    def execute(self, actions, now: float) -> None:
        for a in actions:
            if isinstance(a, Stop):
                self._stop(a.task, now, checkpoint=None, status="stopped")
            elif isinstance(a, Launch):
                self._launch(a, now)
            else:  # pragma: no cover - the controller only returns these two
                raise SimulationError(f"unknown action {a!r}")
        self._track(now)

    def _launch(self, a: Launch, now: float) -> None:
        if a.task in self.running:
            raise SimulationError(f"t={now:.1f}: {a.task} launched while it runs")
        p = a.placement
        for n in p.nodes:
            if n not in self.alive:
                raise SimulationError(f"t={now:.1f}: {a.task} launched on node {n}, which is down")
            if p.gpu_type is not None and self.types.get(n) != p.gpu_type:
                raise SimulationError(
                    f"t={now:.1f}: {a.task} runs its {p.gpu_type} row on node {n}, of type {self.types.get(n)}"
                )
            self.used[n] += p.per_node
        self._hold(a.task, p, now, +1)
        key = truth_key(a.task, *p.config_key)
        if key not in self.truth:
            raise SimulationError(f"t={now:.1f}: {a.task} launched on {key[1:]}, which has no feasible row")
        step = self.truth[key]
        done = self.done[a.task]
        left = self.total[a.task] - done
        if left <= 0:
            raise SimulationError(f"t={now:.1f}: {a.task} launched with no steps left")
        stepping = now + a.setup_s  # == _Run.stepping_s: step i ends at stepping + i * step
        finish = stepping + left * step
        self.segs += 1
        rec = Segment(p, now, setup_s=a.setup_s, steps_start=done)
        self.records[a.task].segments.append(rec)
        run = _Run(a.task, self.segs, p.nodes, p.per_node, now, a.setup_s, step, done, finish, rec)
        self.running[a.task] = run
        self.push(finish, _FINISH, (a.task, run.seg))
        k = max(1, math.ceil(self.cfg.progress_fraction * left))
        if k < left:
            self.push(stepping + k * step, _PROGRESS, (a.task, run.seg))

    def _stop(self, task: str, now: float, checkpoint: float | None, status: str) -> int:
        run = self.running.pop(task, None)
        if run is None:
            raise SimulationError(f"t={now:.1f}: {task} stopped but it is not running")
        # A finish is handled with the events up to _EPS after the first of its batch (``now``): its
        # steps are counted at its own time, the end of its last step, so none is lost to the batch.
        steps = run.steps_at(max(now, run.finish_s) if status == "finished" else now, self.total[task])
        if checkpoint is not None:
            # Progress since the last checkpoint (one every checkpoint_interval_s of stepping) is lost.
            per_ckpt = max(1, int(checkpoint / run.step_s))
            steps = run.steps_at_start + (steps - run.steps_at_start) // per_ckpt * per_ckpt
        self.done[task] = steps
        for n in run.nodes:
            self.used[n] -= run.per_node
        self._hold(task, run.record.placement, now, -1)
        run.record.end_s, run.record.steps_end, run.record.status = now, steps, status
        return steps

    def _hold(self, task: str, p, now: float, sign: int) -> None:
        """Take (``sign`` +1) or give back (-1) ``p``'s devices; raise if a device or node is over-full."""
        units = round(8 * p.gpus) if p.gpus < 1 else 8
        if p.devices is None:
            if p.gpus < 1:
                raise SimulationError(f"t={now:.1f}: {task} holds a {p.gpus} share but names no device")
            for n in p.nodes:
                self.anon[n] += sign * int(p.per_node)
        else:
            for n, ds in p.devices:
                if len(ds) != (1 if p.gpus < 1 else p.per_node) or len({d for d, _ in ds}) != len(ds):
                    raise SimulationError(f"t={now:.1f}: {task} holds devices {list(ds)} on {n} for {p.gpus} GPU(s)")
                for d, _ in ds:
                    self.dev_units[n][d] += sign * units
                    if self.dev_units[n][d] > 8:
                        raise SimulationError(f"t={now:.1f}: device {d} of node {n} holds more than one GPU")
        for n in p.nodes:
            busy = sum(1 for u in self.dev_units[n] if u > 0) + self.anon[n]
            if busy > self.caps[n]:
                raise SimulationError(f"t={now:.1f}: node {n} holds {busy} GPUs, has {self.caps[n]}")

    def report_steps(self, now: float) -> None:
        for task, run in self.running.items():
            if now >= run.start_s + run.setup_s:
                self.ctl.report_progress(task, run.steps_at(now, self.total[task]), now)

    # ------------------------------------------------------------ loop
    def run(self, arrivals: Mapping[str, float], failures: Sequence[NodeFailure]) -> None:
        for t, at in arrivals.items():
            self.records[t].arrival_s = at
            self.push(at, _ARRIVAL, t)
        for f in failures:
            if f.node not in self.caps:
                raise SpecError(f"node failure of {f.node!r}: no such node in the cluster")
            self.push(f.at_s, _NODE_LOST, f.node)
            if f.back_s is not None:
                self.push(f.back_s, _NODE_BACK, f.node)
        ctl = self.ctl
        guard = 0
        while self.events:
            guard += 1
            if guard > 200 * (len(self.total) + len(failures) + 10):
                raise SimulationError("the simulation does not terminate (too many events)")
            now = self.events[0][0]
            batch = []
            while self.events and self.events[0][0] <= now + _EPS:
                batch.append(heapq.heappop(self.events))
            evs = []
            progress = []
            wake = False
            for _, kind, _, payload in batch:
                if kind == _FINISH:
                    task, seg = payload
                    run = self.running.get(task)
                    if run is None or run.seg != seg:
                        continue  # stale: the segment was stopped
                    self._stop(task, now, checkpoint=None, status="finished")
                    if self.done[task] != self.total[task]:
                        raise SimulationError(f"{task} finished with {self.done[task]} of {self.total[task]} steps")
                    self.records[task].finish_s = now
                    evs.append(TaskFinished(time_s=now, task=task))
                elif kind == _NODE_LOST:
                    kept = {}
                    for task, run in list(self.running.items()):
                        if payload in run.nodes:
                            every = self.cfg.checkpoint_interval_s
                            kept[task] = self._stop(task, now, checkpoint=every, status="interrupted")
                    self.alive.discard(payload)
                    self._track_capacity(now)
                    evs.append(NodeLost(time_s=now, node=payload, steps_done=kept))
                elif kind == _NODE_BACK:
                    self.alive.add(payload)
                    self._track_capacity(now)
                    evs.append(NodeAdded(time_s=now, node=self.nodes[payload]))
                elif kind == _ARRIVAL:
                    evs.append(TaskArrived(time_s=now, task=payload))
                elif kind == _PROGRESS:
                    task, seg = payload
                    run = self.running.get(task)
                    if run is not None and run.seg == seg:
                        progress.append(run)
                else:
                    self.wakeups.discard(now)
                    wake = True
            self._track(now)
            if evs or progress or wake:
                self.report_steps(now)
            if evs:
                self.execute(ctl.handle(*evs), now)
            for run in progress:
                if self.running.get(run.task) is run:
                    steps = run.steps_at(now, self.total[run.task])
                    self.execute(ctl.report_progress(run.task, steps, now, run.step_s), now)
            if wake:
                self.execute(ctl.handle(Tick(time_s=now)), now)
            nxt = ctl.next_wakeup_s()
            if nxt is not None and not ctl.done:
                nxt = max(nxt, now + 1e-3)
                if nxt not in self.wakeups:
                    self.wakeups.add(nxt)
                    self.push(nxt, _WAKEUP, None)
            if ctl.done and not self.running:
                break
        unfinished = [t for t, r in self.records.items() if r.finish_s is None and ctl.state(t).state.value != "failed"]
        if unfinished:
            waiting = any(e.get("kind") == "waiting" for e in ctl.log)
            raise SimulationError(
                f"the run ended with task(s) {', '.join(unfinished[:5])} unfinished"
                + ("; they waited for nodes that failed and never came back: give the failures a recovery "
                   "time (NODE@AT:BACK, or --recovery S)" if waiting else "")
            )


def simulate(
    profile: ProfileTable,
    cluster: ClusterSpec,
    policy: str | ReplanPolicy,
    config: SimConfig | None = None,
) -> SimResult:
    """Simulate one run of ``profile`` on ``cluster`` under ``policy``.

    ``policy`` is ``saturn-static``, ``saturn-replan``, ``saturn-periodic`` or a
    baseline's name (run as a static plan), or a :class:`ReplanPolicy`.
    """
    cfg = config or SimConfig()
    profile.check_feasible()
    pol = get_replan_policy(policy) if isinstance(policy, str) else policy
    truth = true_step_times(profile, noise=cfg.noise, seed=cfg.seed)
    arrivals = dict(cfg.arrivals) if cfg.arrivals is not None else dict.fromkeys(profile.tasks, 0.0)
    missing = [t for t in profile.tasks if t not in arrivals]
    if missing:
        raise SpecError(f"no arrival time for task(s) {', '.join(missing[:5])}")
    t0 = time.perf_counter()
    world = _World(profile, cluster, pol, cfg, truth)
    world.run(arrivals, cfg.failures)
    wall = time.perf_counter() - t0
    recs = list(world.records.values())
    if any(seg.placement.devices is not None for r in recs for seg in r.segments):
        from ray_saturn.devices import check_devices
        from ray_saturn.errors import PlanError

        try:
            check_devices(realised_plan(recs, pol.name), ClusterSpec(tuple(world.nodes.values())))
        except PlanError as exc:
            raise SimulationError(f"the realised run breaks the per-device check: {exc}") from None
    finished = [r for r in recs if r.finish_s is not None]
    makespan = max((r.finish_s for r in finished), default=0.0)
    for r in recs:
        r.state = world.ctl.state(r.task).state.value
    busy = _integral(world.usage, makespan)
    alive = _integral(world.capacity, makespan)
    ctl = world.ctl
    return SimResult(
        policy=pol.name,
        makespan_s=makespan,
        mean_completion_s=(sum(r.finish_s - r.arrival_s for r in finished) / len(finished)) if finished else 0.0,
        utilisation=busy / alive if alive > 0 else 0.0,
        moves=ctl.moves,
        replans=len(ctl.replans),
        solver_time_s=ctl.solver_time_s,
        wall_s=wall,
        planned_makespan_s=_planned_makespan(ctl.replans, cfg.arrivals),
        tasks=recs,
        usage=world.usage,
        capacity=world.capacity,
        plans=world.plans,
        log=ctl.log,
    )


def realised_plan(records: Sequence[TaskRecord], policy: str = "realised") -> Plan:
    """What really ran, as a plan: one assignment per segment (its placement and devices, from its
    start to its end), e.g. to check with :func:`ray_saturn.devices.check_devices`."""
    out = []
    for r in records:
        for seg in r.segments:
            if seg.end_s is None:
                continue
            pl = seg.placement
            out.append(
                Assignment(r.task, pl.strategy, pl.gpus, pl.nodes, seg.start_s, seg.end_s, seg.setup_s,
                           pl.device_map(), pl.gpu_type)
            )
    makespan = max((a.end_s for a in out), default=0.0)
    return Plan(policy, makespan, 0.0, 0.0, "feasible", out)


def _integral(steps: list[tuple[float, int]], end: float) -> float:
    total = 0.0
    for (t, v), (t2, _) in zip(steps, [*steps[1:], (end, 0)], strict=False):
        a, b = min(t, end), min(max(t2, t), end)
        total += v * max(0.0, b - a)
    return total


def compare(
    profile: ProfileTable,
    cluster: ClusterSpec,
    policies: Sequence[str | ReplanPolicy],
    config: SimConfig | None = None,
) -> dict[str, SimResult]:
    """Simulate each policy on the same world (same true step times, arrivals, failures).

    The results are keyed by policy name: a name given twice is a one-line :class:`SpecError`.
    """
    policies = [get_replan_policy(p) if isinstance(p, str) else p for p in policies]
    names = [p.name for p in policies]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SpecError(f"policy {', '.join(twice)} given more than once; compare each policy once")
    out = {}
    for p in policies:
        r = simulate(profile, cluster, p, config)
        out[r.policy] = r
        logger.info(
            "%s: makespan %.0f s, %d re-plans, %d moves, solver %.1f s, wall %.1f s",
            r.policy,
            r.makespan_s,
            r.replans,
            r.moves,
            r.solver_time_s,
            r.wall_s,
        )
    return out


def oracle_lower_bound(profile: ProfileTable, cluster: ClusterSpec, config: SimConfig) -> float:
    """A lower bound on any policy's realised makespan: the bound of the problem with the
    true step times and the arrival times (ignores failures and restarts)."""
    from ray_saturn.solver import lower_bound

    return lower_bound(_oracle_problem(profile, cluster, config)).with_moves  # runs may move tasks


def oracle_completion_bound(profile: ProfileTable, cluster: ClusterSpec, config: SimConfig) -> float:
    """A lower bound on any policy's realised mean completion time (finish - arrival, unweighted as
    :attr:`SimResult.mean_completion_s`): :func:`~ray_saturn.solver.completion_bound.completion_lower_bound`
    of the problem with the true step times and the arrival times (valid for runs that move tasks)."""
    from ray_saturn.solver.completion_bound import completion_lower_bound

    problem = _oracle_problem(profile, cluster, config)
    return completion_lower_bound(problem, [1.0] * problem.num_tasks).mean_completion_s


def _oracle_problem(profile: ProfileTable, cluster: ClusterSpec, config: SimConfig):
    """The planning problem with the true step times and the arrival times as releases."""
    from ray_saturn.profile_table import Config
    from ray_saturn.solver import build_problem

    truth = true_step_times(profile, noise=config.noise, seed=config.seed)

    def real(c: Config) -> Config:
        return replace(c, step_time_s=truth[truth_key(*c.row_key)]) if c.feasible else c

    true_profile = profile.replace(real)
    arrivals = {t: a for t, a in (config.arrivals or {}).items() if a > 0}
    return build_problem(true_profile, cluster, PlanningContext(release_s=arrivals))
