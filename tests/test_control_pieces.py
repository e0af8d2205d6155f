"""Unit tests of the control-plane pieces: dispatch, re-planning input, move decisions, policies."""

from __future__ import annotations

import pytest

from ray_saturn import ClusterSpec, ProfileTable, SaturnError
from ray_saturn.control import (
    Controller,
    EventReplan,
    GpusIdle,
    PeriodicReplan,
    Placement,
    PlannedTask,
    ReplanView,
    StaticReplan,
    TaskArrived,
    TaskFailed,
    TaskFinished,
    TaskOffEstimate,
    TaskProgress,
    TaskState,
    Tick,
    build_replan_input,
    decide_moves,
    dispatch,
    get_replan_policy,
    replan_policy_names,
)
from ray_saturn.control.state import Segment
from ray_saturn.plan import Assignment, Plan


def _pt(task, nodes, start, gpus=2):
    return PlannedTask(task, Placement("ddp", gpus, tuple(nodes)), start, start + 10)


def test_dispatch_starts_early_when_gpus_are_free():
    q = [_pt("a", ["n0"], 0.0), _pt("b", ["n0"], 50.0)]
    assert [p.task for p in dispatch(q, {"n0": 4}, now_s=0.0)] == ["a", "b"]


def test_dispatch_keeps_per_node_order():
    # b is planned after a on n0: while a cannot start (n1 busy), b must wait too.
    q = [_pt("a", ["n0", "n1"], 0.0), _pt("b", ["n0"], 5.0, gpus=1), _pt("c", ["n2"], 9.0)]
    out = dispatch(q, {"n0": 4, "n1": 0, "n2": 2}, now_s=0.0)
    assert [p.task for p in out] == ["c"]


def test_dispatch_never_oversubscribes_and_skips_lost_nodes():
    q = [_pt("a", ["n0"], 0.0, gpus=3), _pt("b", ["n1"], 0.0, gpus=3), _pt("c", ["gone"], 0.0)]
    out = dispatch(q, {"n0": 4, "n1": 2}, now_s=0.0)
    assert [p.task for p in out] == ["a"]


