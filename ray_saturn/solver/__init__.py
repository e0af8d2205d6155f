"""The planner: ProfileTable + ClusterSpec (+ PlanningContext) -> Plan.

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> from ray_saturn.solver import solve
    >>> profile = ProfileTable.from_rows([
    ...     {"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 10.0, "steps": 10},
    ...     {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 6.0, "steps": 10},
    ...     {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 10.0, "steps": 10},
    ... ])
    >>> plan = solve(profile, ClusterSpec.uniform(1, 2), time_limit_s=5)
    >>> plan.makespan_s, plan.status
    (100.0, 'optimal')
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ray_saturn import defaults
from ray_saturn.context import PlanningContext
from ray_saturn.errors import SpecError
from ray_saturn.limits import MAX_SEED, number, whole
from ray_saturn.plan import Plan, validate_plan
from ray_saturn.profile_table import ProfileTable
from ray_saturn.solver.bounds import LowerBound, lower_bound
from ray_saturn.solver.completion_bound import completion_lower_bound
from ray_saturn.solver.objective import parse_objective, solver_policy, task_weights
from ray_saturn.solver.policy import (
    Policy,
    PolicyResult,
    deterministic_policy,
    get_policy,
    policy_names,
    register_policy,
)
from ray_saturn.solver.problem import Option, Problem, Schedule, build_problem
from ray_saturn.spec import ClusterSpec

__all__ = [
    "LowerBound",
    "Option",
    "Policy",
    "PolicyResult",
    "Problem",
    "Schedule",
    "build_problem",
    "deterministic_policy",
    "get_policy",
    "lower_bound",
    "policy_names",
    "register_policy",
    "solve",
    "solve_problem",
]

logger = logging.getLogger(__name__)


def solve_problem(
    problem: Problem,
    policy: str | Policy = defaults.PLAN_POLICY,
    *,
    time_limit_s: float = defaults.PLAN_TIME_LIMIT_S,
    seed: int = 0,
    bound: LowerBound | None = None,
    on_plan: Callable[[Plan], None] | None = None,
    objective: str | None = None,
) -> Plan:
    """Run ``policy`` on an already-built :class:`Problem` and return a validated Plan.

    ``objective`` (``makespan``, ``completion``, ``online``) sets a policy name's
    objective option (saturn's; the baselines follow fixed rules); by default a
    policy object's own (a different one from a policy object's own is an error).
    A plan for completion or online also carries its mean completion time and a
    lower bound on it (:mod:`ray_saturn.solver.completion_bound`).
    """
    time_limit_s = number(time_limit_s, "solver time limit (s)", low=0, low_open=True)
    seed = whole(seed, "seed", low=0, high=MAX_SEED)
    if on_plan is not None and not callable(on_plan):
        raise SpecError(f"on_plan is a {type(on_plan).__name__}; give a function that takes each improving Plan, "
                        "or None")
    if isinstance(policy, str):
        pol = solver_policy(policy, objective=objective) if objective else get_policy(policy)
    elif isinstance(policy, Policy):
        pol = policy
    else:
        raise SpecError(f"policy is {policy!r}; give a policy name ({', '.join(policy_names())}) or a Policy")
    own = getattr(pol.options, "objective", None)
    if own is not None and objective is not None and parse_objective(objective) != own:
        raise SpecError(f"policy {pol.name} is set for the {own} objective, but objective={objective!r} was given: "
                        "give the objective once (the policy's option or the argument)")
    objective = own or parse_objective(objective)
    t0 = time.perf_counter()
    bound = bound or lower_bound(problem)

    def emit(sched: Schedule) -> None:
        if on_plan is not None:
            on_plan(problem.to_plan(sched, policy=pol.name, lower_bound_s=bound.value,
                                    solve_time_s=time.perf_counter() - t0))

    result = pol.solve(problem, bound, time_limit_s=time_limit_s, seed=seed,
                       on_schedule=emit if on_plan is not None else None)
    lb = max(bound.value, result.proven_bound_s)
    status = "optimal" if result.optimal else None
    plan = problem.to_plan(result.schedule, policy=pol.name, lower_bound_s=lb,
                           solve_time_s=time.perf_counter() - t0, status=status)
    if objective != "makespan":
        cb = completion_lower_bound(problem)
        # From the plan's ends, not the schedule's: a running task the schedule "restarts" in place
        # carries on in the plan, without the start-up, so it ends sooner (Problem.to_plan).
        ends = {a.task: a.end_s for a in plan.assignments}
        weights = task_weights(problem.profile, problem.tasks)
        value = sum(w * ends[t] for t, w in zip(problem.tasks, weights, strict=True))
        plan.status = "optimal" if value <= cb.total * (1 + 1e-9) + 1e-9 else "feasible"
        plan.objective = objective
        plan.mean_completion_s = (value - cb.release_sum) / cb.weight_sum
        plan.completion_lower_bound_s = cb.mean_completion_s
    validate_plan(plan, problem.profile, problem.cluster, problem.context)
    logger.info("%s: makespan %.1f s, lower bound %.1f s (gap %.1f%%), %s in %.2f s",
                pol.name, plan.makespan_s, plan.lower_bound_s, 100 * plan.gap, plan.status, plan.solve_time_s)
    return plan


def solve(
    profile: ProfileTable,
    cluster: ClusterSpec,
    policy: str | Policy = defaults.PLAN_POLICY,
    *,
    context: PlanningContext | None = None,
    time_limit_s: float = defaults.PLAN_TIME_LIMIT_S,
    seed: int = 0,
    on_plan: Callable[[Plan], None] | None = None,
    objective: str | None = None,
) -> Plan:
    """Plan every task of ``profile`` on ``cluster`` with ``policy`` (for ``objective``, see :func:`solve_problem`).

    The plan is checked by the independent validator before it is returned.
    ``on_plan`` receives each improving plan while the search runs (the first
    comes from the heuristic, within a second for tens of tasks).
    """
    problem = build_problem(profile, cluster, context)
    return solve_problem(problem, policy, time_limit_s=time_limit_s, seed=seed, on_plan=on_plan, objective=objective)
