"""The Controller stepped one event at a time, as the runtime's driver and the simulator do."""

from __future__ import annotations

import pytest

from ray_saturn import ClusterSpec, NodeSpec, ProfileTable, SaturnError, validate_plan
from ray_saturn.control import (
    Controller,
    Launch,
    NodeAdded,
    NodeLost,
    Stop,
    TaskArrived,
    TaskFailed,
    TaskFinished,
    TaskState,
    Tick,
)


def _rows(*specs):
    rows = []
    for task, steps, options in specs:
        for gpus, st in options:
            rows.append({"task": task, "strategy": "ddp", "gpus": gpus, "step_time_s": st, "steps": steps})
    return ProfileTable.from_rows(rows)


def _checked_controller(profile, cluster, policy, **kw):
    plans = []

    def on_plan(plan, inp):
        validate_plan(plan, inp.profile, inp.cluster, inp.context)
        plans.append((plan, inp))

    ctl = Controller(profile, cluster, policy, solver_time_limit_s=1.0, on_plan=on_plan, deterministic=True, **kw)
    return ctl, plans


def test_static_run_launches_in_plan_order_and_frees_gpus():
    prof = _rows(("a", 10, [(2, 1.0)]), ("b", 10, [(2, 1.0)]), ("c", 10, [(1, 1.0)]))
    ctl, plans = _checked_controller(prof, ClusterSpec.uniform(1, 2), "saturn-static")
    first = ctl.start(0.0)
    assert len(first) == 1 and isinstance(first[0], Launch)
    assert ctl.free_gpus() == {"node-0": 2 - first[0].placement.gpus}
    t = 0.0
    finished = []
    actions = first
    while not ctl.done:
        running = [a for a in actions if isinstance(a, Launch)]
        assert running, "the controller stalled"
        a = running[0]
        t += 10.0
        finished.append(a.task)
        actions = ctl.handle(TaskFinished(time_s=t, task=a.task)) + running[1:]
    assert sorted(finished) == ["a", "b", "c"]
    assert len(plans) == 1 and ctl.moves == 0
    assert all(ctl.state(x).state is TaskState.FINISHED for x in "abc")


def test_arrival_is_planned_and_launched():
    prof = _rows(("a", 100, [(1, 1.0)]), ("b", 10, [(1, 1.0)]))
    ctl, plans = _checked_controller(prof, ClusterSpec.uniform(1, 2), "saturn-static")
    assert [a.task for a in ctl.start(0.0, arrived=["a"])] == ["a"]
    assert ctl.state("b").state is TaskState.PENDING
    out = ctl.handle(TaskArrived(time_s=5.0, task="b"))
    assert [a.task for a in out] == ["b"]
    assert len(plans) == 2 and plans[1][1].now_s == 5.0
    # The running task was pinned where it runs, and the static policy may not move it.
    (r,) = plans[1][1].context.running
    assert r.task == "a" and not r.movable
    with pytest.raises(SaturnError, match="arrived twice"):
        ctl.handle(TaskArrived(time_s=6.0, task="b"))


def test_failed_task_is_relaunched_with_its_progress_then_given_up():
    prof = _rows(("a", 100, [(1, 1.0)]))
    ctl, _ = _checked_controller(prof, ClusterSpec.uniform(1, 1), "saturn-static", max_failures=1)
    ctl.start(0.0)
    out = ctl.handle(TaskFailed(time_s=30.0, task="a", reason="worker died", steps_done=20))
    assert [(a.task, a.steps_done) for a in out] == [("a", 20)]
    plan_rows = ctl.plan.assignment("a")
    assert plan_rows.end_s - plan_rows.start_s == pytest.approx(80.0)  # remaining steps only
    out = ctl.handle(TaskFailed(time_s=40.0, task="a", reason="worker died again"))
    assert out == [] and ctl.state("a").state is TaskState.FAILED and ctl.done
    assert "again" in ctl.state("a").reason


