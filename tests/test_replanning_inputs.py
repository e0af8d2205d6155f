"""Re-planning inputs: releases, running tasks pinned or moved at a restart cost, blocked nodes."""

from __future__ import annotations

import pytest

from ray_saturn import (
    ClusterSpec,
    InfeasibleError,
    PlanningContext,
    ProfileError,
    ProfileTable,
    RunningTask,
    SpecError,
    validate_plan,
)
from ray_saturn.solver import policy_names, solve


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
            {"task": "oom", "strategy": "ddp", "gpus": 1, "step_time_s": None, "steps": 1, "feasible": False},
        ]
    )
    with pytest.raises(InfeasibleError, match="task 'oom' has no feasible configuration"):
        solve(prof, ClusterSpec.uniform(1, 1))
