"""Planning off Tune's event loop: the controller's solve function that never waits on a solver run.

The :class:`~ray_saturn.control.Controller` re-plans by calling a solve
function. Inside Tune that call happens in a scheduler hook, on Tune's event
loop, so :class:`BackgroundPlanner` answers it at once with a *quick plan*
(:func:`quick_plan`, a few milliseconds for tens of trials): the best of the
baseline policies' schedules and the replay, on the current state, of the
plan being followed and of the newest plan the background finished (moves
included). The same input then goes to the background (from the scheduler's
next hook), which runs the full solver with the plan being followed as its
start; a newer input replaces one that has not started yet (latest wins).
The background is a Ray actor when Ray is running (a process of its own, so
a solve never holds the GIL of Tune's driver), else a thread. When a
background plan is ready, :meth:`BackgroundPlanner.receive` takes it in and
the scheduler, in its next hook, asks the controller
to re-plan: the quick plan then replays that plan on the state of that
moment, and the controller's move rule decides whether its moves pay.

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> from ray_saturn.context import PlanningContext
    >>> prof = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0,
    ...                                 "steps": 10}])
    >>> planner = BackgroundPlanner(time_limit_s=0.2, use_ray=False)
    >>> plan = planner(prof, ClusterSpec.uniform(1, 2), "saturn", context=PlanningContext(), time_limit_s=1, seed=0)
    >>> plan.makespan_s
    10.0
    >>> planner.flush()
    >>> planner.wait(timeout_s=30), planner.poll()
    (True, True)
    >>> planner.close()
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ray_saturn.context import Incumbent, PlanningContext
from ray_saturn.plan import Plan

__all__ = ["BackgroundPlanner", "PlannerStats", "incumbent_of", "quick_plan", "same_decisions", "survivor_makespan"]

logger = logging.getLogger(__name__)

#: The time limit of a quick plan's solver calls: no search (a limit must be > 0; baselines ignore it).
NO_SEARCH_S = 1e-3
#: The baselines whose schedules are candidates of every quick plan (each a list-scheduling pass).
QUICK_BASELINES = ("fifo-fastest", "fifo-min-gpus", "fifo-whole-node", "optimus-greedy")
#: How far above the least makespan a quick plan may be to end sooner should any one trial train
#: past its horizon (see :func:`survivor_makespan`): the horizons are expectations, far less exact.
SURVIVOR_TOLERANCE = 0.05
#: ``start_order="searcher"``: allotments of each task's fastest row of at least these efficiencies
#: join the candidates (a row as efficient as that costs little GPU-time and ends the trial sooner).
SEARCHER_EFFICIENCIES = (0.85,)
#: The start orders a Tune search may follow (see :func:`quick_plan`).
START_ORDERS = ("searcher", "plan")


def incumbent_of(plan: Plan) -> Incumbent:
    """``plan`` as an incumbent: tasks in planned start order, each with its placement."""
    order = tuple(a.task for a in sorted(plan.assignments, key=lambda a: (a.start_s, a.task)))
    return Incumbent(order, {a.task: (a.strategy, a.gpus, tuple(a.nodes)) for a in plan.assignments})


def same_decisions(a: Plan, b: Plan) -> bool:
    """Whether two plans put their common tasks on the same placements, in the same order."""
    ia, ib = incumbent_of(a), incumbent_of(b)
    common = set(ia.placements) & set(ib.placements)
    if any(ia.placements[t] != ib.placements[t] for t in common):
        return False
    return [t for t in ia.order if t in common] == [t for t in ib.order if t in common]


def _policy_name(policy: Any) -> str:
    return policy if isinstance(policy, str) else getattr(policy, "name", str(policy))


def quick_plan(
    profile,
    cluster,
    policy: Any,
    context: PlanningContext,
    *,
    extra: Incumbent | None = None,
    seed: int = 0,
    extra_steps: Mapping[str, int] | None = None,
    start_order: str = "plan",
) -> Plan:
    """A plan in milliseconds: for ``saturn``, the best of the baselines' schedules and of the
    replays of ``context.incumbent`` and ``extra`` (for a completion-time objective, with the
    completion rules' first schedules, ranked by that objective); any other policy is itself that fast.

    ``extra_steps``: per task, the steps it may train past the horizon it is planned for (a trial an
    early-stopping scheduler keeps); see :func:`survivor_makespan` for how they rank the candidates.

    ``start_order`` (objective ``makespan``; the completion objectives order by remaining work):
    ``"plan"``, trials start in the order the schedule finds best; ``"searcher"``, in the order
    they arrived (the search algorithm's): each candidate's allotment is kept and list-scheduled
    in that order, with allotments of the fastest rows of at least :data:`SEARCHER_EFFICIENCIES`
    efficiency as more candidates (see :func:`in_arrival_order`).

    The lower bound is the cheap one (length, area, exclusive task; no LP).
    """
    from ray_saturn.plan import validate_plan
    from ray_saturn.solver import build_problem, get_policy, lower_bound, policy_names, solve_problem
    from ray_saturn.solver.listsched import list_schedule, replay_schedule

    t0 = time.perf_counter()
    problem = build_problem(profile, cluster, context)
    bound = lower_bound(problem, use_lp=False)
    if _policy_name(policy) != "saturn":
        return solve_problem(problem, policy, time_limit_s=NO_SEARCH_S, seed=seed, bound=bound)
    registered = set(policy_names())
    candidates = [
        get_policy(name).solve(problem, bound, time_limit_s=0.0, seed=seed).schedule
        for name in QUICK_BASELINES
        if name in registered
    ]
    for inc in (context.incumbent, extra):
        if inc is None:
            continue
        p = (
            problem
            if inc is context.incumbent
            else dataclasses.replace(problem, context=dataclasses.replace(context, incumbent=inc))
        )
        try:
            hint = p.incumbent_hint()
        except Exception:  # an incumbent that no longer decodes (the cluster changed): plan without it
            logger.info("an incumbent plan does not apply to the current state; planning without it")
            continue
        if hint is not None:
            choice, order, nodes_of = hint
            candidates += [replay_schedule(p, choice, order, nodes_of), list_schedule(p, choice, order)]
    options = getattr(policy, "options", None)
    objective = getattr(options, "objective", "makespan")
    if objective == "makespan":
        searcher = start_order == "searcher"
        if searcher:
            candidates = in_arrival_order(problem, candidates)
        best = _shortest(problem, candidates, extra_steps, reorder=not searcher)
    else:
        from ray_saturn.solver.completion import completion_search
        from ray_saturn.solver.objective import task_weights

        weights = task_weights(profile, problem.tasks)
        area_weight = float(getattr(options, "area_weight", 0.0))
        best = completion_search(
            problem, objective, weights, reference=candidates, area_weight=area_weight, time_limit_s=0.0
        ).schedule
    plan = problem.to_plan(best, policy="saturn", lower_bound_s=bound.value, solve_time_s=time.perf_counter() - t0)
    validate_plan(plan, profile, cluster, context)
    return plan


def survivor_makespan(problem, schedule, extra_steps: Mapping[str, int]) -> float:
    """The schedule's end if every task trained its ``extra_steps`` too, each on its planned
    configuration: when each trial alone survives, it ends at its start + its duration + those steps."""
    return max(
        (schedule.start[t] + schedule.durations[t] + _extra_s(problem, t, o, extra_steps)
         for t, o in enumerate(schedule.option)),
        default=0.0,
    )


def _extra_s(problem, t: int, option: int, extra_steps: Mapping[str, int]) -> float:
    """Seconds task ``t``'s extra steps take on ``option``."""
    return extra_steps.get(problem.tasks[t], 0) * (problem.options[t][option].config.step_time_s or 0.0)


def in_arrival_order(problem, candidates: list) -> list:
    """Each distinct allotment of ``candidates`` (and the widest rows of each efficiency of
    :data:`SEARCHER_EFFICIENCIES`), list-scheduled with the tasks in the order they arrived.

    Why the search algorithm's order: under an asynchronous early-stopping scheduler (ASHA) the
    first trial to reach a rung always goes on, and each later one goes on when it beats the
    median of those recorded before it. A plan that starts the longest trials first makes them the
    first at every rung: they pass rungs they would not pass in the searcher's order, and the
    search trains more of its most expensive trials (on the Tune benchmark, 1.45-1.58x plain Tune
    in two of six seeds). In the searcher's order ASHA sees results in about the order plain Tune
    gives it, and what ray_saturn decides is each trial's GPUs, node and moves.
    """
    from ray_saturn.solver.listsched import list_schedule

    order = list(range(problem.num_tasks))  # the input lists tasks by arrival (then as added)
    choices = [tuple(s.option) for s in candidates]
    for eff in SEARCHER_EFFICIENCIES:
        choices.append(tuple(_widest_efficient(problem, eff)))
    return [list_schedule(problem, list(c), order) for c in dict.fromkeys(choices)]


def _widest_efficient(problem, efficiency: float) -> list[int]:
    """Per task, its fastest option of at least ``efficiency`` (least GPU-seconds / the option's);
    a running task kept where it runs."""
    least = [min(o.area for o in opts) for opts in problem.options]
    return problem.choose(lambda t, o: (least[t] < efficiency * o.area - 1e-9, o.duration_s, o.gpus))


def _shortest(problem, candidates: list, extra_steps: Mapping[str, int] | None, *, reorder: bool = True):
    """The candidate of the least makespan; with ``extra_steps``, among those within
    :data:`SURVIVOR_TOLERANCE` of it, the one of the least :func:`survivor_makespan`.

    The plan's horizons are what an early-stopping scheduler is *expected* to let each trial train,
    so many orders and allotments share (nearly) the least expected makespan; what tells them apart
    is the search's real end, set by the trial the scheduler keeps to the end. Started late or narrow,
    that trial ends the search late (on the Tune benchmark, the longest task, kept for all its
    reports and started on 1 GPU after most others had finished, set the search's end in every run
    that missed its target). So among near-equal plans the one where every trial, were it the
    survivor, ends soonest wins, and list schedules in the order of those survivor ends (longest
    first, LPT on what each trial may still train) join the candidates.
    """
    from ray_saturn.solver.listsched import list_schedule

    best = min(candidates, key=lambda s: s.makespan)
    if not extra_steps or not any(extra_steps.get(t, 0) > 0 for t in problem.tasks):
        return best

    def potential(t: int, option: int) -> float:
        return problem.options[t][option].duration_s + _extra_s(problem, t, option, extra_steps)

    # One survivor-order schedule per distinct allotment; none when the start order is fixed
    # (reorder=False): then only the candidates themselves compete.
    allotments = dict.fromkeys(tuple(s.option) for s in candidates) if reorder else {}
    more = []
    for choice in allotments:
        order = sorted(range(problem.num_tasks), key=lambda t: (-potential(t, choice[t]), t))
        more.append(list_schedule(problem, list(choice), order))
    pool = candidates + more
    least = min(s.makespan for s in pool)
    near = [s for s in pool if s.makespan <= least * (1 + SURVIVOR_TOLERANCE) + 1e-9]
    return min(near, key=lambda s: (survivor_makespan(problem, s, extra_steps), s.makespan))


@dataclass(frozen=True)
class _Call:
    profile: Any
    cluster: Any
    policy: Any
    context: PlanningContext
    seed: int


@dataclass
class PlannerStats:
    """What planning cost: quick plans made in hooks, full solves in the background."""

    quick_plans: int = 0
    quick_time_s: float = 0.0
    max_quick_ms: float = 0.0
    background_solves: int = 0
    background_time_s: float = 0.0
    background_failures: int = 0
    applied: int = 0
    background: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}


def _full_solve(solve: Callable[..., Plan], call: _Call, time_limit_s: float) -> tuple[Plan, float]:
    t0 = time.perf_counter()
    plan = solve(
        call.profile, call.cluster, call.policy, context=call.context, time_limit_s=time_limit_s, seed=call.seed
    )
    return plan, time.perf_counter() - t0


class _SolverActor:
    """The background as a Ray actor (a process of its own: no GIL shared with Tune's driver)."""

    def __init__(self, time_limit_s: float) -> None:
        from ray_saturn.solver import solve

        self._solve, self._limit = solve, time_limit_s

    def solve(self, call: _Call) -> tuple[Plan, float]:
        return _full_solve(self._solve, call, self._limit)


class _ActorBackend:
    def __init__(self, time_limit_s: float) -> None:
        import ray

        self._ray = ray
        self._actor = ray.remote(num_cpus=0)(_SolverActor).remote(time_limit_s)
        self._inflight = None
        self._queued: _Call | None = None

    def submit(self, call: _Call) -> None:
        if self._inflight is None:
            self._inflight = self._actor.solve.remote(call)
        else:
            self._queued = call  # latest wins

    def poll(self, timeout_s: float = 0.0) -> tuple[Plan | None, float, bool]:
        """(plan, seconds, failed) of a solve that finished, else (None, 0, False)."""
        if self._inflight is None:
            return None, 0.0, False
        ready, _ = self._ray.wait([self._inflight], timeout=timeout_s)
        if not ready:
            return None, 0.0, False
        ref, self._inflight = self._inflight, None
        if self._queued is not None:
            call, self._queued = self._queued, None
            self.submit(call)
        try:
            plan, secs = self._ray.get(ref)
            return plan, secs, False
        except Exception as exc:
            logger.warning("background planning failed (the current plan stays): %s", str(exc).splitlines()[0])
            return None, 0.0, True

    def idle(self) -> bool:
        return self._inflight is None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._ray.kill(self._actor)


class _ThreadBackend:
    def __init__(self, solve: Callable[..., Plan], time_limit_s: float) -> None:
        self._solve, self._limit = solve, time_limit_s
        self._cond = threading.Condition()
        self._queued: _Call | None = None
        self._busy = False
        self._done: list[tuple[Plan | None, float, bool]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="saturn-tune-planner", daemon=True)
        self._thread.start()

    def submit(self, call: _Call) -> None:
        with self._cond:
            self._queued = call  # latest wins
            self._cond.notify_all()

    def poll(self, timeout_s: float = 0.0) -> tuple[Plan | None, float, bool]:
        with self._cond:
            if not self._done and timeout_s > 0:
                self._cond.wait_for(lambda: self._done or (self._queued is None and not self._busy), timeout_s)
            if not self._done:
                return None, 0.0, False
            done, self._done = self._done, []
        # The newest finished plan; earlier ones are superseded.
        return done[-1][0], sum(d[1] for d in done), any(d[2] for d in done)

    def idle(self) -> bool:
        with self._cond:
            return self._queued is None and not self._busy and not self._done

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=60)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queued is not None or self._closed)
                if self._closed:
                    return
                call, self._queued, self._busy = self._queued, None, True
            try:
                plan, secs = _full_solve(self._solve, call, self._limit)
                out = (plan, secs, False)
            except Exception as exc:  # the quick plan stays in force
                logger.warning("background planning failed (the current plan stays): %s", exc)
                out = (None, 0.0, True)
            with self._cond:
                self._busy = False
                self._done.append(out)
                self._cond.notify_all()


