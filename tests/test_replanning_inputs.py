"""Re-planning inputs: releases, running tasks pinned or moved at a restart cost, blocked nodes."""

from __future__ import annotations

import random

import pytest

from ray_saturn import (
    ClusterSpec,
    Incumbent,
    InfeasibleError,
    PlanningContext,
    ProfileError,
    ProfileTable,
    RunningTask,
    SpecError,
    validate_plan,
)
from ray_saturn.solver import build_problem, policy_names, solve
from ray_saturn.solver.listsched import replay_schedule
from ray_saturn.solver.policies.saturn import SaturnPolicy


def profile():
    return ProfileTable.from_rows(
        [
            {"task": "run", "strategy": "ddp", "gpus": 1, "step_time_s": 10.0, "steps": 10},
            {"task": "run", "strategy": "ddp", "gpus": 2, "step_time_s": 4.0, "steps": 10},
            {"task": "new", "strategy": "ddp", "gpus": 1, "step_time_s": 5.0, "steps": 4},
            {"task": "new", "strategy": "ddp", "gpus": 2, "step_time_s": 3.0, "steps": 4},
        ]
    )


def test_running_task_is_moved_only_when_it_pays():
    cluster = ClusterSpec.uniform(1, 2)
    # run on 1 GPU has 100 s left; on 2 GPUs it would take 40 s plus the restart.
    cheap = PlanningContext(running=(RunningTask("run", "ddp", 1, ("node-0",), restart_s=5.0),))
    plan = solve(profile(), cluster, context=cheap, time_limit_s=5)
    validate_plan(plan, profile(), cluster, cheap)
    assert plan.assignment("run").gpus == 2 and plan.assignment("run").setup_s == 5.0
    dear = PlanningContext(running=(RunningTask("run", "ddp", 1, ("node-0",), restart_s=500.0),))
    plan = solve(profile(), cluster, context=dear, time_limit_s=5)
    validate_plan(plan, profile(), cluster, dear)
    a = plan.assignment("run")
    assert (a.gpus, a.start_s, a.setup_s, a.end_s) == (1, 0.0, 0.0, 100.0)


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_respects_the_context(policy):
    cluster = ClusterSpec.uniform(2, 2)
    ctx = PlanningContext(
        release_s={"new": 30.0},
        running=(RunningTask("run", "ddp", 1, ("node-0",), restart_s=2.0),),
        node_available_s={"node-1": 50.0},
    )
    plan = solve(profile(), cluster, policy, context=ctx, time_limit_s=2)
    validate_plan(plan, profile(), cluster, ctx)
    assert plan.assignment("new").start_s >= 30.0


def test_pinned_task_that_cannot_move():
    cluster = ClusterSpec.uniform(1, 2)
    ctx = PlanningContext(running=(RunningTask("run", "ddp", 1, ("node-0",), restart_s=0.0, movable=False),))
    plan = solve(profile(), cluster, context=ctx, time_limit_s=2)
    assert plan.assignment("run").gpus == 1


def test_inconsistent_contexts_are_errors():
    cluster = ClusterSpec.uniform(1, 2)
    with pytest.raises(ProfileError, match="running task 'ghost' has no rows"):
        solve(profile(), cluster, context=PlanningContext(running=(RunningTask("ghost", "ddp", 1, ("node-0",)),)))
    with pytest.raises(InfeasibleError, match="not in the cluster"):
        solve(profile(), cluster, context=PlanningContext(running=(RunningTask("run", "ddp", 1, ("node-7",)),)))
    with pytest.raises(ProfileError, match="no profile row for its current configuration"):
        solve(profile(), cluster, context=PlanningContext(running=(RunningTask("run", "fsdp", 1, ("node-0",)),)))
    with pytest.raises(ProfileError, match="neither a task nor a node"):
        solve(profile(), cluster, context=PlanningContext(release_s={"nobody": 3.0}))
    with pytest.raises(SpecError, match="must be a finite time >= 0"):
        PlanningContext(release_s={"new": -1.0})
    with pytest.raises(SpecError, match="do not split evenly"):
        RunningTask("run", "ddp", 3, ("a", "b"))


