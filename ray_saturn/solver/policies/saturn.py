"""``saturn``: the default policy: the heuristic's plan first, then the exact SPASE model on CP-SAT.

The model and its maths are in :mod:`ray_saturn.solver.cpsat`; the fast plan
in :mod:`ray_saturn.solver.heuristic`; the decomposition for clusters too big
for the exact model in :mod:`ray_saturn.solver.decompose`, which this policy
hands itself as the solver of each part.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ray_saturn.errors import SaturnError, SpecError
from ray_saturn.limits import solver_gap
from ray_saturn.solver.bounds import lower_bound
from ray_saturn.solver.completion import completion_search
from ray_saturn.solver.cpsat import SAFETY_FACTOR, solve_cpsat
from ray_saturn.solver.decompose import decomposed_start
from ray_saturn.solver.heuristic import heuristic_schedule
from ray_saturn.solver.listsched import list_schedule, replay_schedule
from ray_saturn.solver.objective import parse_objective, task_weights
from ray_saturn.solver.packing_cpsat import MAX_DEVICE_INTERVALS, device_intervals, solve_packing_cpsat
from ray_saturn.solver.policy import Policy, PolicyResult, get_policy, register_policy
from ray_saturn.solver.problem import Problem, Schedule

logger = logging.getLogger(__name__)


def _seed_schedules(problem: Problem, bound, seed: int) -> list[Schedule]:
    """The :data:`SEED_BASELINES`' schedules; one that raises is left out with a warning (the search
    does not need it, and the plan is still checked by the validator)."""
    out = []
    for name in SEED_BASELINES:
        try:
            out.append(get_policy(name).solve(problem, bound, time_limit_s=0, seed=seed).schedule)
        except SaturnError as exc:  # a baseline's failure must not fail saturn's plan
            logger.warning("seed baseline %s failed (%s); planning without its schedule", name, exc)
    return out

#: Above this many node intervals the exact model is not built (too big to help in time).
MAX_INTERVALS = 12_000
#: Local-search decodings per second of time limit in deterministic mode.
EVALS_PER_SECOND = 300
#: The baselines whose schedules seed the search, so saturn is never worse than any of them.
SEED_BASELINES = ("fifo-fastest", "fifo-min-gpus", "fifo-max-gpus", "fifo-whole-node", "optimus-greedy")


@dataclass(frozen=True)
class SaturnOptions:
    """``deterministic``: limits counted in work, not seconds (the plan depends only on inputs and seed).
    ``objective``: ``makespan`` (default), ``completion`` or ``online`` (see
    :mod:`ray_saturn.solver.objective`)."""

    deterministic: bool = False
    objective: str = "makespan"
    #: ``makespan``: stop searching once the plan is within this fraction of the lower bound (0:
    #: search the whole time limit unless the bound itself is met). A run's driver sets it
    #: (``DriverConfig.solver_gap``): its re-plans share the CPU with the training they plan.
    gap: float = 0.0
    #: ``online``/``completion``: task-seconds charged per GPU-second a plan uses, the wait it causes
    #: jobs expected to arrive (the controller sets it from the recent arrival rate); 0 by default.
    area_weight: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "objective", parse_objective(self.objective))
        if not self.area_weight >= 0:
            raise SpecError(f"area_weight is {self.area_weight}; give a number >= 0")
        solver_gap(self.gap, "gap", error=SpecError)


@register_policy
class SaturnPolicy(Policy):
    """The default policy: heuristic first plan, then the exact model where it fits.

    Small and medium problems (at most :data:`MAX_INTERVALS` node intervals)
    give the heuristic a short share of the time limit and CP-SAT the rest;
    larger ones spend the whole limit in the heuristic's local search, which
    improves faster than CP-SAT can load and search a model that size.

    With ``deterministic=True`` the limits are counted in work, not seconds
    (local-search decodings and CP-SAT's deterministic time on one worker), so
    the plan depends only on the inputs and the seed.
    """

    name = "saturn"
    Options = SaturnOptions

    @property
    def deterministic(self) -> bool:
        return self.options.deterministic

    def solve_part(self, sub: Problem, time_limit_s: float, seed: int) -> Schedule:
        """The decomposition's solver for one part: this policy on the part alone."""
        return self.solve(sub, lower_bound(sub), time_limit_s=time_limit_s, seed=seed).schedule

    def solve(self, problem, bound, *, time_limit_s, seed, on_schedule=None):
        if self.options.objective != "makespan":
            return self._solve_completion(problem, bound, time_limit_s=time_limit_s, seed=seed,
                                          on_schedule=on_schedule)
        t0 = time.perf_counter()
        gap = self.options.gap
        target = bound.value * (1 + max(gap, 1e-9))

        def seen(s: Schedule) -> None:
            if on_schedule:
                on_schedule(s)

        # The baselines are cheap: their schedules seed the search, so saturn is never worse.
        baselines = _seed_schedules(problem, bound, seed)
        # A re-plan also starts from the plan being followed, so it is never predicted worse than carrying on.
        hint = problem.incumbent_hint()
        if hint is not None:
            choice, order, nodes_of = hint
            baselines += [replay_schedule(problem, choice, order, nodes_of), list_schedule(problem, choice, order)]
        n_intervals = sum(len(o) for o in problem.options) * problem.num_nodes
        exact = n_intervals <= MAX_INTERVALS
        if problem.packing:  # shares or GPU types: the device-level model, never a decomposition
            n_intervals = device_intervals(problem)
            exact = n_intervals <= MAX_DEVICE_INTERVALS
        share = min(5.0, 0.2 * time_limit_s) if exact else time_limit_s
        pop = None
        if not exact and not problem.packing:  # too big for the exact model: start from a decomposition
            pop = decomposed_start(problem, bound, self.solve_part, time_limit_s=time_limit_s, seed=seed,
                                   deterministic=self.deterministic, on_schedule=seen)
            if pop is not None and pop.makespan <= target:
                return self._result(pop, bound.value)
            share = max(0.0, time_limit_s - (time.perf_counter() - t0)) if pop is not None else share
        heur = heuristic_schedule(
            problem,
            bound,
            time_limit_s=max(10.0, SAFETY_FACTOR * share) if self.deterministic else share,
            seed=seed,
            on_schedule=seen,
            max_evaluations=int(EVALS_PER_SECOND * share) if self.deterministic else None,
            candidates=baselines,
            gap=gap,
        )
        best = heur.schedule if pop is None or heur.schedule.makespan <= pop.makespan else pop
        if best.makespan <= target:
            return self._result(best, bound.value)
        remaining = time_limit_s - (time.perf_counter() - t0)
        if not exact:
            logger.info("exact model skipped: %d node intervals > %d", n_intervals, MAX_INTERVALS)
            return PolicyResult(best)
        if remaining < 0.05 and not self.deterministic:
            return PolicyResult(best)
        budget = time_limit_s - share if self.deterministic else remaining
        exact_model = solve_packing_cpsat if problem.packing else solve_cpsat
        result = exact_model(problem, heur.choice, heur.order, horizon_s=best.makespan, time_limit_s=budget,
                             seed=seed, on_schedule=seen, deterministic=self.deterministic, gap=gap,
                             stop_at_s=target if gap > 0 else None)
        if result is None:
            return PolicyResult(best)
        optimal = result.optimal
        if result.schedule.makespan < best.makespan - 1e-9:
            best = result.schedule
        else:
            optimal = optimal and abs(result.schedule.makespan - best.makespan) < 1e-9
        return PolicyResult(best, result.proven_bound_s, optimal)

    @staticmethod
    def _result(schedule: Schedule, bound_s: float) -> PolicyResult:
        """A schedule the search stopped at, within the gap of ``bound_s``: optimal if it meets it."""
        return PolicyResult(schedule, bound_s, schedule.makespan <= bound_s * (1 + 1e-9))

    def _solve_completion(self, problem, bound, *, time_limit_s, seed, on_schedule):
        """``completion`` / ``online``: :func:`~ray_saturn.solver.completion.completion_search`, with the
        baselines' schedules (and, for ``online``, a short makespan search) as makespan references."""
        if problem.packing:
            raise SpecError(
                f"objective {self.options.objective!r} does not yet plan shares of one GPU or GPU types; "
                "use objective 'makespan' (the default) for profiles with gpus < 1 or gpu_type"
            )
        t0 = time.perf_counter()
        reference = _seed_schedules(problem, bound, seed)
        if self.options.objective == "online":
            share = min(1.0, 0.1 * time_limit_s)
            heur = heuristic_schedule(
                problem,
                bound,
                time_limit_s=max(10.0, SAFETY_FACTOR * share) if self.deterministic else share,
                seed=seed,
                max_evaluations=int(EVALS_PER_SECOND * share) if self.deterministic else None,
                candidates=reference,
            )
            reference.append(heur.schedule)
            if self.options.area_weight <= 0:
                # No arrival price (arrivals stopped): the run ends with the jobs present, and the
                # guard keeps within ONLINE_SLACK of the best makespan known: the exact search's.
                mk = SaturnPolicy(deterministic=self.deterministic, gap=self.options.gap)
                reference.append(mk.solve(problem, bound, time_limit_s=0.5 * time_limit_s, seed=seed).schedule)
        weights = task_weights(problem.profile, problem.tasks)
        # Deterministic: the search's own evaluation budget decides; the clock is only a safety net.
        # Otherwise the search has what is left of the limit (the makespan references took their share).
        left = max(0.0, time_limit_s - (time.perf_counter() - t0))
        limit = max(10.0, SAFETY_FACTOR * time_limit_s) if self.deterministic else left
        found = completion_search(problem, self.options.objective, weights, reference=reference,
                                  area_weight=self.options.area_weight, time_limit_s=limit)
        if on_schedule:
            on_schedule(found.schedule)
        return PolicyResult(found.schedule)
