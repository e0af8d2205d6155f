"""Property tests: every policy returns a valid plan, never below the lower bound."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_saturn import ClusterSpec, PlanningContext, ProfileTable, validate_plan
from ray_saturn.solver import build_problem, lower_bound, policy_names, solve


@st.composite
def instances(draw):
    n_nodes = draw(st.integers(1, 3))
    caps = draw(st.lists(st.integers(1, 8), min_size=n_nodes, max_size=n_nodes))
    cluster = ClusterSpec.from_dict({"nodes": [{"name": f"n{i}", "gpus": g} for i, g in enumerate(caps)]})
    rows = []
    n_tasks = draw(st.integers(1, 8))
    for t in range(n_tasks):
        steps = draw(st.integers(1, 1000))
        configs = {(1, 1)}
        for _ in range(draw(st.integers(0, 4))):
            k = draw(st.integers(1, n_nodes))
            per = draw(st.integers(1, max(caps)))
            configs.add((per * k, k))
        for strategy in draw(st.sets(st.sampled_from(["ddp", "fsdp", "pipeline"]), min_size=1, max_size=2)):
            for gpus, k in sorted(configs):
                feasible = draw(st.booleans()) if (gpus, k) != (1, 1) else True
                step = draw(st.floats(0.001, 100.0, allow_nan=False, allow_infinity=False))
                rows.append(
                    {
                        "task": f"task-{t}",
                        "strategy": strategy,
                        "gpus": gpus,
                        "nodes": k,
                        "steps": steps,
                        "step_time_s": step if feasible else None,
                        "feasible": feasible,
                    }
                )
    profile = ProfileTable.from_rows(rows)
    release = {}
    if draw(st.booleans()):
        for t in profile.tasks:
            release[t] = draw(st.floats(0, 1000, allow_nan=False))
    avail = {}
    if draw(st.booleans()):
        avail[cluster.nodes[0].name] = draw(st.floats(0, 500, allow_nan=False))
    return profile, cluster, PlanningContext(release_s=release, node_available_s=avail)


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("policy", policy_names())
@SETTINGS
@given(inst=instances())
def test_every_policy_gives_a_valid_plan_above_the_bound(policy, inst):
    profile, cluster, ctx = inst
    plan = solve(profile, cluster, policy, context=ctx, time_limit_s=0.5, seed=1)
    validate_plan(plan, profile, cluster, ctx)  # again, independently of solve()
    bound = lower_bound(build_problem(profile, cluster, ctx))
    assert plan.makespan_s >= bound.value * (1 - 1e-6) - 1e-9
    assert plan.lower_bound_s <= plan.makespan_s * (1 + 1e-9) + 1e-9
    assert {a.task for a in plan.assignments} == set(profile.tasks)


@SETTINGS
@given(inst=instances())
def test_saturn_is_no_worse_than_any_baseline(inst):
    profile, cluster, ctx = inst
    saturn = solve(profile, cluster, "saturn", context=ctx, time_limit_s=0.5)
    from ray_saturn.solver.policies.saturn import SEED_BASELINES

    assert set(SEED_BASELINES) == set(policy_names()) - {"saturn", "random"}
    for policy in SEED_BASELINES:
        base = solve(profile, cluster, policy, context=ctx)
        assert saturn.makespan_s <= base.makespan_s * (1 + 1e-9) + 1e-6, policy


@given(inst=instances(), seed=st.integers(0, 3))
@settings(max_examples=10, deadline=None)
def test_saturn_is_deterministic_for_a_seed(inst, seed):
    from ray_saturn.solver.policies.saturn import SaturnPolicy

    profile, cluster, ctx = inst
    a = solve(profile, cluster, SaturnPolicy(deterministic=True), context=ctx, time_limit_s=0.3, seed=seed)
    b = solve(profile, cluster, SaturnPolicy(deterministic=True), context=ctx, time_limit_s=0.3, seed=seed)
    assert [x.to_dict() for x in a.assignments] == [x.to_dict() for x in b.assignments]
