"""Start-up and restart costs in the model: profile columns, plans, validator, bound, moves,
and the re-planning rules that keep a run from re-planning on every report."""

from __future__ import annotations

import random

import pytest

from ray_saturn import ClusterSpec, PlanError, ProfileError, ProfileTable, SaturnError, validate_plan
from ray_saturn.context import PlanningContext, RunningTask
from ray_saturn.control import Controller, EventReplan, TaskFinished, TaskState, get_replan_policy
from ray_saturn.plan import Assignment, Plan
from ray_saturn.runtime.config import DriverConfig
from ray_saturn.runtime.driver import Driver
from ray_saturn.runtime.fake import FakeLauncher, LedgerManager
from ray_saturn.runtime.storage import RunStorage
from ray_saturn.solver import build_problem, lower_bound, solve


def _table(startup=True):
    rows = []
    for task, steps in (("a", 100), ("b", 60), ("c", 30)):
        for gpus, st in ((1, 1.0), (2, 0.6)):
            row = {"task": task, "strategy": "ddp", "gpus": gpus, "step_time_s": st, "steps": steps}
            if startup:
                row.update(startup_s=10.0 + 5 * gpus, checkpoint_save_s=1.0, checkpoint_load_s=2.0)
            rows.append(row)
    return ProfileTable.from_rows(rows)


def test_cost_columns_are_optional_and_checked(tmp_path):
    old = _table(startup=False)
    c = old.get("a", "ddp", 2)
    assert (c.startup_s, c.checkpoint_save_s, c.checkpoint_load_s) == (0.0, 0.0, 0.0)
    assert c.runtime_s == pytest.approx(60.0)  # old tables keep their meaning
    new = _table()
    c = new.get("a", "ddp", 2)
    assert c.runtime_s == pytest.approx(20.0 + 60.0) and c.train_s == pytest.approx(60.0)
    assert c.move_cost_s == pytest.approx(3.0)
    again = ProfileTable.read(new.write(tmp_path / "p.csv"))
    assert again.get("a", "ddp", 2) == c
    with pytest.raises(ProfileError, match=r"startup_s is -1\.0; it must be a finite number of seconds >= 0"):
        ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1, "steps": 1,
                                 "startup_s": -1}])


@pytest.mark.parametrize("policy", ["saturn", "fifo-whole-node", "fifo-min-gpus"])
def test_plans_include_start_up_and_the_bound_holds(policy):
    prof, cluster = _table(), ClusterSpec.uniform(1, 2)
    plan = solve(prof, cluster, policy, time_limit_s=2)
    for a in plan.assignments:
        cfg = prof.get(a.task, a.strategy, a.gpus, len(a.nodes))
        assert a.end_s - a.start_s == pytest.approx(cfg.startup_s + cfg.steps * cfg.step_time_s)
    bound = lower_bound(build_problem(prof, cluster))
    # Each task's least work includes its start-up: the length bound is the longest task's fastest run.
    assert bound.length == pytest.approx(max(min(c.runtime_s for c in prof.configs(t)) for t in prof.tasks))
    assert plan.lower_bound_s <= plan.makespan_s + 1e-9


def test_validator_rejects_a_plan_without_start_up():
    prof, cluster = _table(), ClusterSpec.uniform(1, 2)
    plan = solve(prof, cluster, "fifo-min-gpus", time_limit_s=1)
    short = [Assignment(a.task, a.strategy, a.gpus, a.nodes, a.start_s, a.end_s - 11.0, a.setup_s)
             for a in plan.assignments]
    bad = Plan(plan.policy, max(a.end_s for a in short), 0.0, 0.0, "feasible", short)
    with pytest.raises(PlanError, match=r"the profile says start-up 15\.0 s"):
        validate_plan(bad, prof, cluster)


def test_a_running_task_kept_in_place_has_no_start_up_left_and_a_move_pays_it():
    prof = _table()
    ctx = PlanningContext(running=(RunningTask("a", "ddp", 1, ("node-0",), restart_s=7.0),))
    problem = build_problem(prof, ClusterSpec.uniform(1, 2), ctx, prune=False)
    opts = problem.options[0]
    pinned = [o for o in opts if o.pinned]
    moved = [o for o in opts if not o.pinned and o.gpus == 2]
    assert pinned[0].duration_s == pytest.approx(100.0)
    assert moved[0].duration_s == pytest.approx(7.0 + 20.0 + 60.0)