def test_impossible_tasks_name_the_task():
    prof = ProfileTable.from_rows(
        [
            {"task": "huge", "strategy": "ddp", "gpus": 8, "step_time_s": 1.0, "steps": 1},
            {"task": "fine", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 1},
        ]
    )
    with pytest.raises(InfeasibleError, match=r"task 'huge' fits nowhere on this cluster.*2 nodes, at most 4 GPUs"):
        solve(prof, ClusterSpec.uniform(2, 4))
    prof = ProfileTable.from_rows(
        [
            {
                "task": "oom",
                "strategy": "ddp",
                "gpus": 1,
                "step_time_s": None,
                "steps": 1,
                "feasible": False,
                "reason": "CUDA out of memory",
            },
        ]
    )
    with pytest.raises(InfeasibleError, match=r"'oom' has no feasible configuration .*ddp on 1 GPU\(s\): CUDA out"):
        solve(prof, ClusterSpec.uniform(1, 1))


def test_incumbent_is_checked():
    with pytest.raises(SpecError, match="twice"):
        Incumbent(("a", "a"), {"a": ("ddp", 1, ("n0",))})
    with pytest.raises(SpecError, match="no placement for task"):
        Incumbent(("a", "b"), {"a": ("ddp", 1, ("n0",))})
    with pytest.raises(SpecError, match="split the GPUs evenly"):
        Incumbent(("a",), {"a": ("ddp", 3, ("n0", "n1"))})


