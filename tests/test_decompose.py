"""The scale path: POP-style decomposition gives valid plans."""

from __future__ import annotations

import pytest
from helpers import moldable_profile

from ray_saturn import ClusterSpec, ProfileTable, validate_plan
from ray_saturn.solver import build_problem, lower_bound, solve
from ray_saturn.solver import decompose as dec
from ray_saturn.solver.policies import saturn as saturn_mod

PART = saturn_mod.SaturnPolicy(deterministic=True).solve_part


def _plan(problem, sched, bound):
    return problem.to_plan(sched, policy="pop", lower_bound_s=bound.value, solve_time_s=0.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_pop_schedule_is_valid_and_respects_the_groups(seed):
    profile, cluster = moldable_profile(40, 8, 4, seed=seed)
    problem = build_problem(profile, cluster)
    bound = lower_bound(problem)
    res = dec.pop_schedule(problem, bound, PART, parts=4, time_limit_s=0.8, seed=seed, deterministic=True)
    assert res is not None and res.parts == 4 and len(res.part_makespans) == 4
    validate_plan(_plan(problem, res.schedule, bound), profile, cluster)
    assert res.schedule.makespan >= bound.value * (1 - 1e-9)
    assert res.schedule.makespan <= max(res.part_makespans) + 1e-6  # compaction never makes it worse
    # Deterministic mode counts work, not seconds (its wall-clock safety net is 10x the limit).
    again = dec.pop_schedule(problem, bound, PART, parts=4, time_limit_s=0.8, seed=seed, deterministic=True)
    assert again.schedule.start == res.schedule.start and again.choice == res.choice


def test_pop_declines_what_it_cannot_split():
    # t0 only runs on all 4 nodes: no group of a 2-way split can hold it.
    rows = [{"task": "t0", "strategy": "ddp", "gpus": 8, "nodes": 4, "step_time_s": 1.0, "steps": 10}]
    rows += [{"task": f"t{i}", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10} for i in range(1, 5)]
    problem = build_problem(ProfileTable.from_rows(rows), ClusterSpec.uniform(4, 2))
    assert dec.choose_parts(problem) == 1
    assert dec.pop_schedule(problem, lower_bound(problem), PART, parts=2, time_limit_s=1.0) is None


def test_saturn_uses_the_decomposition_when_the_exact_model_is_too_big(monkeypatch):
    profile, cluster = moldable_profile(48, 8, 4, seed=2)
    calls = []
    real = dec.pop_schedule

    def spy(*args, **kwargs):
        res = real(*args, **kwargs)
        calls.append(res)
        return res

    monkeypatch.setattr(saturn_mod, "MAX_INTERVALS", 10)
    monkeypatch.setattr(dec, "DECOMPOSE_MIN_NODES", 4)
    monkeypatch.setattr(dec, "DECOMPOSE_MIN_TASKS", 8)
    monkeypatch.setattr(dec, "TASKS_PER_PART", 16)
    monkeypatch.setattr(dec, "pop_schedule", spy)
    plans = []
    plan = solve(profile, cluster, "saturn", time_limit_s=3.0, on_plan=plans.append)
    assert calls and calls[0] is not None
    validate_plan(plan, profile, cluster)
    assert plan.makespan_s <= calls[0].schedule.makespan + 1e-6  # never worse than the decomposition
    assert plans and plans[0].makespan_s >= plan.makespan_s
