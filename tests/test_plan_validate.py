"""Contract 2: the plan's JSON and the independent validator, one test per broken rule."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from ray_saturn import Assignment, ClusterSpec, Plan, PlanError, PlanningContext, RunningTask, validate_plan
from ray_saturn.solver import solve

CLUSTER = ClusterSpec.uniform(2, 2)


def good_plan():
    # a: 2 GPUs 60 s on node-0; b: 4 GPUs over 2 nodes 30 s after a; c: 2 GPUs 20 s on node-1.
    return Plan(
        "hand",
        90.0,
        80.0,
        0.0,
        "feasible",
        [
            Assignment("a", "ddp", 2, ("node-0",), 0.0, 60.0),
            Assignment("b", "fsdp", 4, ("node-0", "node-1"), 60.0, 90.0),
            Assignment("c", "ddp", 2, ("node-1",), 0.0, 20.0),
        ],
    )


def test_good_plan_passes_and_round_trips(small_profile):
    plan = good_plan()
    validate_plan(plan, small_profile, CLUSTER)
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert set(plan.to_dict()) == {"policy", "makespan_s", "lower_bound_s", "solve_time_s", "status", "assignments"}


def mutate(plan, i, **kw):
    out = dataclasses.replace(plan, assignments=list(plan.assignments))
    out.assignments[i] = dataclasses.replace(out.assignments[i], **kw)
    return out


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: mutate(p, 0, gpus=3), "is not a profiled configuration"),
        (lambda p: mutate(p, 0, end_s=61.0), "runs 61.000000 s but the profile says"),
        (lambda p: mutate(p, 2, start_s=65.0, end_s=85.0), "node 'node-1' holds 4 GPUs at 65.000 s"),
        (lambda p: mutate(p, 1, nodes=("node-0", "node-0")), "are not distinct"),
        (lambda p: mutate(p, 0, nodes=("node-9",)), "node 'node-9' is not in the cluster"),
        (lambda p: mutate(p, 1, start_s=50.0, end_s=80.0), "holds 4 GPUs at 50.000 s"),
        (lambda p: dataclasses.replace(p, assignments=p.assignments[:2]), "no assignment for task(s) c"),
        (lambda p: dataclasses.replace(p, assignments=[*p.assignments, p.assignments[0]]), "appears twice"),
        (lambda p: dataclasses.replace(p, makespan_s=80.0), "makespan 80.0 is not its last end time 90.0"),
        (lambda p: dataclasses.replace(p, lower_bound_s=95.0), "lower bound of 95 s above its own makespan of 90 s"),
        (lambda p: dataclasses.replace(p, status="great"), "status 'great' must be one of"),
        (lambda p: mutate(p, 0, start_s=-5.0, end_s=55.0), "before time 0"),
    ],
)
def test_each_broken_rule_is_caught(small_profile, change, message):
    with pytest.raises(PlanError) as exc:
        validate_plan(change(good_plan()), small_profile, CLUSTER)
    assert message in str(exc.value)


def test_infeasible_rows_and_small_nodes(small_profile):
    from ray_saturn import ProfileTable

    prof = ProfileTable.from_rows(
        [
            {"task": "a", "strategy": "ddp", "gpus": 4, "step_time_s": None, "steps": 1, "feasible": False},
            {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 1},
        ]
    )
    bad = Plan("x", 1, 0, 0, "feasible", [Assignment("a", "ddp", 4, ("node-0",), 0, 1)])
    with pytest.raises(PlanError, match="marked infeasible"):
        validate_plan(bad, prof, CLUSTER)
    small = ClusterSpec.uniform(1, 1)
    bad = Plan("x", 1, 0, 0, "feasible", [Assignment("a", "ddp", 2, ("node-0",), 0, 1)])
    with pytest.raises(PlanError, match="needs 2 GPUs on node 'node-0', which has 1"):
        validate_plan(bad, prof, small)


def test_context_rules(small_profile):
    plan = good_plan()
    with pytest.raises(PlanError, match=r"before its release at 5\.000 s"):
        validate_plan(plan, small_profile, CLUSTER, PlanningContext(release_s={"a": 5.0}))
    with pytest.raises(PlanError, match="before it is available"):
        validate_plan(plan, small_profile, CLUSTER, PlanningContext(node_available_s={"node-1": 1.0}))
    # c running on node-1 and kept in place: fine as is.
    ctx = PlanningContext(running=(RunningTask("c", "ddp", 2, ("node-1",), restart_s=7.0),))
    validate_plan(plan, small_profile, CLUSTER, ctx)
    # a moved from node-1 to node-0 must pay the restart.
    ctx = PlanningContext(running=(RunningTask("a", "ddp", 2, ("node-1",), restart_s=7.0),))
    with pytest.raises(PlanError, match=r"set-up is 0\.0 s but must be 7\.0 s"):
        validate_plan(plan, small_profile, CLUSTER, ctx)
    ctx = PlanningContext(running=(RunningTask("a", "ddp", 2, ("node-0",), restart_s=7.0, movable=False),))
    with pytest.raises(PlanError, match="may not be moved"):
        validate_plan(mutate(plan, 0, gpus=1, nodes=("node-0",), end_s=100.0), small_profile, CLUSTER, ctx)


def test_json_keeps_each_runtime_exact():
    # Rounded apart to 6 decimals, start 10.0000004999 and end 13.0000006 became 10.0 and 13.000001:
    # end_s - start_s missed the runtime 3.0000001 by 9e-7.
    a = Assignment("a", "ddp", 2, ("node-0",), 10.0000004999, 10.0000004999 + 3.0000001)
    plan = Plan("hand", a.end_s, 0.0, 0.0, "feasible", [a])
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.assignments[0].duration_s == a.duration_s
    assert back.makespan_s == max(b.end_s for b in back.assignments)


def test_solved_plan_json_ends_are_starts_plus_runtimes():
    from ray_saturn import ProfileTable

    rows = [{"task": f"t{i}", "strategy": "ddp", "gpus": 2, "step_time_s": 0.1234567 * (i + 1), "steps": 7 + i,
             "startup_s": 0.3333333} for i in range(6)]
    profile = ProfileTable.from_rows(rows)
    plan = Plan.from_json(solve(profile, CLUSTER, "fifo-min-gpus").to_json())
    runtime = {c.task: c.runtime_s for t in profile.tasks for c in profile.configs(t)}
    assert any(a.start_s > 0 for a in plan.assignments)
    for a in plan.assignments:
        assert a.end_s - a.start_s == pytest.approx(runtime[a.task], rel=1e-15, abs=1e-12), a
    validate_plan(plan, profile, CLUSTER, tol=1e-12)


def test_malformed_plan_json():
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.from_json("{")
    with pytest.raises(PlanError, match="missing"):
        Plan.from_json("{}")
    with pytest.raises(PlanError, match="malformed assignment"):
        Plan.from_json('{"policy":"x","makespan_s":1,"lower_bound_s":0,"status":"feasible","assignments":[{}]}')


@pytest.mark.parametrize(
    "change, message",
    [
        ({"makespan_s": "abc"}, "the plan's makespan_s is 'abc'; give a number of seconds"),
        ({"lower_bound_s": None}, "the plan's lower_bound_s is None"),
        ({"solve_time_s": [1]}, "the plan's solve_time_s is [1]"),
        ({"assignments": [5]}, "malformed assignment 5: an assignment is an object"),
        ({"assignments": [{"task": "a"}]}, "'strategy' is missing"),
        ({"assignments": [{"task": "a", "strategy": "ddp", "gpus": 1, "nodes": "node-0", "start_s": 0, "end_s": 1}]},
         "nodes is 'node-0'; give a list of node names"),
    ],
)
def test_malformed_plan_fields_are_plan_errors(change, message):
    """A plan read back with a field of the wrong kind: a PlanError naming it, not a ValueError or TypeError
    (and a node name given as a string no longer reads as one node per letter)."""
    data = {"policy": "x", "makespan_s": 1, "lower_bound_s": 1, "status": "feasible", "assignments": [], **change}
    with pytest.raises(PlanError, match=re.escape(message)):
        Plan.from_json(json.dumps(data))


def test_plan_from_json_of_the_wrong_kind_is_a_plan_error():
    with pytest.raises(PlanError, match="the plan is a NoneType; give its JSON text"):
        Plan.from_json(None)
    with pytest.raises(PlanError, match="nested too deeply"):
        Plan.from_json("[" * 100_000 + "]" * 100_000)


def test_solve_refuses_a_policy_whose_plan_breaks_the_rules(small_profile):
    """solve() checks every plan with the validator: a policy that overfills a node is refused."""
    from ray_saturn.solver import Policy, PolicyResult

    class EverythingAtOnce(Policy):
        name = "everything-at-once"

        def solve(self, problem, bound, *, time_limit_s, seed, on_schedule=None):
            fastest = problem.choose(lambda t, o: o.duration_s)
            nodes = [tuple(range(problem.options[t][c].k)) for t, c in enumerate(fastest)]
            return PolicyResult(problem.schedule(fastest, [0.0] * problem.num_tasks, nodes))

    with pytest.raises(PlanError, match=r"node 'node-0' holds \d+ GPUs at 0.000 s but has 2"):
        solve(small_profile, CLUSTER, EverythingAtOnce())


def test_json_never_puts_the_bound_above_the_makespan_by_rounding():
    """A plan at its bound (optimal) read back from JSON: the bound was rounded to 6 decimals and the
    makespan not, so 1.76171875 came back with a bound of 1.761719 above it."""
    from ray_saturn.plan import Assignment, Plan

    a = Assignment(task="a", strategy="ddp", gpus=1, nodes=("node-0",), start_s=0.0, end_s=1.76171875)
    plan = Plan("saturn", 1.76171875, 1.76171875, 0.1, "optimal", [a])
    back = Plan.from_dict(json.loads(plan.to_json()))
    assert back.lower_bound_s <= back.makespan_s == plan.makespan_s


def test_validate_plan_arguments_of_the_wrong_kind_are_one_line(small_profile):
    """They were AttributeErrors from inside the checker ('str' object has no attribute 'status')."""
    from ray_saturn import SpecError

    plan = solve(small_profile, CLUSTER, "fifo-min-gpus")
    with pytest.raises(SpecError, match=r"validate_plan: plan is a str; give a Plan \(Plan.from_json"):
        validate_plan("plan.json", small_profile, CLUSTER)
    with pytest.raises(SpecError, match=r"validate_plan: profile is a str; give a ProfileTable"):
        plan.validate("profile.csv", CLUSTER)
    with pytest.raises(SpecError, match=r"validate_plan: cluster is a NoneType; give a ClusterSpec"):
        validate_plan(plan, small_profile, None)
    with pytest.raises(SpecError, match=r"validate_plan: context is a int; give a PlanningContext or None"):
        validate_plan(plan, small_profile, CLUSTER, 5)