def test_incumbent_hint_maps_configurations_nodes_and_order():
    rows = [
        {"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 10.0, "steps": 10},
        {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 6.0, "steps": 10},
        # fsdp on 2 GPUs is dominated by ddp on 2 GPUs and pruned.
        {"task": "a", "strategy": "fsdp", "gpus": 2, "step_time_s": 7.0, "steps": 10},
        {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 10.0, "steps": 10},
        {"task": "b", "strategy": "ddp", "gpus": 2, "step_time_s": 9.0, "steps": 10},
        {"task": "c", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10},
    ]
    prof = ProfileTable.from_rows(rows)
    cluster = ClusterSpec.uniform(2, 2)
    assert build_problem(prof, cluster).incumbent_hint() is None
    inc = Incumbent(("b", "a"), {"a": ("fsdp", 2, ("node-1",)), "b": ("ddp", 1, ("node-9",))})
    problem = build_problem(prof, cluster, PlanningContext(incumbent=inc))
    choice, order, nodes_of = problem.incumbent_hint()
    opt = [problem.options[t][c].config for t, c in enumerate(choice)]
    # a: the pruned fsdp row maps to its dominator, on its node; b: as given, but its node is gone;
    # c (not in the incumbent): its fastest option, placed when its turn comes.
    assert [(o.strategy, o.gpus) for o in opt] == [("ddp", 2), ("ddp", 1), ("ddp", 1)]
    assert nodes_of == [(1,), None, None]
    assert [problem.tasks[t] for t in order] == ["b", "a", "c"]
    # A node that no longer holds the task's GPUs (it came back smaller): placed when its turn comes.
    small = ClusterSpec.from_dict({"nodes": [{"name": "node-0", "gpus": 2}, {"name": "node-1", "gpus": 1}]})
    problem = build_problem(prof, small, PlanningContext(incumbent=inc))
    assert problem.incumbent_hint()[2][0] is None
    plan = solve(prof, small, context=PlanningContext(incumbent=inc), time_limit_s=1)
    validate_plan(plan, prof, small)


def test_incumbent_that_moves_a_running_task_is_replayed_as_a_move():
    rows = [{"task": "a", "strategy": "ddp", "gpus": g, "step_time_s": 8.0 / g, "steps": 10} for g in (1, 2)]
    rows.append({"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10})
    prof = ProfileTable.from_rows(rows)
    run = RunningTask("a", "ddp", 1, ("node-0",), restart_s=3.0)
    moved = Incumbent(("a", "b"), {"a": ("ddp", 2, ("node-1",)), "b": ("ddp", 1, ("node-0",))})
    problem = build_problem(prof, ClusterSpec.uniform(2, 2), PlanningContext(running=(run,), incumbent=moved))
    choice, _, nodes_of = problem.incumbent_hint()
    a = problem.tasks.index("a")
    assert (problem.options[a][choice[a]].gpus, problem.options[a][choice[a]].setup_s) == (2, 3.0)
    assert nodes_of[a] == (1,)
    # Pinned (not movable), or an incumbent that keeps it where it runs: it stays.
    kept = Incumbent(("a",), {"a": ("ddp", 1, ("node-0",))})
    for ctx in (
        PlanningContext(running=(RunningTask("a", "ddp", 1, ("node-0",), movable=False),), incumbent=moved),
        PlanningContext(running=(run,), incumbent=kept),
    ):
        problem = build_problem(prof, ClusterSpec.uniform(2, 2), ctx)
        choice, _, nodes_of = problem.incumbent_hint()
        assert problem.options[a][choice[a]].pinned and nodes_of[a] == (0,)


def _random_profile(rng: random.Random, tasks: int) -> ProfileTable:
    rows = []
    for i in range(tasks):
        base, steps = rng.uniform(0.5, 3.0), rng.randint(50, 400)
        for g in (1, 2, 4, 8):
            eff = rng.uniform(0.5, 1.0)
            rows.append(
                {"task": f"t{i}", "strategy": "ddp", "gpus": g, "step_time_s": base / (g * eff), "steps": steps}
            )
    return ProfileTable.from_rows(rows)


def _incumbent(plan) -> Incumbent:
    order = tuple(a.task for a in sorted(plan.assignments, key=lambda a: (a.start_s, a.task)))
    return Incumbent(order, {a.task: (a.strategy, a.gpus, a.nodes) for a in plan.assignments})


def test_replaying_a_plan_never_ends_a_task_later():
    rng = random.Random(3)
    cluster = ClusterSpec.uniform(3, 8)
    for seed in range(5):
        prof = _random_profile(rng, 25)
        plan = solve(prof, cluster, "optimus-greedy", seed=seed)
        problem = build_problem(prof, cluster, PlanningContext(incumbent=_incumbent(plan)))
        sched = replay_schedule(problem, *problem.incumbent_hint())
        for t, name in enumerate(problem.tasks):
            a = plan.assignment(name)
            assert sched.start[t] <= a.start_s + 1e-6
            assert tuple(problem.node_names[i] for i in sched.nodes[t]) == a.nodes
        validate_plan(problem.to_plan(sched, policy="replay", lower_bound_s=0.0, solve_time_s=0.0), prof, cluster)


def test_a_replan_is_never_predicted_worse_than_carrying_on():
    """A quick re-solve given the plan being followed is at most that plan's makespan."""
    rng = random.Random(7)
    cluster = ClusterSpec.uniform(3, 8)
    worse_without = 0
    for _ in range(3):
        prof = _random_profile(rng, 40)
        # Deterministic (limits counted in work): 0.3 s of work finds the very plans 1 s did (makespans
        # 886.4, 614.7 and 746.1 s), in about half the time.
        good = solve(prof, cluster, SaturnPolicy(deterministic=True), time_limit_s=0.3, seed=1)
        ctx = PlanningContext(incumbent=_incumbent(good))
        quick = SaturnPolicy(deterministic=True)
        replan = solve(prof, cluster, quick, context=ctx, time_limit_s=0.01, seed=2)
        validate_plan(replan, prof, cluster, ctx)
        assert replan.makespan_s <= good.makespan_s + 1e-6
        blind = solve(prof, cluster, quick, time_limit_s=0.01, seed=2)
        worse_without += blind.makespan_s > good.makespan_s + 1e-6
    assert worse_without > 0  # the incumbent is what kept the quick re-solves from doing worse


def test_planning_context_inputs_of_the_wrong_kind_are_one_line():
    """They were TypeErrors from inside (math.isfinite of a str, iterating an int), or, for nodes given as one
    string, a task on one node per letter."""
    from ray_saturn import PlanningContext, RunningTask, SpecError

    with pytest.raises(SpecError, match="running is a int; give a tuple of RunningTask"):
        PlanningContext(running=5)
    with pytest.raises(SpecError, match="running holds a str; give RunningTask"):
        PlanningContext(running=["a"])
    with pytest.raises(SpecError, match=r"release_s\['a'\] is '5'; give a number"):
        PlanningContext(release_s={"a": "5"})
    with pytest.raises(SpecError, match="node_available_s is a list; give a dict"):
        PlanningContext(node_available_s=[1.0])
    with pytest.raises(SpecError, match="running task 'a': nodes is 'node-0'; give a tuple of node names"):
        RunningTask("a", "ddp", 6, "node-0")
