"""Backfill: queued tasks run ahead of their plan on GPUs it leaves idle (Controller(backfill=...))."""

from __future__ import annotations

import pytest

from ray_saturn import ClusterSpec, ProfileTable
from ray_saturn.control import Controller, TaskArrived, TaskFinished, TaskState
from ray_saturn.control.controller import BACKFILL_GAIN
from ray_saturn.sim import SimConfig, simulate


def _profile(big_narrow_step_s: float = 4.0, extra: list[dict] | None = None) -> ProfileTable:
    # "a" can only run on 3 of the node's 4 GPUs (1500 s); "big" is fastest on all 4 (1000 s), and
    # 4x slower on 1: a plan runs it after "a" and leaves 1 GPU idle until then.
    rows = [
        {"task": "a", "strategy": "ddp", "gpus": 3, "step_time_s": 1.0, "steps": 1500},
        {"task": "big", "strategy": "ddp", "gpus": 4, "step_time_s": 1.0, "steps": 1000},
        {"task": "big", "strategy": "single", "gpus": 1, "step_time_s": big_narrow_step_s, "steps": 1000},
    ]
    return ProfileTable.from_rows(rows + (extra or []))


def _controller(profile: ProfileTable, **kw) -> Controller:
    kw.setdefault("objective", "makespan")
    kw.setdefault("backfill", True)
    return Controller(profile, ClusterSpec.uniform(1, 4), "saturn-replan", restart_s=10.0,
                      solver_time_limit_s=2, deterministic=True, **kw)


def _start_a_then_big(ctl: Controller):
    assert [(a.task, a.placement.gpus) for a in ctl.start(0.0, arrived=["a"])] == [("a", 3)]
    return ctl.handle(TaskArrived(time_s=10.0, task="big"))


def test_a_task_waiting_for_a_wide_row_runs_narrow_on_the_idle_gpus_until_its_turn():
    ctl = _controller(_profile())
    actions = _start_a_then_big(ctl)
    assert ctl.planned["big"].placement.gpus == 4 and ctl.planned["big"].start_s == pytest.approx(1500.0)
    # The idle GPU takes "big" on its 1-GPU row now: ~372 steps by 1500 s save ~372 s of its 4-GPU run.
    assert [(a.kind, a.task, a.placement.gpus, a.steps_done) for a in actions] == [("launch", "big", 1, 0)]
    assert ctl.backfills == 1 and ctl.state("big").state is TaskState.RUNNING
    assert [e["kind"] for e in ctl.log].count("backfill") == 1
    ctl.report_progress("big", 370, 1490.0, step_time_s=4.0)
    # Its turn: the backfill stops and "big" launches on all 4 GPUs with its steps and the restart set-up.
    actions = ctl.handle(TaskFinished(time_s=1500.0, task="a"))
    assert [(a.kind, a.task) for a in actions] == [("stop", "big"), ("launch", "big")]
    stop, launch = actions
    assert "backfill" in stop.reason and stop.target.gpus == 4
    assert (launch.placement.gpus, launch.steps_done, launch.setup_s) == (4, 372, pytest.approx(10.0))
    assert [(s.gpus, s.steps_start, s.steps_end, s.status) for s in ctl.state("big").segments] == [
        (1, 0, 372, "stopped"), (4, 372, None, "running")]
    assert ctl.moves == 0
    assert ctl.handle(TaskFinished(time_s=2138.0, task="big")) == [] and ctl.done


@pytest.mark.parametrize("kw", [{"backfill": False}, {"backfill": None}, {"backfill": None, "objective": "completion"},
                                {"backfill": None, "objective": "online", "relocations": False}])
def test_without_backfill_the_gpu_stays_idle(kw):
    """Off when asked, and by default for every objective but ``online`` (and under Ray Tune's
    no-relocation moves)."""
    ctl = _controller(_profile(), **kw)
    assert not ctl.backfill
    assert _start_a_then_big(ctl) == []
    assert ctl.state("big").state is TaskState.QUEUED and ctl.backfills == 0


def test_online_turns_backfill_on_by_default():
    assert _controller(_profile(), backfill=None, objective="online").backfill


def test_no_backfill_when_the_steps_it_makes_do_not_repay_its_restart():
    # On 1 GPU "big" is 40x slower: ~37 steps by its turn save ~37 s, under BACKFILL_GAIN x 10 s.
    ctl = _controller(_profile(big_narrow_step_s=40.0))
    assert BACKFILL_GAIN * 10.0 > 1490 / 40.0
    assert _start_a_then_big(ctl) == [] and ctl.backfills == 0


def test_the_plan_takes_the_gpus_back_for_another_task_and_a_replan_sees_the_backfill_as_queued():
    # "c" (1 GPU, 100 s) arrives while "big" backfills the idle GPU; completion time puts "c" first there.
    extra = [{"task": "c", "strategy": "single", "gpus": 1, "step_time_s": 1.0, "steps": 100}]
    inputs = []
    ctl = _controller(_profile(extra=extra), objective="completion", on_plan=lambda plan, inp: inputs.append(inp))
    assert ctl.start(0.0, arrived=["a"])
    assert [(a.kind, a.task) for a in ctl.handle(TaskArrived(time_s=10.0, task="big"))] == [("launch", "big")]
    ctl.report_progress("big", 20, 90.0, step_time_s=4.0)
    actions = ctl.handle(TaskArrived(time_s=100.0, task="c"))
    # The re-plan saw "big" as queued with its 22 steps; the plan starts "c" on its GPU now.
    inp = inputs[-1]
    assert inp.tasks == ("a", "big", "c") and [r.task for r in inp.context.running] == ["a"]
    assert inp.profile.get("big", "single", 1).steps == 1000 - 22
    assert [(a.kind, a.task) for a in actions] == [("stop", "big"), ("launch", "c")]
    assert ctl.state("big").state is TaskState.QUEUED and ctl.state("big").steps_done == 22
    # When "c" ends, the GPU is idle until "big"'s turn again: it backfills once more, from its 22 steps.
    actions = ctl.handle(TaskFinished(time_s=200.0, task="c"))
    assert [(a.kind, a.task, a.steps_done) for a in actions] == [("launch", "big", 22)]
    assert ctl.backfills == 2


