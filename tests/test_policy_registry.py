"""The policy registry (typed options, no silent duplicates) and the literal whole-node baseline."""

from __future__ import annotations

import pytest
from helpers import instances
from hypothesis import given, settings

from ray_saturn import ClusterSpec, ProfileTable, validate_plan
from ray_saturn.errors import SaturnError
from ray_saturn.solver import Policy, PolicyResult, deterministic_policy, get_policy, register_policy, solve


def test_options_are_checked_by_name_and_type():
    assert get_policy("saturn").options.deterministic is False
    assert get_policy("saturn", deterministic=True).options.deterministic is True
    typo = r"policy 'saturn' has no option 'determinstic'; it takes (\w+, )*deterministic\b"
    with pytest.raises(SaturnError, match=typo):
        get_policy("saturn", determinstic=True)
    with pytest.raises(SaturnError, match="option deterministic=1: give a bool"):
        get_policy("saturn", deterministic=1)
    with pytest.raises(SaturnError, match="'fifo-min-gpus' has no option 'deterministic'; it takes none"):
        get_policy("fifo-min-gpus", deterministic=True)
    with pytest.raises(SaturnError, match="unknown policy 'nosuch'"):
        get_policy("nosuch")


def test_deterministic_policy_sets_the_option_only_where_there_is_one():
    assert deterministic_policy("saturn").options.deterministic is True
    assert deterministic_policy("fifo-fastest").name == "fifo-fastest"


def test_a_second_class_under_a_registered_name_raises():
    class Impostor(Policy):
        name = "fifo-fastest"

        def solve(self, problem, bound, *, time_limit_s, seed, on_schedule=None):
            raise AssertionError("never called")

    with pytest.raises(SaturnError, match=r"already registered by ray_saturn\.solver\.policies\.fifo"):
        register_policy(Impostor)
    assert type(get_policy("fifo-fastest")).__name__ == "FifoFastest"
    # Registering the same class again (a module imported twice) is not a duplicate.
    register_policy(type(get_policy("fifo-fastest")))


def test_policy_options_must_be_a_dataclass():
    class Bad(Policy):
        name = "bad-options"
        Options = dict

        def solve(self, problem, bound, *, time_limit_s, seed, on_schedule=None):
            return PolicyResult(problem.schedule([], [], []))

    with pytest.raises(TypeError, match="Options must be a dataclass"):
        register_policy(Bad)


def _rows(task, configs, steps=10):
    return [
        {"task": task, "strategy": "ddp", "gpus": g, "nodes": k, "step_time_s": st, "steps": steps}
        for g, k, st in configs
    ]


def test_fifo_whole_node_gives_each_task_a_node_of_its_own():
    # Every task scales to 8 GPUs over 2 nodes: fifo-max-gpus runs them one at a time on the whole
    # cluster; fifo-whole-node runs each on one node (its fastest one-node option), two at a time.
    rows = []
    for t in ("a", "b", "c", "d"):
        rows += _rows(t, [(1, 1, 8.0), (2, 1, 4.0), (4, 1, 2.0), (8, 2, 1.0)])
    profile, cluster = ProfileTable.from_rows(rows), ClusterSpec.uniform(2, 4)
    maxg = solve(profile, cluster, "fifo-max-gpus")
    whole = solve(profile, cluster, "fifo-whole-node")
    assert {a.gpus for a in maxg.assignments} == {8} and maxg.makespan_s == pytest.approx(40.0)
    assert {(a.gpus, len(a.nodes)) for a in whole.assignments} == {(4, 1)}
    assert whole.makespan_s == pytest.approx(40.0)


def test_fifo_whole_node_holds_the_node_even_when_the_task_uses_part_of_it():
    # a and b run best on 1 GPU; a whole node each, so b waits for nothing but c waits for a node.
    rows = _rows("a", [(1, 1, 1.0)]) + _rows("b", [(1, 1, 1.0)]) + _rows("c", [(1, 1, 1.0)])
    plan = solve(ProfileTable.from_rows(rows), ClusterSpec.uniform(2, 4), "fifo-whole-node")
    starts = {a.task: a.start_s for a in plan.assignments}
    assert starts == {"a": 0.0, "b": 0.0, "c": 10.0}
    assert solve(ProfileTable.from_rows(rows), ClusterSpec.uniform(2, 4), "fifo-min-gpus").makespan_s == 10.0