def test_node_lost_requeues_its_tasks_and_replans_without_it():
    prof = _rows(("a", 100, [(2, 1.0)]), ("b", 100, [(2, 1.0)]))
    ctl, plans = _checked_controller(prof, ClusterSpec.uniform(2, 2), "saturn-static")
    launched = {a.task: a.placement.nodes[0] for a in ctl.start(0.0)}
    assert set(launched) == {"a", "b"}
    lost = launched["a"]
    out = ctl.handle(NodeLost(time_s=50.0, node=lost, steps_done={"a": 40}))
    assert ctl.state("a").steps_done == 40
    assert lost not in ctl.free_gpus()
    assert out == []  # the other node is busy with b
    assert lost not in plans[-1][1].cluster.names
    out = ctl.handle(TaskFinished(time_s=100.0, task="b"))
    assert [(a.task, a.placement.nodes, a.steps_done) for a in out] == [("a", (launched["b"],), 40)]
    with pytest.raises(SaturnError, match="not in the cluster"):
        ctl.handle(NodeLost(time_s=101.0, node=lost))


def test_a_task_ended_as_done_between_segments_finishes_and_one_never_run_cannot():
    # A Tune scheduler may stop a trial early while it waits between segments (paused for a move):
    # that is a finish, holding no GPUs, not a failure.
    prof = _rows(("a", 100, [(2, 1.0)]), ("b", 100, [(2, 1.0)]), ("c", 100, [(2, 1.0)]))
    ctl, _ = _checked_controller(prof, ClusterSpec.uniform(2, 2), "saturn-static")
    launched = {a.task: a.placement.nodes[0] for a in ctl.start(0.0)}
    assert set(launched) == {"a", "b"}
    with pytest.raises(SaturnError, match="not running"):
        ctl.handle(TaskFinished(time_s=10.0, task="c"))  # queued, never ran
    ctl.handle(NodeLost(time_s=50.0, node=launched["a"], steps_done={"a": 40}))
    assert ctl.state("a").state is TaskState.QUEUED and ctl.state("a").segments
    free = ctl.free_gpus()
    assert ctl.handle(TaskFinished(time_s=60.0, task="a")) == []
    a = ctl.state("a")
    assert a.state is TaskState.FINISHED and a.finished_s == 60.0 and a.failures == 0
    assert ctl.free_gpus() == free and "a" not in ctl.planned


def test_node_added_is_used_by_the_replanning_policy_only():
    prof = _rows(("a", 100, [(1, 1.0)]), ("b", 100, [(1, 1.0)]))
    for policy, expect in (("saturn-static", []), ("saturn-replan", ["b"])):
        ctl, _ = _checked_controller(prof, ClusterSpec.uniform(1, 1), policy)
        assert [a.task for a in ctl.start(0.0)] == ["a"]
        out = ctl.handle(NodeAdded(time_s=10.0, node=NodeSpec("node-9", 1)))
        assert [a.task for a in out if isinstance(a, Launch)] == expect, policy


def test_early_finish_triggers_a_replan_and_a_worthwhile_move():
    # a and b share the node on 1 GPU each; b finishes far earlier than planned. No task waits,
    # so the finish itself does not re-plan, but b's GPU falls idle while a runs on: that
    # re-plan moves a onto both GPUs (its restart cost is small against the gain).
    prof = _rows(("a", 1000, [(1, 1.0), (2, 0.6)]), ("b", 1000, [(1, 1.0)]))
    ctl, plans = _checked_controller(prof, ClusterSpec.uniform(1, 2), "saturn-replan", restart_s=5.0)
    assert {a.task: a.placement.gpus for a in ctl.start(0.0)} == {"a": 1, "b": 1}
    out = ctl.handle(TaskFinished(time_s=10.0, task="b"))
    stops = [a for a in out if isinstance(a, Stop)]
    launches = [a for a in out if isinstance(a, Launch)]
    assert [s.task for s in stops] == ["a"] and stops[0].target.gpus == 2
    assert [(a.task, a.placement.gpus, a.setup_s, a.steps_done) for a in launches] == [("a", 2, 5.0, 10)]
    rec = ctl.replans[-1]
    assert "idle on" in rec.reasons[0] and rec.moves[0].move and ctl.moves == 1
    assert rec.moves[0].predicted_gain_s > 5.0
    # Running 2x slower than the plan's estimate is an off-estimate event: another re-plan.
    ctl.report_progress("a", 20, 30.0, step_time_s=1.2)
    assert "runs at" in ctl.replans[-1].reasons[0] and len(plans) == 3
    assert ctl.state("a").estimate_step_time_s == pytest.approx(1.2)  # the new plan's estimate


