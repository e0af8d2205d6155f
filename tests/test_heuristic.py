"""The search ends by its own rules (stall, budget, bound, a gap to the bound), not by spinning to the deadline."""

from __future__ import annotations

import random

import pytest

import ray_saturn.solver.heuristic as heuristic
from ray_saturn import ClusterSpec, ProfileTable
from ray_saturn.context import PlanningContext
from ray_saturn.solver import build_problem, lower_bound


class _CountedRandom(random.Random):
    """A Random that refuses to draw more than ``LIMIT`` numbers (a spinning search draws millions)."""

    LIMIT = 1_000_000
    drawn = 0

    def random(self) -> float:
        type(self).drawn += 1
        if type(self).drawn > self.LIMIT:
            raise AssertionError(f"the local search drew {self.LIMIT} proposals without ending")
        return super().random()


def test_a_search_with_nothing_to_change_ends_without_waiting_for_its_deadline(monkeypatch):
    # One task with one option, started late by busy nodes: its makespan (550 s) is above the
    # bound (500 s), and every proposal (move it earlier, swap it with itself) changes nothing.
    # Each such proposal counts as one without improvement, so the search stalls out; before,
    # it drew proposals until the deadline (here 10 minutes).
    monkeypatch.setattr(heuristic.random, "Random", _CountedRandom)
    _CountedRandom.drawn = 0
    prof = ProfileTable.from_rows([{"task": "z", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 500}])
    problem = build_problem(prof, ClusterSpec.uniform(2, 2), PlanningContext(node_available_s={"node-0": 100.0,
                                                                                              "node-1": 50.0}))
    bound = lower_bound(problem)
    assert bound.value == pytest.approx(500.0)
    result = heuristic.heuristic_schedule(problem, bound, time_limit_s=600.0)
    assert result.schedule.makespan == pytest.approx(550.0)
    assert _CountedRandom.drawn <= 10 * heuristic.STALL


def _late_problem():
    # 550 s at best against a bound of 500 s: 10% over (see the test above).
    prof = ProfileTable.from_rows([{"task": "z", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 500}])
    return build_problem(prof, ClusterSpec.uniform(2, 2), PlanningContext(node_available_s={"node-0": 100.0,
                                                                                           "node-1": 50.0}))


@pytest.mark.parametrize("gap, searched", [(0.0, True), (0.05, True), (0.2, False)])
def test_a_gap_stops_the_search_once_a_schedule_is_within_it_of_the_bound(monkeypatch, gap, searched):
    monkeypatch.setattr(heuristic.random, "Random", _CountedRandom)
    _CountedRandom.drawn = 0
    problem = _late_problem()
    result = heuristic.heuristic_schedule(problem, lower_bound(problem), time_limit_s=600.0, gap=gap)
    assert result.schedule.makespan == pytest.approx(550.0)
    assert (_CountedRandom.drawn > 0) is searched  # within 20% of the bound: no local search at all


def test_the_saturn_policy_with_a_gap_skips_the_exact_model_and_does_not_claim_optimality(monkeypatch):
    import ray_saturn.solver.policies.saturn as saturn
    from ray_saturn.solver.policy import get_policy

    calls = []

    def exact(*args, **kwargs):
        calls.append(kwargs)
        return None

    monkeypatch.setattr(saturn, "solve_cpsat", exact)
    problem = _late_problem()
    bound = lower_bound(problem)
    res = get_policy("saturn", gap=0.2).solve(problem, bound, time_limit_s=5.0, seed=0)
    assert res.schedule.makespan == pytest.approx(550.0) and not res.optimal and not calls
    res = get_policy("saturn", gap=0.05).solve(problem, bound, time_limit_s=5.0, seed=0)
    assert len(calls) == 1 and calls[0]["gap"] == 0.05 and calls[0]["stop_at_s"] == pytest.approx(525.0)
    get_policy("saturn").solve(problem, bound, time_limit_s=0.5, seed=0)
    assert calls[1]["gap"] == 0.0 and calls[1]["stop_at_s"] is None


def test_cp_sat_stops_at_the_first_schedule_under_its_stop_and_proves_no_more_than_it_reached(small_profile):
    from ray_saturn.plan import validate_plan
    from ray_saturn.solver.cpsat import solve_cpsat

    problem = build_problem(small_profile, ClusterSpec.uniform(2, 4))
    heur = heuristic.heuristic_schedule(problem, lower_bound(problem), time_limit_s=0.2, seed=0)
    res = solve_cpsat(problem, heur.choice, heur.order, horizon_s=heur.schedule.makespan, time_limit_s=20.0,
                      stop_at_s=1e12, gap=0.9)
    assert res is not None
    plan = problem.to_plan(res.schedule, policy="saturn", lower_bound_s=lower_bound(problem).value, solve_time_s=0.0)
    validate_plan(plan, problem.profile, problem.cluster, problem.context)
    assert res.optimal == (res.schedule.makespan <= res.proven_bound_s + 1e-6)


def test_a_run_asks_its_solver_for_the_gap_and_refuses_one_out_of_range():
    from ray_saturn import DriverConfig
    from ray_saturn.control import Controller
    from ray_saturn.errors import SaturnError

    prof = ProfileTable.from_rows([{"task": "z", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 5}])
    assert DriverConfig().solver_gap == 0.01
    ctl = Controller(prof, ClusterSpec.uniform(1, 1), "saturn-replan", solver_gap=0.02)
    assert ctl._solver_policy.options.gap == 0.02
    assert Controller(prof, ClusterSpec.uniform(1, 1), "saturn-replan")._solver_policy == "saturn"
    with pytest.raises(SaturnError, match=r"DriverConfig.solver_gap .* is 0.7; give a finite number from 0 to 0.5"):
        DriverConfig(solver_gap=0.7)
    with pytest.raises(SaturnError, match=r"solver gap .* is 1.0; give a finite number from 0 to 0.5"):
        Controller(prof, ClusterSpec.uniform(1, 1), "saturn-replan", solver_gap=1.0)