def test_a_launch_that_fits_beside_a_backfill_leaves_it_running():
    # "a" holds 2 of the 4 GPUs: "big" backfills 1 of the other 2; "c" (1 GPU) arrives and takes the
    # last free one: "big" runs on.
    rows = [
        {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 1500},
        {"task": "big", "strategy": "ddp", "gpus": 4, "step_time_s": 1.0, "steps": 1000},
        {"task": "big", "strategy": "single", "gpus": 1, "step_time_s": 4.0, "steps": 1000},
        {"task": "c", "strategy": "single", "gpus": 1, "step_time_s": 1.0, "steps": 100},
    ]
    ctl = _controller(ProfileTable.from_rows(rows), objective="completion")
    ctl.start(0.0, arrived=["a"])
    assert [(a.kind, a.task, a.placement.gpus) for a in ctl.handle(TaskArrived(time_s=10.0, task="big"))] == [
        ("launch", "big", 1)]
    assert ctl.free_gpus() == {"node-0": 1}
    actions = ctl.handle(TaskArrived(time_s=100.0, task="c"))
    assert [(a.kind, a.task) for a in actions] == [("launch", "c")]
    assert ctl.state("big").state is TaskState.RUNNING and ctl.free_gpus() == {"node-0": 0}


def test_a_backfill_the_new_plan_starts_at_once_where_it_runs_stays_running():
    # "a" turns out 5x slower: "big" would wait ~7000 s for all 4 GPUs, so the re-plan runs it on
    # the 1 GPU it backfills, at once: it stays there, a plain running task now (no stop, no restart).
    ctl = _controller(_profile())
    _start_a_then_big(ctl)
    assert ctl.state("big").state is TaskState.RUNNING and ctl.backfills == 1
    n = len(ctl.replans)
    actions = ctl.report_progress("a", 100, 500.0, step_time_s=5.0)
    assert len(ctl.replans) == n + 1 and actions == []
    assert ctl.planned["big"].placement.gpus == 1 and ctl.planned["big"].start_s == pytest.approx(500.0)
    assert ctl.state("big").state is TaskState.RUNNING and len(ctl.state("big").segments) == 1
    # No longer a backfill: when "a" ends, nothing takes its GPU back.
    assert ctl.handle(TaskFinished(time_s=7500.0, task="a")) == []
    assert ctl.state("big").state is TaskState.RUNNING and len(ctl.state("big").segments) == 1


def test_a_failed_task_frees_the_gpus_and_the_backfill_moves_onto_its_planned_row_at_once():
    from ray_saturn.control import TaskFailed

    ctl = _controller(_profile())
    _start_a_then_big(ctl)
    actions = ctl.handle(TaskFailed(time_s=500.0, task="a", reason="broken", final=True))
    assert [(a.kind, a.task) for a in actions] == [("stop", "big"), ("launch", "big")]
    assert actions[1].placement.gpus == 4 and actions[1].steps_done == ctl.state("big").segments[0].steps_end > 0


def test_online_simulations_with_backfill_keep_every_node_within_its_gpus():
    """The simulator raises on an over-full node or a launch of a running task; random online runs
    with arrivals, start-ups and restarts finish every task, with and without backfill."""
    import random

    fills = 0
    for seed in range(1, 11):
        rng = random.Random(seed)
        rows, arrivals = [], {}
        for i in range(10):
            steps = rng.randint(200, 4000)
            base = rng.uniform(0.5, 3.0)
            for g in (1, *sorted(rng.sample((2, 3, 4, 8), rng.randint(1, 2)))):
                # near-linear speed-ups: wide rows pay, and tasks wait for them
                rows.append({"task": f"t{i}", "strategy": "ddp", "gpus": g, "nodes": 1 if g <= 4 else 2,
                             "step_time_s": base / g ** rng.uniform(0.7, 1.0), "steps": steps, "startup_s": 2.0})
            arrivals[f"t{i}"] = 0.0 if i < 4 else rng.uniform(0, 3000)
        prof = ProfileTable.from_rows(rows)
        results = {}
        for bf in (True, False):
            cfg = SimConfig(noise=0.1, seed=seed, restart_s=1.0, arrivals=arrivals, solver_time_limit_s=1.0,
                            deterministic=True, objective="online", backfill=bf)
            r = simulate(prof, ClusterSpec.uniform(2, 4), "saturn-replan", cfg)
            assert all(t.finish_s is not None for t in r.tasks)
            results[bf] = r
        fills += sum(e.get("kind") == "backfill" for e in results[True].log)
        assert not any(e.get("kind") == "backfill" for e in results[False].log)
    assert fills > 0  # the runs above did backfill