class BackgroundPlanner:
    """A solve function for the controller that returns at once and improves the plan in the background.

    Args:
        time_limit_s: time limit of each background solve.
        allows_moves: whether the re-planning policy moves running tasks; then
            a call where no running task may move is the controller's "keep
            everything in place" comparison, which is not solved again in the
            background.
        use_ray: solve in a Ray actor (default: when Ray is initialised), else a thread.
        solve: the solver function of the thread background (default :func:`ray_saturn.solver.solve`).
    """

    def __init__(
        self,
        *,
        time_limit_s: float,
        allows_moves: bool = True,
        use_ray: bool | None = None,
        solve: Callable[..., Plan] | None = None,
    ) -> None:
        self.time_limit_s = float(time_limit_s)
        self.allows_moves = allows_moves
        self.use_ray = use_ray
        self._solve = solve
        self.stats = PlannerStats()
        #: While False, calls are not solved again in the background (set while applying a background plan).
        self.refine = True
        #: The newest plan the background finished, and whether it was not applied yet.
        self.newest: Plan | None = None
        self.fresh = False
        self._candidate: _Call | None = None
        self._backend: _ActorBackend | _ThreadBackend | None = None
        #: Per task, the steps it may train past its planned horizon (set by the caller; see quick_plan).
        self.extra_steps: dict[str, int] = {}
        #: The order trials start in (:data:`START_ORDERS`; set by the caller; see quick_plan).
        self.start_order = "plan"

    def __getstate__(self) -> dict:
        # Tune pickles its scheduler with the experiment: keep the plans, not the background.
        state = dict(self.__dict__)
        state["_backend"] = state["_candidate"] = None
        return state

    # ------------------------------------------------------------ the solve function
    def __call__(self, profile, cluster, policy, *, context: PlanningContext, time_limit_s: float, seed: int = 0):
        t0 = time.perf_counter()
        extra = incumbent_of(self.newest) if self.fresh and self.newest is not None else None
        plan = quick_plan(profile, cluster, policy, context, extra=extra, seed=seed, extra_steps=self.extra_steps,
                          start_order=self.start_order)
        keep_comparison = self.allows_moves and bool(context.running) and not any(r.movable for r in context.running)
        if self.refine and _policy_name(policy) == "saturn" and not keep_comparison:
            self._candidate = _Call(profile, cluster, policy, context, seed)
        dt = time.perf_counter() - t0
        self.stats.quick_plans += 1
        self.stats.quick_time_s += dt
        self.stats.max_quick_ms = max(self.stats.max_quick_ms, 1000 * dt)
        return plan

    # ------------------------------------------------------------ background
    def _get_backend(self):
        if self._backend is None:
            use_ray = self.use_ray
            if use_ray is None:
                try:
                    import ray

                    use_ray = ray.is_initialized()
                except ImportError:  # pragma: no cover - ray is a dependency
                    use_ray = False
            if use_ray:
                self._backend = _ActorBackend(self.time_limit_s)
            else:
                if self._solve is None:
                    from ray_saturn.solver import solve

                    self._solve = solve
                self._backend = _ThreadBackend(self._solve, self.time_limit_s)
            self.stats.background = "ray actor" if use_ray else "thread"
        return self._backend

    def start(self) -> None:
        """Start the background now (it starts on the first flush otherwise)."""
        self._get_backend()

    def flush(self) -> None:
        """Hand the last call since the previous flush to the background (replacing a queued one)."""
        call, self._candidate = self._candidate, None
        if call is not None:
            self._get_backend().submit(call)

    def receive(self, timeout_s: float = 0.0) -> bool:
        """Take in a background solve that finished; True when one did (a plan, or a failure)."""
        if self._backend is None:
            return False
        plan, secs, failed = self._backend.poll(timeout_s)
        self.stats.background_time_s += secs
        if failed:
            self.stats.background_failures += 1
        if plan is not None:
            self.stats.background_solves += 1
            self.newest, self.fresh = plan, True
        return plan is not None or failed

    def poll(self, timeout_s: float = 0.0) -> bool:
        """Take in a background plan that finished; True when one is fresh (not applied yet)."""
        self.receive(timeout_s)
        return self.fresh

    def consume(self, applied: bool = True) -> None:
        """The fresh background plan was applied (the controller re-planned with it), or was
        not needed (``applied=False``: it decides what the plan being followed decides)."""
        if self.fresh and applied:
            self.stats.applied += 1
        self.fresh = False

    def wait(self, timeout_s: float) -> bool:
        """Wait until the background is idle (tests, shutdown); True if it is. Finished plans stay to be polled."""
        deadline = time.monotonic() + timeout_s
        backend = self._backend
        if backend is None:
            return True
        if isinstance(backend, _ThreadBackend):
            with backend._cond:
                return backend._cond.wait_for(
                    lambda: backend._queued is None and not backend._busy, max(0.0, deadline - time.monotonic())
                )
        while not backend.idle():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.poll(min(left, 1.0))
        return True

    def close(self) -> None:
        """Stop the background (a solve in progress finishes first in a thread; an actor is ended)."""
        if self._backend is not None:
            self._backend.close()
            self._backend = None