def test_controller_prices_moves_with_start_up_save_and_load():
    prof = _table()
    ctl = Controller(prof, ClusterSpec.uniform(1, 2), "saturn-replan", restart_s=4.0, solver_time_limit_s=1)
    launches = ctl.start(0.0)
    running = {a.task: a.placement for a in launches}
    for a in launches:
        cfg = prof.get(a.task, *a.placement.config_key)
        assert a.setup_s == pytest.approx(cfg.startup_s)  # the segment's set-up is its start-up
        assert ctl.state(a.task).setup_left_s(0.0) == pytest.approx(cfg.startup_s)
    inp = ctl._input(30.0, movable=True)
    for r in inp.context.running:
        assert r.restart_s == pytest.approx(4.0 + 3.0)  # stop + save + load; the target's start-up is its row's
    assert running


def test_one_event_per_drift_and_the_tolerance_decides():
    prof = ProfileTable.from_rows(
        [{"task": t, "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 1000} for t in "ab"]
    )
    ctl = Controller(prof, ClusterSpec.uniform(1, 2), "saturn-replan", solver_time_limit_s=1, restart_s=1e6)
    ctl.start(0.0)
    # 30% slow, reported 20 times: one re-plan; the measured rate replaces the estimate.
    for i in range(1, 21):
        ctl.report_progress("a", 10 * i, 13.0 * i, step_time_s=1.3)
    assert len(ctl.replans) == 2 and ctl.state("a").estimate_step_time_s == pytest.approx(1.3)
    # It drifts again, by more than the tolerance from the new estimate: one more.
    for i in range(21, 41):
        ctl.report_progress("a", 10 * i, 13.0 * i, step_time_s=1.7)
    assert len(ctl.replans) == 3
    # Near its end, the measured rate's jitter (18% here) moves the end by less than 2% of the
    # horizon: against a measured estimate, the tolerance alone no longer re-plans.
    for i in range(1, 21):
        ctl.report_progress("a", 980 + i // 2, 700.0 + i, step_time_s=2.0)  # 18% slow, 10 steps left
    assert len(ctl.replans) == 3, [r.reasons for r in ctl.replans]
    loose = Controller(prof, ClusterSpec.uniform(1, 2), EventReplan(tolerance=0.5, horizon_drift=1.0),
                       solver_time_limit_s=1)
    loose.start(0.0)
    for i in range(1, 21):
        loose.report_progress("a", 10 * i, 13.0 * i, step_time_s=1.3)
    assert len(loose.replans) == 1  # 30% is within a 50% tolerance
    assert get_replan_policy("saturn-replan", tolerance=0.25).tolerance == 0.25


def test_noisy_reports_do_not_cause_a_replan_storm():
    prof = ProfileTable.from_rows(
        [{"task": t, "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 1000} for t in "ab"]
    )
    ctl = Controller(prof, ClusterSpec.uniform(1, 2), "saturn-replan", solver_time_limit_s=1, restart_s=1e6,
                     min_reports=DriverConfig().min_reports)
    ctl.start(0.0)
    noise = [1.25, 0.8, 1.2, 0.85, 1.3, 0.75, 1.1, 0.9, 1.25, 0.8] * 5  # +-25% around the estimate
    for i, f in enumerate(noise, 1):
        ctl.report_progress("a", 10 * i, 10.0 * i, step_time_s=f)
    assert len(ctl.replans) == 1, [r.reasons for r in ctl.replans]


def test_drift_replans_are_rate_bounded_but_finishes_are_not():
    # "d" waits for a GPU, so a finish far from its planned end re-plans.
    prof = ProfileTable.from_rows(
        [{"task": t, "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 100} for t in "abcd"]
    )
    ctl = Controller(prof, ClusterSpec.uniform(1, 3), "saturn-replan", solver_time_limit_s=1, restart_s=1e6,
                     drift_replan_gap_s=50.0)
    ctl.start(0.0)
    ctl.report_progress("a", 5, 10.0, step_time_s=2.0)  # drift: deferred (the first plan was at 0)
    assert len(ctl.replans) == 1 and ctl.next_wakeup_s() == pytest.approx(50.0)
    ctl.report_progress("b", 5, 12.0, step_time_s=2.0)
    assert len(ctl.replans) == 1
    ctl.handle(TaskFinished(time_s=20.0, task="c"))  # a finish re-plans at once, taking the drift along
    assert len(ctl.replans) == 2 and len(ctl.replans[-1].reasons) >= 2
    assert ctl.state("c").state is TaskState.FINISHED


def test_a_run_judges_drift_within_the_measurement_window():
    from ray_saturn.control.state import RECENT_REPORTS

    assert 1 <= DriverConfig().min_reports <= RECENT_REPORTS
    prof = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 1000}])
    with pytest.raises(SaturnError, match="min_reports"):
        Controller(prof, ClusterSpec.uniform(1, 1), "saturn-replan", min_reports=RECENT_REPORTS + 1)
    ctl = Controller(prof, ClusterSpec.uniform(1, 1), "saturn-replan", solver_time_limit_s=1,
                     min_reports=DriverConfig().min_reports)
    ctl.start(0.0)
    for i in range(1, DriverConfig().min_reports + 1):
        ctl.report_progress("a", 10 * i, 16.0 * i, step_time_s=1.6)
    assert len(ctl.replans) == 2 and "runs at 1.6" in ctl.replans[-1].reasons[0]


def test_a_finish_with_nothing_waiting_does_not_replan():
    prof = ProfileTable.from_rows(
        [{"task": t, "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 100} for t in "ab"]
    )
    ctl = Controller(prof, ClusterSpec.uniform(1, 2), "saturn-replan", solver_time_limit_s=1, restart_s=1e6)
    ctl.start(0.0)
    ctl.handle(TaskFinished(time_s=60.0, task="a"))  # 40 s early, but no task waits for its GPU
    assert len(ctl.replans) == 1 and ctl.state("a").state is TaskState.FINISHED


def test_fake_run_with_start_up_realises_its_plan(tmp_path):
    prof = _table()
    cfg = DriverConfig(solver_time_limit_s=1.0, checkpoint_interval_s=10.0, poll_wall_s=2.0, node_check_wall_s=0.0)
    d = Driver(prof, LedgerManager(ClusterSpec.uniform(1, 2)), FakeLauncher(launch_latency_s=0.0),
               RunStorage(tmp_path), cfg)
    result = d.run(max_steps=10_000)
    assert result.state == "finished"
    assert result.realised_makespan_s == pytest.approx(result.planned_makespan_s, rel=0.05)
    assert result.replans <= 2 * len(prof.tasks)


def test_a_restart_in_place_at_zero_is_carrying_on_and_validates():
    """With no restart cost, "restart task a at 0 on its own configuration and nodes" and "keep a
    running" look the same to the validator and the controller: the plan says carry on, with no
    start-up (a makespan search once picked the restart option there, and its plan was refused)."""
    profile, cluster = _table(), ClusterSpec.uniform(2, 2)
    ctx = PlanningContext(running=(RunningTask("a", "ddp", 1, ("node-1",), restart_s=0.0),))
    problem = build_problem(profile, cluster, ctx, prune=False)
    t = problem.tasks.index("a")
    kept = problem.pinned_option(t)
    fresh = next(i for i, o in enumerate(problem.options[t])
                 if not o.pinned and o.gpus == 1 and o.config == problem.options[t][kept].config)
    assert problem.options[t][fresh].duration_s == pytest.approx(15.0 + 100.0)  # start-up + steps
    # a on node-1 "restarted" in place at 0; b and c on node-0 (their first option), one after the other.
    b, c = problem.tasks.index("b"), problem.tasks.index("c")
    option = [fresh if i == t else 0 for i in range(problem.num_tasks)]
    node_of = [(1,) if i == t else (0,) for i in range(problem.num_tasks)]
    starts = [0.0] * problem.num_tasks
    starts[c] = problem.options[b][0].duration_s
    plan = problem.to_plan(problem.schedule(option, starts, node_of), policy="t", lower_bound_s=0.0, solve_time_s=0.0)
    a = plan.assignment("a")
    assert (a.nodes, a.start_s, a.setup_s, a.end_s) == (("node-1",), 0.0, 0.0, pytest.approx(100.0))
    validate_plan(plan, profile, cluster, ctx)
    # Started later on the same nodes it is a stop and a restart, with its start-up: not changed.
    starts[t] = 5.0
    later = problem.to_plan(problem.schedule(option, starts, node_of), policy="t", lower_bound_s=0.0, solve_time_s=0.0)
    assert later.assignment("a").end_s == pytest.approx(5.0 + 115.0)


@pytest.mark.parametrize("objective", ["makespan", "online"])
def test_online_runs_with_start_ups_and_no_restart_cost_plan_validly(objective):
    """Arrivals, a start-up column and no separate restart cost (the online benchmark's setting):
    every re-plan is validated when it is made, and every task ends. Seed 6 made a makespan
    search restart a running task in place, and its plan was refused."""
    from ray_saturn.sim import SimConfig, simulate

    for seed in (6, 11, 23):
        rng = random.Random(seed)
        rows, arrivals = [], {}
        for i in range(8):
            steps, base = rng.randint(50, 400), rng.uniform(0.5, 3.0)
            for g in (1, 2, 4):
                rows.append({"task": f"t{i}", "strategy": "ddp", "gpus": g, "steps": steps,
                             "step_time_s": base / g ** rng.uniform(0.6, 0.95), "startup_s": 30.0})
            arrivals[f"t{i}"] = 0.0 if i < 3 else rng.uniform(0, 600)
        cfg = SimConfig(restart_s=0.0, arrivals=arrivals, solver_time_limit_s=0.5, deterministic=True,
                        objective=objective)
        r = simulate(ProfileTable.from_rows(rows), ClusterSpec.uniform(2, 4), "saturn-replan", cfg)
        assert all(t.state == "finished" for t in r.tasks) and len(r.tasks) == 8


def _running_kept_rows():
    return [
        {"task": "t2", "strategy": "single", "gpus": 1, "step_time_s": 2.0857, "steps": 2597},
        {"task": "t4", "strategy": "single", "gpus": 1, "step_time_s": 0.949, "steps": 855},
        {"task": "t6", "strategy": "ddp", "gpus": 3, "step_time_s": 1.3414, "steps": 3538},
        {"task": "t8", "strategy": "single", "gpus": 1, "step_time_s": 1.5976, "steps": 2312},
        {"task": "t14", "strategy": "fsdp", "gpus": 1, "step_time_s": 1.8351, "steps": 2549},
        {"task": "t18", "strategy": "ddp", "gpus": 2, "step_time_s": 3.8128, "steps": 2314},
        {"task": "t13", "strategy": "single", "gpus": 1, "step_time_s": 3.6041, "steps": 4709},
    ]


def test_online_plan_mean_completion_counts_a_task_kept_in_place_as_carrying_on():
    """The online search "restarted" running tasks at 0 where they run; the plan keeps them there
    (no restart), so they end sooner: the plan's mean completion time is its own ends' (the
    validator refused it: 9449.9 against 9441.3)."""
    from ray_saturn.context import PlanningContext, RunningTask
    from ray_saturn.solver.objective import solver_policy

    rows = _running_kept_rows()
    running = tuple(RunningTask(r["task"], r["strategy"], 1, ("n1",), restart_s=30.0)
                    for r in rows if r["task"] in ("t2", "t4", "t8", "t14"))
    cluster = ClusterSpec.from_dict({"nodes": [{"name": "n1", "gpus": 4}]})
    plan = solve(ProfileTable.from_rows(rows), cluster, solver_policy("saturn", objective="online", deterministic=True),
                 context=PlanningContext(running=running), time_limit_s=0.5)
    ends = [a.end_s for a in plan.assignments]
    assert plan.mean_completion_s == pytest.approx(sum(ends) / len(ends))


def test_a_running_task_kept_on_its_devices_carries_on_without_its_start_up():
    """Device-level (a profile with a share row): a running task the schedule restarts at 0 on its own
    configuration, node and devices carries on (no start-up); the validator refused the plan."""
    from ray_saturn.context import PlanningContext, RunningTask
    from ray_saturn.solver.objective import solver_policy

    rows = [
        {"task": "t5", "strategy": "single", "gpus": 1, "step_time_s": 3.8987, "steps": 690},
        {"task": "t6", "strategy": "fsdp", "gpus": 3, "step_time_s": 1.0965, "steps": 4285, "startup_s": 41.96},
        {"task": "t10", "strategy": "single", "gpus": 1, "step_time_s": 0.6816, "steps": 4017},
        {"task": "t15", "strategy": "single", "gpus": 1, "step_time_s": 2.3172, "steps": 2728},
        {"task": "t18", "strategy": "ddp", "gpus": 3, "step_time_s": 0.9151, "steps": 4500},
        {"task": "t18", "strategy": "single", "gpus": 0.25, "step_time_s": 4.9194, "steps": 4500},
    ]
    devs = {"t5": ((0, 1.0),), "t6": ((1, 1.0), (2, 1.0), (3, 1.0)), "t10": ((4, 1.0),),
            "t18": ((5, 1.0), (6, 1.0), (7, 1.0))}
    strat = {"t5": ("single", 1), "t6": ("fsdp", 3), "t10": ("single", 1), "t18": ("ddp", 3)}
    running = tuple(RunningTask(t, *strat[t], ("node-0",), restart_s=0.0, devices={"node-0": d})
                    for t, d in devs.items())
    plan = solve(ProfileTable.from_rows(rows), ClusterSpec.uniform(1, 8),
                 solver_policy("saturn", objective="makespan", deterministic=True),
                 context=PlanningContext(running=running), time_limit_s=0.5)
    t6 = plan.assignment("t6")
    if t6.start_s == 0.0 and t6.devices == {"node-0": ((1, 1.0), (2, 1.0), (3, 1.0))}:
        assert t6.end_s == pytest.approx(4285 * 1.0965)  # carrying on: no start-up