def test_static_policy_neither_replans_on_deviation_nor_moves():
    prof = _rows(("a", 1000, [(1, 1.0), (2, 0.6)]), ("b", 1000, [(1, 1.0)]))
    ctl, plans = _checked_controller(prof, ClusterSpec.uniform(1, 2), "saturn-static", restart_s=5.0)
    ctl.start(0.0)
    assert ctl.handle(TaskFinished(time_s=10.0, task="b")) == []
    assert ctl.report_progress("a", 20, 30.0, step_time_s=5.0) == []
    assert len(plans) == 1 and ctl.moves == 0


def test_small_deviation_or_costly_move_keeps_the_task():
    # After b ends at 30 s, moving a to 2 GPUs ends at 30 + 300 + 970 x 0.6 = 912 s instead of
    # 1000 s: the solver proposes it, but the 88 s gain does not exceed the 300 s restart cost.
    prof = _rows(("a", 1000, [(1, 1.0), (2, 0.6)]), ("b", 1000, [(1, 1.0)]))
    ctl, _ = _checked_controller(prof, ClusterSpec.uniform(1, 2), "saturn-replan", restart_s=300.0)
    ctl.start(0.0)
    # 1% slow: its end moves 10 s, less than 2% of the 1000 s plan: no re-plan.
    assert ctl.report_progress("b", 20, 20.0, step_time_s=1.01) == []
    assert len(ctl.replans) == 1
    out = ctl.handle(TaskFinished(time_s=30.0, task="b"))
    assert not any(isinstance(a, Stop) for a in out) and ctl.moves == 0
    assert ctl.replans[-1].moves and not ctl.replans[-1].moves[0].move


def test_small_relative_deviation_of_a_long_task_replans():
    # 5% slow is within 10%, but over b's 980 remaining steps it moves b's end by 49 s,
    # more than 2% of the 1000 s plan.
    prof = _rows(("a", 1000, [(1, 1.0), (2, 0.6)]), ("b", 1000, [(1, 1.0)]))
    ctl, _ = _checked_controller(prof, ClusterSpec.uniform(1, 2), "saturn-replan", restart_s=300.0)
    ctl.start(0.0)
    ctl.report_progress("b", 20, 20.0, step_time_s=1.05)
    assert len(ctl.replans) == 2 and "end 49 s off" in ctl.replans[-1].reasons[0]
    static, _ = _checked_controller(prof, ClusterSpec.uniform(1, 2), "saturn-static", restart_s=300.0)
    static.start(0.0)
    assert static.report_progress("b", 20, 20.0, step_time_s=1.05) == [] and len(static.replans) == 1


def test_periodic_policy_wakes_up_and_replans():
    prof = _rows(("a", 100, [(1, 1.0)]), ("b", 200, [(1, 1.0)]))
    ctl, plans = _checked_controller(prof, ClusterSpec.uniform(1, 2), "saturn-periodic")
    ctl.start(0.0)
    wake = ctl.next_wakeup_s()
    assert wake == pytest.approx(20.0)  # 10% of the first plan's makespan (200 s)
    ctl.handle(Tick(time_s=wake))
    assert len(plans) == 2 and ctl.replans[-1].reasons == ["periodic"]
    assert ctl.next_wakeup_s() == pytest.approx(40.0)


def test_min_gap_defers_replans_to_a_wakeup():
    prof = _rows(("a", 100, [(1, 1.0)]), ("b", 100, [(1, 1.0)]), ("c", 100, [(1, 1.0)]))
    ctl, plans = _checked_controller(prof, ClusterSpec.uniform(1, 2), "saturn-static", min_replan_gap_s=50.0)
    ctl.start(0.0, arrived=["a"])
    assert ctl.handle(TaskArrived(time_s=10.0, task="b")) == []  # deferred
    assert ctl.next_wakeup_s() == pytest.approx(50.0)
    ctl.handle(TaskArrived(time_s=20.0, task="c"))
    out = ctl.handle(Tick(time_s=50.0))
    assert len(plans) == 2 and len(ctl.replans[-1].reasons) == 2
    assert [a.task for a in out] == ["b"]
    # A caller's reason asked for again while the gap holds is pending once.
    for t in (60.0, 70.0, 80.0):
        ctl.request_replan(t, "a better plan is ready")
    assert len(plans) == 2 and ctl.next_wakeup_s() == pytest.approx(100.0)
    ctl.handle(Tick(time_s=100.0))
    assert len(plans) == 3 and ctl.replans[-1].reasons == ["a better plan is ready"]