def _profile():
    return ProfileTable.from_rows(
        [
            {"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 2.0, "steps": 100},
            {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.2, "steps": 100},
            {"task": "a", "strategy": "fsdp", "gpus": 1, "step_time_s": None, "steps": 100, "feasible": False},
            {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 50},
            {"task": "c", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 50},
        ]
    )


def test_replan_input_uses_remaining_steps_and_measured_step_times():
    prof = _profile()
    running = TaskProgress(
        "a",
        100,
        state=TaskState.RUNNING,
        steps_done=40,
        reported_at_s=100.0,
        arrived_s=0.0,
        placement=Placement("ddp", 2, ("n0",)),
        estimate_step_time_s=1.2,
        measured_step_time_s=1.5,
        slowdown=1.25,
    )
    running.segments.append(Segment(running.placement, 0.0))
    queued = TaskProgress("b", 50, state=TaskState.QUEUED, steps_done=10, arrived_s=0.0)
    pending = TaskProgress("c", 50)  # not arrived: not planned
    inp = build_replan_input(
        prof,
        {"a": running, "b": queued, "c": pending},
        ClusterSpec.uniform(1, 2, "n"),
        103.0,
        restart_s=7.0,
        movable=True,
    )
    assert inp.tasks == ("a", "b")
    cur = inp.profile.get("a", "ddp", 2)
    # 3 s after the report at 1.5 s/step: 2 more steps done.
    assert cur.steps == 58 and cur.step_time_s == pytest.approx(1.5)
    other = inp.profile.get("a", "ddp", 1)
    assert other.step_time_s == pytest.approx(2.0 * 1.25)  # the task's slowdown carries over
    assert not inp.profile.get("a", "fsdp", 1).feasible
    assert inp.profile.get("b", "ddp", 1).steps == 40
    (r,) = inp.context.running
    assert (r.task, r.nodes, r.restart_s, r.movable) == ("a", ("n0",), 7.0, True)
    pinned = build_replan_input(
        prof, {"a": running}, ClusterSpec.uniform(1, 2, "n"), 103.0, restart_s=7.0, movable=False
    )
    assert not pinned.context.running[0].movable


def test_replan_input_folds_remaining_setup_into_the_pinned_row():
    prof = _profile()
    p = TaskProgress(
        "a",
        100,
        state=TaskState.RUNNING,
        steps_done=0,
        arrived_s=0.0,
        placement=Placement("ddp", 2, ("n0",)),
        estimate_step_time_s=1.2,
    )
    p.segments.append(Segment(p.placement, 10.0, setup_s=30.0))
    inp = build_replan_input(prof, {"a": p}, ClusterSpec.uniform(1, 2, "n"), 20.0, restart_s=30.0, movable=True)
    row = inp.profile.get("a", "ddp", 2)
    assert row.runtime_s == pytest.approx(20.0 + 100 * 1.2)
    assert not inp.context.running[0].movable  # still restarting: not moved again


def test_replan_input_empty_when_nothing_is_active():
    assert (
        build_replan_input(
            _profile(), {"c": TaskProgress("c", 50)}, ClusterSpec.uniform(1, 1), 0.0, restart_s=1.0, movable=True
        )
        is None
    )


def _plan(makespan, *assignments):
    return Plan("saturn", makespan, 1.0, 0.0, "feasible", list(assignments))


def test_move_accepted_only_when_gain_exceeds_restart_cost():
    here = Placement("ddp", 2, ("n0",))
    moved = _plan(60.0, Assignment("a", "ddp", 4, ("n1",), 0.0, 60.0, setup_s=10.0))
    (d,) = decide_moves({"a": here}, moved, keep_makespan_s=100.0, restart_s=10.0)
    assert d.move and d.predicted_gain_s == pytest.approx(40.0) and d.target.nodes == ("n1",)
    (d,) = decide_moves({"a": here}, moved, keep_makespan_s=65.0, restart_s=10.0)
    assert not d.move and "restart cost" in d.reason
    kept = _plan(60.0, Assignment("a", "ddp", 2, ("n0",), 0.0, 60.0))
    assert decide_moves({"a": here}, kept, keep_makespan_s=60.0, restart_s=10.0) == []
    # Stopped and restarted later on the same nodes is a move too.
    later = _plan(90.0, Assignment("a", "ddp", 2, ("n0",), 20.0, 90.0, setup_s=10.0))
    (d,) = decide_moves({"a": here}, later, keep_makespan_s=100.0, restart_s=10.0)
    assert d.move is False  # gain 10 s does not exceed the 10 s restart


def test_policy_registry_and_triggers():
    names = replan_policy_names()
    assert {"saturn-static", "saturn-replan", "saturn-periodic", "fifo-whole-node"} <= set(names)
    assert isinstance(get_replan_policy("saturn-static"), StaticReplan)
    base = get_replan_policy("optimus-greedy")
    assert base.name == "optimus-greedy" and not base.allows_moves
    with pytest.raises(SaturnError, match="unknown policy"):
        get_replan_policy("nope")
    with pytest.raises(SaturnError, match="positive"):
        PeriodicReplan(interval_s=0)
    off = TaskOffEstimate(time_s=5.0, task="a", measured_step_time_s=2.0, estimate_step_time_s=1.0)
    assert StaticReplan().wants_replan(off, ReplanView()) is None
    assert EventReplan().wants_replan(off, ReplanView())
    p = TaskProgress("a", 10, state=TaskState.FINISHED)
    p.segments.append(Segment(Placement("ddp", 1, ("n0",)), 0.0, end_s=100.0))
    assert EventReplan().wants_replan(TaskFinished(time_s=100.0, task="a"), ReplanView(p, 105.0, queued=1)) is None
    assert EventReplan().wants_replan(TaskFinished(time_s=100.0, task="a"), ReplanView(p, 150.0, queued=1))
    # Nothing waits to start: an early finish changes no decision (idle GPUs raise GpusIdle).
    assert EventReplan().wants_replan(TaskFinished(time_s=100.0, task="a"), ReplanView(p, 150.0)) is None
    per = PeriodicReplan(interval_s=50.0)
    assert per.next_tick_s(10.0, 1000.0) == 60.0
    assert PeriodicReplan().next_tick_s(0.0, 1000.0) == pytest.approx(100.0)
    assert per.wants_replan(Tick(time_s=60.0), ReplanView()) == "periodic"


def test_event_replan_finish_drift_is_relative_to_the_plan_horizon():
    # A long task 5% late: within 10% of its own run, but 5% of a 1000 s horizon is a hole.
    p = TaskProgress("a", 10, state=TaskState.FINISHED)
    p.segments.append(Segment(Placement("ddp", 1, ("n0",)), 0.0, end_s=1050.0))
    late = TaskFinished(time_s=1050.0, task="a")
    assert EventReplan().wants_replan(late, ReplanView(p, 1000.0)) is None  # no plan horizon known
    assert "finished +50 s" in EventReplan().wants_replan(late, ReplanView(p, 1000.0, 0.0, 1000.0, queued=1))
    assert EventReplan(horizon_drift=0.1).wants_replan(late, ReplanView(p, 1000.0, 0.0, 1000.0, queued=1)) is None
    idle = GpusIdle(time_s=5.0, node="n0", gpus=2, busy_for_s=100.0)
    assert "idle on n0" in EventReplan().wants_replan(idle, ReplanView())
    assert StaticReplan().wants_replan(idle, ReplanView()) is None
    assert PeriodicReplan().wants_replan(idle, ReplanView()) is None


def _tail_profile():
    # "long" and "short" run side by side (1000 s); "long" on both nodes first is 900 + 200 s.
    rows = []
    for gpus, nodes, st in ((2, 1, 1.0), (4, 2, 0.9)):
        rows.append({"task": "long", "strategy": "ddp", "gpus": gpus, "nodes": nodes, "step_time_s": st, "steps": 1000})
    rows.append({"task": "short", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 200})
    return ProfileTable.from_rows(rows)


@pytest.mark.parametrize("policy", ["saturn-replan", "saturn-static"])
def test_controller_raises_gpus_idle_once_per_idle_stretch(policy):
    ctl = Controller(_tail_profile(), ClusterSpec.uniform(2, 2), policy, restart_s=10.0, solver_time_limit_s=2)
    launches = {a.task: a for a in ctl.start(0.0)}
    assert set(launches) == {"long", "short"}
    free_node = launches["short"].placement.nodes[0]
    # "short" ends on time; its node has no queued task left while "long" runs 800 s more.
    ctl.report_progress("long", 200, 200.0)
    actions = ctl.handle(TaskFinished(time_s=200.0, task="short"))
    idle = [e for e in ctl.log if e.get("kind") == "gpus_idle"]
    assert [(e["node"], e["gpus"]) for e in idle] == [(free_node, 2)]
    if policy == "saturn-static":
        assert actions == [] and len(ctl.replans) == 1
        return
    # The idle node prompted a re-plan, which moves "long" onto both nodes (720 + 10 s < 800 s).
    assert len(ctl.replans) == 2 and "idle on" in ctl.replans[-1].reasons[0]
    assert [(a.kind, a.task) for a in actions] == [("stop", "long"), ("launch", "long")]
    assert len(actions[1].placement.nodes) == 2 and actions[1].steps_done == 200
    # The move filled the idle node in the same call: it is no longer "seen idle", so when it falls
    # idle again it raises GpusIdle again (it stayed marked, and silent, until 2026-12-07).
    assert ctl._idle_seen == set()
    # The same idle stretch does not raise it again, and a finished run raises nothing.
    ctl.handle(Tick(time_s=201.0))
    assert len([e for e in ctl.log if e.get("kind") == "gpus_idle"]) == 1
    assert ctl.handle(TaskFinished(time_s=930.0, task="long")) == [] and ctl.done
    assert len([e for e in ctl.log if e.get("kind") == "gpus_idle"]) == 1


def test_a_move_may_wait_for_its_gpus_and_online_tasks_join_the_run():
    here = Placement("ddp", 2, ("n0",))
    # The plan stops "a" now and restarts it on 4 GPUs 30 s later (they are busy): a move like any
    # other, made when the gain (the wait counted in the plan's makespan) beats the restart.
    later = _plan(90.0, Assignment("a", "ddp", 4, ("n1",), 30.0, 90.0, setup_s=10.0))
    (d,) = decide_moves({"a": here}, later, keep_makespan_s=200.0, restart_s=10.0)
    assert d.move and d.predicted_gain_s == pytest.approx(110.0) and "restart(s) later (first a, 30.0 s on)" in d.reason
    (d,) = decide_moves({"a": here}, later, keep_makespan_s=95.0, restart_s=10.0)
    assert not d.move and "would gain 5.0 s" in d.reason
    # Tasks added after the start (e.g. Tune trials) arrive, run, and a final failure is not retried.
    prof = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10}])
    ctl = Controller(prof, ClusterSpec.uniform(1, 2), "saturn-replan", restart_s=1.0, solver_time_limit_s=1)
    assert [a.task for a in ctl.start(0.0)] == ["a"]
    ctl.add_tasks(ProfileTable.from_rows([{"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 5}]))
    with pytest.raises(SaturnError, match="already in this run"):
        ctl.add_tasks(prof)
    assert [a.task for a in ctl.handle(TaskArrived(time_s=1.0, task="b"))] == ["b"]
    assert ctl.handle(TaskFailed(time_s=2.0, task="b", reason="gave up", final=True)) == []
    assert ctl.state("b").state is TaskState.FAILED and ctl.state("b").reason == "gave up"
    n = len(ctl.replans)
    ctl.request_replan(3.0, "a better plan is ready")
    assert len(ctl.replans) == n + 1 and ctl.replans[-1].reasons == ["a better plan is ready"]


def _wider_later_profile():
    # "long" and "short" side by side (1000 s) beats "short" then "long" on all 4 GPUs (200 + 810 s).
    rows = [
        {"task": "long", "strategy": "ddp", "gpus": g, "step_time_s": st, "steps": 1000}
        for g, st in ((2, 1.0), (4, 0.81))
    ]
    rows.append({"task": "short", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 200})
    return ProfileTable.from_rows(rows)


@pytest.mark.parametrize("objective", ["makespan", "online"])
def test_a_task_stopped_to_restart_wider_later_waits_queued_and_relaunches(objective):
    """The makespan planner's "stop now, restart on more GPUs once they free up" is made (one move
    rule for every objective; a makespan run used to drop such plans, 0.8 moves per simulated run
    instead of 7.7), and the stopped task waits queued, keeps its steps and is launched again."""
    ctl = Controller(_wider_later_profile(), ClusterSpec.uniform(1, 4), "saturn-replan", restart_s=10.0,
                     solver_time_limit_s=2, deterministic=True, objective=objective, backfill=False)
    assert sorted((a.task, a.placement.gpus) for a in ctl.start(0.0)) == [("long", 2), ("short", 2)]
    ctl.report_progress("short", 30, 30.0, step_time_s=1.0)
    # "long" runs at 2 s/step: on 2 GPUs 1960 s more; stopped until "short" ends (170 s), then 4 GPUs: ~1770 s.
    actions = ctl.report_progress("long", 15, 30.0, step_time_s=2.0)
    assert [(a.kind, a.task, a.target.gpus) for a in actions] == [("stop", "long", 4)]
    (d,) = ctl.replans[-1].moves
    assert d.move and d.predicted_gain_s > 100.0 and "restart(s) later (first long, 170.0 s on)" in d.reason
    assert ctl.state("long").state is TaskState.QUEUED and ctl.state("long").steps_done == 15
    assert ctl.planned["long"].start_s == pytest.approx(200.0, abs=0.1)
    assert ctl.handle(Tick(time_s=100.0)) == []  # its GPUs are not free yet: it waits, it is not lost
    relaunch = [a for a in ctl.handle(TaskFinished(time_s=200.0, task="short")) if a.kind == "launch"]
    assert [(a.task, a.placement.gpus, a.steps_done) for a in relaunch] == [("long", 4, 15)]
    assert ctl.handle(TaskFinished(time_s=1800.0, task="long")) == [] and ctl.done and ctl.moves == 1


def test_with_backfill_a_task_moved_to_a_later_start_runs_on_where_it_is_until_its_turn():
    """The same move with backfill (the ``online`` default): "long" is not stopped to wait idle for
    170 s; it steps on on its 2 GPUs and is stopped when its planned turn comes, then relaunched on
    4 GPUs with the steps it made meanwhile and the restart set-up; one move."""
    ctl = Controller(_wider_later_profile(), ClusterSpec.uniform(1, 4), "saturn-replan", restart_s=10.0,
                     solver_time_limit_s=2, deterministic=True, objective="online")
    assert ctl.backfill
    assert sorted((a.task, a.placement.gpus) for a in ctl.start(0.0)) == [("long", 2), ("short", 2)]
    ctl.report_progress("short", 30, 30.0, step_time_s=1.0)
    assert ctl.report_progress("long", 15, 30.0, step_time_s=2.0) == []
    (d,) = ctl.replans[-1].moves
    assert d.move and ctl.state("long").state is TaskState.RUNNING and ctl.moves == 0
    assert ctl.planned["long"].placement.gpus == 4
    ctl.report_progress("long", 100, 200.0, step_time_s=2.0)
    actions = ctl.handle(TaskFinished(time_s=200.0, task="short"))
    assert [(a.kind, a.task) for a in actions] == [("stop", "long"), ("launch", "long")]
    stop, launch = actions
    assert "moved" in stop.reason and stop.target.gpus == 4
    assert (launch.placement.gpus, launch.steps_done, launch.setup_s) == (4, 100, pytest.approx(10.0))
    assert ctl.moves == 1 and ctl.backfills == 0
    assert [(s.gpus, s.steps_start, s.steps_end) for s in ctl.state("long").segments] == [(2, 0, 100), (4, 100, None)]