def test_fifo_whole_node_puts_a_multi_node_only_task_on_the_fewest_whole_nodes():
    rows = _rows("wide", [(8, 2, 3.0), (12, 3, 2.0)]) + _rows("one", [(2, 1, 1.0)])
    plan = solve(ProfileTable.from_rows(rows), ClusterSpec.uniform(3, 4), "fifo-whole-node")
    by = {a.task: a for a in plan.assignments}
    assert (by["wide"].gpus, len(by["wide"].nodes)) == (8, 2)
    assert by["one"].start_s == 0.0 and not set(by["one"].nodes) & set(by["wide"].nodes)


@settings(max_examples=25, deadline=None)
@given(inst=instances())
def test_fifo_whole_node_never_shares_a_node(inst):
    profile, cluster, ctx = inst
    plan = solve(profile, cluster, "fifo-whole-node", context=ctx)
    validate_plan(plan, profile, cluster, ctx)
    a = plan.assignments
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            overlap = a[i].start_s < a[j].end_s - 1e-9 and a[j].start_s < a[i].end_s - 1e-9
            assert not (overlap and set(a[i].nodes) & set(a[j].nodes)), (a[i], a[j])
    # first come, first served: in profile order, no task starts before the one before it
    starts = [x.start_s for x in sorted(a, key=lambda x: profile.tasks.index(x.task))]
    assert starts == sorted(starts)


def test_an_objective_given_twice_must_agree():
    profile = ProfileTable.from_rows([
        {"task": t, "strategy": "ddp", "gpus": 1, "step_time_s": s, "steps": 10} for t, s in (("a", 1.0), ("b", 2.0))
    ])
    cluster = ClusterSpec.uniform(1, 1)
    completion = get_policy("saturn", deterministic=True, objective="completion")
    with pytest.raises(SaturnError, match="objective"):
        solve(profile, cluster, completion, objective="makespan", time_limit_s=2)
    plan = solve(profile, cluster, completion, objective="completion", time_limit_s=2)
    assert plan.objective == "completion"
    assert [a.task for a in sorted(plan.assignments, key=lambda a: a.start_s)] == ["a", "b"]
    assert solve(profile, cluster, completion, time_limit_s=2).objective == "completion"


def test_plan_with_inputs_of_the_wrong_type_is_one_line():
    import ray_saturn

    profile = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 1}])
    cluster = ClusterSpec.uniform(1, 1)
    for args, kwargs, message in [
        ((None, cluster), {}, "profile is a NoneType; give a ProfileTable"),
        (("p.csv", cluster), {}, "profile is a str; give a ProfileTable .*ProfileTable.read"),
        ((profile, None), {}, "cluster is a NoneType; give a ClusterSpec"),
        ((profile, {"nodes": []}), {}, "cluster is a dict; give a ClusterSpec"),
        ((profile, cluster), {"policy": None}, "policy is None; give a policy name"),
        ((profile, cluster), {"policy": 5}, "policy is 5; give a policy name"),
    ]:
        with pytest.raises(SaturnError, match=message):
            ray_saturn.plan(*args, **kwargs)


def test_saturn_plans_without_a_seed_baseline_that_raises(monkeypatch, caplog):
    """A seed baseline's failure is logged and left out; saturn's plan does not fail with it."""
    import ray_saturn.solver.policies.saturn as saturn_mod

    class Broken(Policy):
        name = "test-broken-baseline"

        def solve(self, problem, bound, *, time_limit_s, seed, on_schedule=None):
            raise SaturnError("broken on purpose")

    import ray_saturn.solver.policy as registry

    monkeypatch.setitem(registry._REGISTRY, Broken.name, Broken)  # gone again after the test
    monkeypatch.setattr(saturn_mod, "SEED_BASELINES", (*saturn_mod.SEED_BASELINES, "test-broken-baseline"))
    prof = ProfileTable.from_rows([{"task": t, "strategy": "ddp", "gpus": g, "step_time_s": 1.0 / g, "steps": 100}
                                   for t in ("a", "b") for g in (1, 2)])
    cluster = ClusterSpec.uniform(1, 2)
    plan = solve(prof, cluster, "saturn", time_limit_s=1)
    validate_plan(plan, prof, cluster)
    assert "seed baseline test-broken-baseline failed (broken on purpose)" in caplog.text