def test_bad_inputs_are_one_line_errors():
    prof = _rows(("a", 10, [(1, 1.0)]))
    with pytest.raises(SaturnError, match="restart cost"):
        Controller(prof, ClusterSpec.uniform(1, 1), "saturn-static", restart_s=-1)
    with pytest.raises(SaturnError, match="unknown policy"):
        Controller(prof, ClusterSpec.uniform(1, 1), "nope")
    ctl = Controller(prof, ClusterSpec.uniform(1, 1), "saturn-static")
    with pytest.raises(SaturnError, match="not running"):
        ctl.handle(TaskFinished(time_s=1.0, task="a"))
    with pytest.raises(SaturnError, match="not in the profile"):
        ctl.state("zzz")


def test_rolling_window_plans_a_few_queued_tasks_at_a_time():
    prof = _rows(*[(f"t{i}", 10 * (i + 1), [(1, 1.0)]) for i in range(6)])
    ctl, plans = _checked_controller(prof, ClusterSpec.uniform(1, 2), "saturn-static", max_replan_tasks=2)
    running = {a.task: a for a in ctl.start(0.0, arrived=[f"t{i}" for i in range(5)])}
    assert len(plans[0][1].tasks) == 5 and len(running) == 2  # a first plan holds every task
    for a in ctl.handle(TaskArrived(time_s=1.0, task="t5")):
        running[a.task] = a
    inp = plans[-1][1]
    queued = [x for x in inp.tasks if x not in {r.task for r in inp.context.running}]
    assert "t5" in queued and len(queued) == 2  # the new task and the earliest planned one
    t = 1.0
    while not ctl.done:
        ends = {x: ctl.state(x).segments[-1].start_s + prof.get(x, "ddp", 1).runtime_s for x in running}
        task = min(ends, key=lambda x: (ends[x], x))
        t = max(t, ends[task])
        del running[task]
        for a in ctl.handle(TaskFinished(time_s=t, task=task)):
            running[a.task] = a
    assert all(ctl.state(f"t{i}").state is TaskState.FINISHED for i in range(6))
    with pytest.raises(SaturnError, match="max_replan_tasks"):
        Controller(prof, ClusterSpec.uniform(1, 2), "saturn-replan", max_replan_tasks=0)


def test_without_relocations_every_move_changes_a_tasks_gpus():
    # x and y run on 1 GPU each, one per node; z needs a whole 2-GPU node. With relocations the
    # re-plan moves y next to x (same size, another node) so z starts at once; without them
    # (Ray Tune: a move is a pause and a resize) no task moves unless its GPU count changes.
    prof = _rows(("x", 1000, [(1, 1.0)]), ("w", 10, [(1, 1.0)]), ("y", 1000, [(1, 1.0)]), ("v", 10, [(1, 1.0)]),
                 ("z", 500, [(2, 1.0)]))
    for relocations in (True, False):
        ctl, _ = _checked_controller(prof, ClusterSpec.uniform(2, 2), "saturn-replan", restart_s=5.0,
                                     relocations=relocations)
        nodes = {a.task: a.placement.nodes for a in ctl.start(0.0, arrived=["x", "w", "y", "v"])}
        assert nodes["x"] != nodes["y"], f"the set-up needs x and y on different nodes: {nodes}"
        ctl.handle(TaskFinished(time_s=10.0, task="w"), TaskFinished(time_s=10.0, task="v"))
        out = ctl.handle(TaskArrived(time_s=20.0, task="z"))
        stops = [a for a in out if isinstance(a, Stop)]
        if relocations:
            assert len(stops) == 1 and stops[0].target.gpus == 1 and ctl.moves == 1, out
            assert [a.task for a in out if isinstance(a, Launch)] == [stops[0].task, "z"]
        else:
            assert not stops and ctl.moves == 0, out
            assert all(not d.move or d.target.gpus != d.current.gpus for r in ctl.replans for d in r.moves)
