"""Tune integration: the scheduler's hooks on the control plane (fake Tune), the trial processes,
and real Tuners with ASHA on a local Ray with logical GPUs (one with a size-changing move)."""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
from tune_fakes import Clock, FakeTrial, FakeTune

from ray_saturn import ClusterSpec, ProfileTable
from ray_saturn.control import TaskState
from ray_saturn.tune import (
    SaturnScheduler,
    TrialRejected,
    TrialTrainingError,
    TuneIntegrationError,
    profile_rows,
    saturn_trainable,
    trial_decision,
    trial_rows,
)
from ray_saturn.tune import _planner as planner_mod
from ray_saturn.tune import _trainable as trainable_mod
from ray_saturn.workloads.regression import regression_task


def estimate(config):
    # Wider models gain from 2 GPUs, narrow ones do not.
    return [
        {"strategy": "single", "gpus": 1, "step_time_s": 0.02 * config["width"] / 16, "steps": 24},
        {"strategy": "ddp", "gpus": 2, "step_time_s": 0.004 * config["width"] / 16 + 0.02, "steps": 24},
    ]


@pytest.fixture
def inline_background(monkeypatch):
    """The background solve runs at once in the calling thread (deterministic), in the hook after the
    re-plan that asked for it; its plan is applied in the hook after that."""

    def flush(self):
        from ray_saturn.solver import solve

        call, self._candidate = self._candidate, None
        if call is not None:
            self.newest = solve(
                call.profile,
                call.cluster,
                call.policy,
                context=call.context,
                time_limit_s=self.time_limit_s,
                seed=call.seed,
            )
            self.fresh = True

    monkeypatch.setattr(planner_mod.BackgroundPlanner, "flush", flush)


def _in_use(events):
    used, peak = 0, 0
    for e in events:
        used += e.gpus
        peak = max(peak, used)
    return used, peak


def scaling(config):
    # 2 GPUs each side by side (50 s) beats 4 GPUs one after the other (60 s).
    steps = config.get("steps", 100)
    return [
        {"strategy": "single", "gpus": 1, "step_time_s": 1.0, "steps": steps},
        {"strategy": "ddp", "gpus": 2, "step_time_s": 0.5, "steps": steps},
        {"strategy": "ddp", "gpus": 4, "step_time_s": 0.3, "steps": steps},
    ]


def test_trials_are_held_released_in_plan_order_together_and_free_gpus(fake_tune, no_background):
    clock = Clock()
    s = SaturnScheduler(estimate, cluster=ClusterSpec.uniform(1, 2), policy="saturn-static", clock=clock)
    tune = fake_tune(s)
    trials = [tune.add(f"t{i}", {"width": w, "lr": 0.1}) for i, w in enumerate([16, 64, 16])]
    assert all(t.status == FakeTrial.PAUSED for t in trials)  # held: no actor, no GPUs
    started = tune.step()
    assert started, "something fits"
    assert tune.step() == []  # nothing else fits until GPUs come back
    for tid in started:
        t = tune.trials[tid]
        assert t.config["_saturn"]["gpus"] == t.gpus and t.config["_saturn"]["strategy"] in ("single", "ddp")
    used, peak = _in_use(s.gpu_events)
    assert peak <= 2 and used == sum(tune.trials[t].gpus for t in started)
    # Released in the controller's planned order.
    planned = {a.task: a.start_s for a in s.controller.plan.assignments}
    waiting = [t.trial_id for t in trials if t.trial_id not in started]
    assert all(planned[a] <= planned[b] + 1e-9 for a in started for b in waiting)
    # Early stops (ASHA) free the GPUs at once; the next trial starts as soon as its GPUs are free.
    nxt = []
    for i, tid in enumerate(started):
        clock.t = 1.0 + i
        tune.complete(tid)
        nxt = tune.step()
        if nxt:
            break
    assert nxt and set(nxt) <= set(waiting)
    assert _in_use(s.gpu_events)[1] <= 2
    st = s.stats()
    assert st.trials == 3 and st.rejected == 0 and st.moves == 0 and st.max_gpus_in_use <= 2
    assert "waiting for GPUs (shown PAUSED)" in s.debug_string()


def _under_asha16(fake_tune):
    """A SaturnScheduler over ASHA (16 iterations, halving) on 4 GPUs, with its clock and a fake Tune."""
    from ray.tune.schedulers import ASHAScheduler

    clock = Clock()
    asha = ASHAScheduler(
        metric="loss", mode="min", time_attr="training_iteration", max_t=16, grace_period=1, reduction_factor=2
    )
    s = SaturnScheduler(scaling, base_scheduler=asha, cluster=ClusterSpec.uniform(1, 4), restart_s=1.0, clock=clock)
    return clock, asha, s, fake_tune(s)


def test_trials_are_planned_for_the_steps_asha_is_expected_to_let_them_train(fake_tune, no_background):
    clock, asha, s, tune = _under_asha16(fake_tune)
    tune.add("a", {"steps": 160}), tune.add("b", {"steps": 160})
    assert sorted(tune.step()) == ["a", "b"]
    # Fresh: to rung 1 for sure, past rungs 2, 4, 8 with probability 1/2 each: 3 of 16 iterations.
    assert s.controller.state("a").total_steps == s.controller.state("b").total_steps == 30

    def report(tid, iteration, loss):
        clock.t += 1.0
        result = {"training_iteration": iteration, "loss": loss, "saturn_step": 10 * iteration,
                  "saturn_step_time_s": 0.5, "saturn_total_steps": 160}
        return s.on_trial_result(tune, tune.trials[tid], result)

    assert report("a", 1, 0.5) == "CONTINUE"  # the first at rung 1 goes on: 2 + 1/2 * 2 + 1/4 * 4 + 1/8 * 8 = 5
    assert s.controller.state("a").total_steps == 50
    assert s.plans[-1].reasons[-1].startswith("a passed a rung of AsyncHyperBandScheduler")
    assert report("b", 1, 0.9) == "STOP"  # worse than a at rung 1: ASHA stops it, its horizon stays
    assert s.controller.state("b").total_steps == 30
    for iteration, total in ((2, 80), (4, 120), (8, 160), (9, 160)):
        assert report("a", iteration, 0.5 / iteration) == "CONTINUE"
        assert s.controller.state("a").total_steps == total
    # The planner knows what a trial may train past its horizon (all its steps if ASHA keeps it).
    assert s._planner.extra_steps == {"a": 0, "b": 130}
    # Without ASHA (or with expect_early_stops=False) trials are planned for all their steps.
    plain = SaturnScheduler(scaling, base_scheduler=asha, cluster=ClusterSpec.uniform(1, 4), expect_early_stops=False)
    fifo = SaturnScheduler(scaling, cluster=ClusterSpec.uniform(1, 4))
    for sched, tid in ((plain, "c"), (fifo, "d")):
        other = fake_tune(sched)
        other.add(tid, {"steps": 160})
        assert other.step() == [tid] and sched.controller.state(tid).total_steps == 160


def test_a_trial_that_leads_its_rung_is_planned_longer_than_one_that_scraped_through(fake_tune, no_background):
    """ASHA keeps the best at each rung and ranks persist: the leader is likely to go on, the marginal one not."""
    from ray_saturn.tune._early_stops import Standing, rung_standing

    clock, asha, s, tune = _under_asha16(fake_tune)
    names = [f"t{i}" for i in range(9)]
    for tid in [*names, "fresh"]:
        tune.add(tid, {"steps": 160})
    tune.step()

    def report(tid, loss):
        clock.t += 1.0
        result = {"training_iteration": 1, "loss": loss, "saturn_step": 10, "saturn_step_time_s": 0.5,
                  "saturn_total_steps": 160}  # fmt: skip
        return s.on_trial_result(tune, tune.trials[tid], result)

    # Seven trials reach rung 1 first (0.5 ... 0.8): the first goes on, and the better half of the rest.
    for i, tid in enumerate(names[2:]):
        report(tid, 0.5 + 0.05 * i)
    assert rung_standing(asha, "t2") == Standing(better=0, others=6)
    assert report("t0", 0.1) == "CONTINUE"  # the best of eight
    assert rung_standing(asha, "t0") == Standing(better=0, others=7)
    assert report("t1", 0.52) == "CONTINUE"  # in the better half, 2 of 9 did better
    assert rung_standing(asha, "t1") == Standing(better=2, others=8)
    blind = 50  # rank-blind, from rung 1: 2 + 1/2 * 2 + 1/4 * 4 + 1/8 * 8 = 5 of 16 iterations
    leader, marginal = s.controller.state("t0").total_steps, s.controller.state("t1").total_steps
    assert leader > 1.5 * blind and marginal < blind, (leader, marginal)
    assert leader == asha_model_steps(asha, "t0", Standing(0, 7))
    # Unknown standing (no rung recorded the trial yet, or not ASHA): the rank-blind model.
    assert rung_standing(asha, "fresh") is None and s.controller.state("fresh").total_steps == 30
    assert rung_standing(object(), "t0") is None


def asha_model_steps(asha, tid, standing):
    from ray_saturn.tune._early_stops import early_stop_model

    return early_stop_model(asha, tid).horizon_steps(1.0, 10, 0.1, 160, standing)


def test_the_standing_model_is_rank_blind_without_rivals_and_bounded_by_it():
    from ray_saturn.tune._early_stops import RANK_BLIND_WEIGHT, EarlyStopModel, Standing

    m = EarlyStopModel(time_attr="it", max_t=16, keep=0.5, rungs=(1, 2, 4, 8))
    # Alone at the rung: the quantile is uniform, so the next rung is passed with probability keep.
    assert m.expected_units(1, Standing(0, 0)) == m.expected_units(1) == 5.0
    # The leader of many is never sure to go on (curves cross); the last one in is never ruled out.
    assert m.survival(3, Standing(0, 10_000)) <= 1 - RANK_BLIND_WEIGHT * (1 - 0.5**3) + 1e-12
    assert m.survival(1, Standing(9_999, 10_000)) >= RANK_BLIND_WEIGHT * 0.5
    # Better standing, longer horizon; more rivals behind a leader, more certainty.
    ends = [m.expected_units(1, Standing(b, 15)) for b in range(16)]
    assert ends == sorted(ends, reverse=True)
    assert m.expected_units(1, Standing(0, 3)) < m.expected_units(1, Standing(0, 31)) <= 16
    # The posterior CDF is a CDF.
    st = Standing(2, 8)
    cdf = [st.quantile_cdf(x / 20) for x in range(21)]
    assert cdf[0] == 0.0 and cdf[-1] == 1.0 and cdf == sorted(cdf)


def test_near_equal_plans_start_first_the_trial_that_may_train_longest():
    # Two trials planned for 10 steps each on one GPU: either order ends at 20 s. z may train 100
    # steps more (ASHA may keep it): started first, it would end at 110 s instead of 120 s.
    from ray_saturn.context import PlanningContext

    prof = ProfileTable.from_rows(
        [{"task": n, "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10} for n in ("a", "z")]
    )
    cluster = ClusterSpec.uniform(1, 1)
    starts = {}
    for extra in (None, {"z": 100}):
        plan = planner_mod.quick_plan(prof, cluster, "saturn", PlanningContext(), extra_steps=extra)
        assert plan.makespan_s == pytest.approx(20.0)
        starts[bool(extra)] = {a.task: a.start_s for a in plan.assignments}
    assert starts[False] == {"a": 0.0, "z": 10.0}  # without the extra steps: the names decide the tie
    assert starts[True] == {"a": 10.0, "z": 0.0}
    # Never more than SURVIVOR_TOLERANCE above the least makespan: b and c side by side on a 2-GPU
    # node end at 100 s; c first on both GPUs, then b, would end c's 1000 extra steps at 687.5 s
    # instead of 1100 s, but its plan ends at 162.5 s, 62.5% later than the best, so the best stays.
    prof = ProfileTable.from_rows(
        [
            {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 100},
            {"task": "c", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 100},
            {"task": "c", "strategy": "ddp", "gpus": 2, "step_time_s": 0.625, "steps": 100},
        ]
    )
    plan = planner_mod.quick_plan(prof, ClusterSpec.uniform(1, 2), "saturn", PlanningContext(), extra_steps={"c": 1000})
    assert plan.makespan_s == pytest.approx(100.0) and plan.assignment("c").gpus == 1


def test_in_the_searchers_order_trials_start_as_they_arrived_on_the_gpus_ray_saturn_picks():
    # z arrived after a and may train 100 steps more: the plan's order starts z first (see above);
    # the searcher's order starts a first. A wide, efficient row is still taken: w runs 2x faster
    # on 2 GPUs at 0.9 efficiency, so it gets both GPUs in its turn.
    from ray_saturn.context import PlanningContext

    rows = [{"task": n, "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10} for n in ("a", "z")]
    prof = ProfileTable.from_rows(rows)
    cluster = ClusterSpec.uniform(1, 1)
    for order, first in (("plan", "z"), ("searcher", "a")):
        plan = planner_mod.quick_plan(prof, cluster, "saturn", PlanningContext(), extra_steps={"z": 100},
                                      start_order=order)
        assert min(plan.assignments, key=lambda a: a.start_s).task == first
    prof = ProfileTable.from_rows(
        [
            {"task": "s", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10},
            {"task": "w", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 100},
            {"task": "w", "strategy": "ddp", "gpus": 2, "step_time_s": 1 / 1.8, "steps": 100},
        ]
    )
    plan = planner_mod.quick_plan(prof, ClusterSpec.uniform(1, 2), "saturn", PlanningContext(),
                                  extra_steps={"w": 0}, start_order="searcher")
    assert plan.assignment("s").start_s == 0.0 and plan.assignment("w").gpus == 2


def test_scheduler_releases_trials_in_the_order_tune_added_them(fake_tune, no_background):
    from ray.tune.schedulers import ASHAScheduler

    def rows(config):  # "long" may train 20x the steps of "short"; one GPU for both
        return [{"strategy": "single", "gpus": 1, "step_time_s": 1.0, "steps": config["steps"]}]

    for order, first in (("searcher", "short"), ("plan", "long")):
        asha = ASHAScheduler(metric="loss", mode="min", time_attr="training_iteration", max_t=16,
                             grace_period=1, reduction_factor=2)
        s = SaturnScheduler(rows, base_scheduler=asha, cluster=ClusterSpec.uniform(1, 1), start_order=order,
                            clock=Clock())
        tune = fake_tune(s)
        tune.add("short", {"steps": 16}), tune.add("long", {"steps": 320})
        assert tune.step() == [first], order
    with pytest.raises(TuneIntegrationError, match="start_order is 'fifo'; choose one of: searcher, plan"):
        SaturnScheduler(rows, start_order="fifo")


@pytest.mark.parametrize("latency_s, measure, moves", [(2.0, True, 1), (40.0, True, 0), (40.0, False, 1)])
def test_move_when_gain_beats_measured_restart_and_only_after_tune_paused(
    fake_tune, inline_background, latency_s, measure, moves
):
    clock = Clock()
    s = SaturnScheduler(
        scaling, cluster=ClusterSpec.uniform(1, 4), restart_s=1.0, measure_restart=measure, clock=clock
    )
    tune = fake_tune(s)
    a, b = tune.add("a", {"steps": 100}), tune.add("b", {"steps": 100})
    assert sorted(tune.step()) == ["a", "b"]
    assert a.gpus == b.gpus == 2
    # First results: 20 steps at the estimated speed, `latency_s` after the launch: the measured restart
    # (with measure_restart=False the given 1 s stays the cost; the launch is still reported).
    clock.t = 10.0 + latency_s
    assert tune.result("a", 20, 0.5) == "CONTINUE" and tune.result("b", 20, 0.5) == "CONTINUE"
    assert s.stats().restart_s == pytest.approx(latency_s if measure else 1.0)
    assert s.stats().launch_latencies_s == [pytest.approx(latency_s)] * 2
    tune.complete("b")  # stopped early: its 2 GPUs are idle, "a" could use all 4
    assert tune.step() == []  # a quick plan; the background solves it from the next hook ...
    clock.t += 0.5
    assert tune.step() == []  # ... (at once, in this test) ...
    assert tune.step() == []  # ... and it is applied here; "a" holds its GPUs until Tune has paused it
    if not moves:
        assert tune.result("a", 24, 0.5) == "CONTINUE" and s.moves == []
        return
    (m,) = s.moves
    assert (m.trial, m.from_gpus, m.to_gpus, m.changed_size) == ("a", 2, 4, True)
    clock.t += 2.0
    assert tune.result("a", 24, 0.5) == "PAUSE"  # the move: Tune checkpoints and stops it
    assert tune.step() == []  # not paused yet: its GPUs are still in use
    a.status = FakeTrial.PAUSED
    clock.t += 1.0
    assert tune.step() == ["a"]
    assert a.gpus == 4 and a.config["_saturn"] == {"strategy": "ddp", "gpus": 4, "knobs": {}, "node": "node-0"}
    assert _in_use(s.gpu_events)[1] <= 4
    assert s.stats().resizes_that_changed_size == 1
    # It continues from its checkpoint: progress is counted from step 24 on.
    clock.t += 5.0
    assert tune.result("a", 40, 0.3) == "CONTINUE"
    assert s.controller.state("a").steps_done == 40
    # The restart's start-up is measured from the step it resumed at (24, where Tune paused it), not
    # the step when the move was decided (20): 5 s less 16 steps x 0.3 s.
    assert s.stats().launch_latencies_s[-1] == pytest.approx(0.2)


def test_restart_cost_is_measured_on_launches_no_other_launch_overlapped(fake_tune, inline_background):
    """A move restarts one trial: a search's mass start (every trial of the first plan at once, slow on a
    busy machine) is its cost only until a launch that had the cluster to itself was measured."""
    clock = Clock()
    s = SaturnScheduler(scaling, cluster=ClusterSpec.uniform(1, 4), restart_s=1.0, clock=clock)
    tune = fake_tune(s)
    tune.add("a", {"steps": 100}), tune.add("b", {"steps": 100})
    assert sorted(tune.step()) == ["a", "b"]  # released together
    clock.t = 50.0  # first results 40 s after the launch, less the 20 steps they trained
    assert tune.result("a", 20, 0.5) == "CONTINUE" and tune.result("b", 20, 0.5) == "CONTINUE"
    assert s.stats().restart_s == pytest.approx(40.0)  # no launch alone yet: every launch counts
    tune.complete("b")
    tune.add("c", {"steps": 100})
    for _ in range(6):
        if "c" in tune.step():
            break
        clock.t += 0.5
    else:
        raise AssertionError("c was never launched on the GPUs b gave back")
    clock.t += 3.0 + 20 * 0.5
    assert tune.result("c", 20, 0.5) == "CONTINUE"
    assert sorted(s.stats().launch_latencies_s) == pytest.approx([3.0, 40.0, 40.0])
    assert s.stats().restart_s == pytest.approx(3.0)  # the launch alone, not the median of all (40 s)


def wider_later(config):
    # "long" beside "short" (1000 s) beats "short" then "long" on all 4 GPUs (200 + 810 s) ...
    if config["kind"] == "long":
        return [{"strategy": "ddp", "gpus": g, "step_time_s": st, "steps": 1000} for g, st in ((2, 1.0), (4, 0.81))]
    return [{"strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 200}]


def test_a_trial_stopped_to_wait_for_more_gpus_is_held_and_released_when_they_free(fake_tune, inline_background):
    """... until "long" runs at 2 s/step: the plan pauses it now and restarts it on 4 GPUs when "short"
    ends. The move waits for its GPUs (one move rule, as in ``run`` and ``simulate``); the trial is
    held PAUSED, not lost, and released on all 4 GPUs once Tune has ended "short"."""
    clock = Clock()
    s = SaturnScheduler(wider_later, cluster=ClusterSpec.uniform(1, 4), restart_s=10.0, clock=clock)
    tune = fake_tune(s)
    long, _ = tune.add("long", {"kind": "long", "steps": 1000}), tune.add("short", {"kind": "short", "steps": 200})
    assert sorted(tune.step()) == ["long", "short"] and long.gpus == 2
    for t in range(10, 90, 10):  # 8 reports: the controller's min_reports in a Tune run
        clock.t = float(t)
        assert tune.result("long", t // 2, 2.0) == "CONTINUE" and tune.result("short", t, 1.0) == "CONTINUE"
        assert tune.step() == []
    clock.t += 0.5
    assert tune.step() == []  # the background plan is applied: "long" moves, to restart later
    (m,) = s.moves
    assert (m.trial, m.from_gpus, m.to_gpus) == ("long", 2, 4) and "restart(s) later" in m.reason
    clock.t = 90.0
    assert tune.result("long", 45, 2.0) == "PAUSE"
    long.status = FakeTrial.PAUSED
    clock.t = 95.0
    assert tune.step() == [] and s._trials["long"].phase == "held"  # its 4 GPUs are not free yet
    clock.t = 200.0
    tune.complete("short")
    assert tune.step() == ["long"] and long.gpus == 4 and long.config["_saturn"]["gpus"] == 4
    assert [(e.trial, e.gpus, e.reason) for e in s.gpu_events][2:] == [
        ("long", -2, "moved"), ("short", -2, "finished"), ("long", 4, "start")
    ]
    assert _in_use(s.gpu_events)[1] <= 4


def test_a_trial_the_base_scheduler_stops_while_it_waits_to_move_is_finished_not_failed(
    fake_tune, inline_background, caplog
):
    # ASHA may stop a trial at the result where it is paused for a move that waits for busy GPUs:
    # Tune reports it completed while ray_saturn has it queued. That is a finish, not "failed ... giving up".
    clock = Clock()
    s = SaturnScheduler(wider_later, cluster=ClusterSpec.uniform(1, 4), restart_s=10.0, clock=clock)
    tune = fake_tune(s)
    tune.add("long", {"kind": "long", "steps": 1000}), tune.add("short", {"kind": "short", "steps": 200})
    assert sorted(tune.step()) == ["long", "short"]
    for t in range(10, 90, 10):
        clock.t = float(t)
        tune.result("long", t // 2, 2.0), tune.result("short", t, 1.0)
        tune.step()
    clock.t += 0.5
    tune.step()
    assert [m.trial for m in s.moves] == ["long"] and s.controller.state("long").state is TaskState.QUEUED
    with caplog.at_level(logging.INFO, logger="ray_saturn"):
        tune.complete("long")  # stopped by the base scheduler at its next result
        assert tune.step() == []
    long = s.controller.state("long")
    assert long.state is TaskState.FINISHED and long.failures == 0 and not long.reason
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    clock.t = 200.0
    tune.complete("short")
    assert tune.step() == [] and s.controller.done and _in_use(s.gpu_events)[0] == 0


def test_bad_configs_error_their_trial_and_the_search_goes_on(fake_tune, no_background, caplog):
    def picky(config):
        if config["kind"] == "raises":
            raise ValueError("no such model")
        if config["kind"] == "huge":
            return [{"strategy": "ddp", "gpus": 8, "step_time_s": 1.0, "steps": 10}]
        return [{"strategy": "single", "gpus": 1, "step_time_s": 1.0, "steps": 10}]

    s = SaturnScheduler(picky, cluster=ClusterSpec.uniform(1, 4), clock=Clock())
    tune = fake_tune(s)
    with caplog.at_level(logging.WARNING):
        for kind in ("raises", "huge", "ok"):
            tune.add(kind, {"kind": kind})
    assert sorted(tune.step()) == ["huge", "ok", "raises"]
    for kind, why in (
        ("raises", "the estimate raised ValueError: no such model"),
        ("huge", "needs 8 GPUs on one node; the largest node has 4"),
    ):
        t = tune.trials[kind]
        assert t.gpus == 0  # released with no GPU, only to raise its error
        with pytest.raises(TrialTrainingError, match="cannot run") as err:
            trial_decision(t.config)
        assert f"'kind': '{kind}'" in str(err.value) and why in str(err.value)
        assert why in caplog.text
    assert tune.trials["ok"].gpus == 1 and s.stats().rejected == 2
    # Tune records the errors; the others are unaffected.
    for kind in ("raises", "huge"):
        tune.trials[kind].status = FakeTrial.RUNNING
        s.on_trial_error(tune, tune.trials[kind])
    tune.complete("ok")
    tune.step()
    assert s.controller.done


def test_a_trial_the_base_scheduler_pauses_frees_its_gpus_and_is_planned_again(fake_tune, no_background):
    from ray.tune.schedulers import FIFOScheduler

    class PauseOnce(FIFOScheduler):
        def __init__(self):
            super().__init__()
            self.paused = set()

        def on_trial_result(self, tune_controller, trial, result):
            if trial.trial_id not in self.paused:
                self.paused.add(trial.trial_id)
                return "PAUSE"
            return "CONTINUE"

    clock = Clock()
    s = SaturnScheduler(scaling, base_scheduler=PauseOnce(), cluster=ClusterSpec.uniform(1, 4), clock=clock)
    tune = fake_tune(s)
    a = tune.add("a", {"steps": 100})
    assert tune.step() == ["a"]
    clock.t = 5.0
    assert tune.result("a", 10, 0.3) == "PAUSE"
    a.status = FakeTrial.PAUSED
    clock.t = 6.0
    assert tune.step() == ["a"]  # back in the queue, planned again, released again
    assert [e.reason for e in s.gpu_events] == ["start", "paused", "start"]
    assert s.controller.state("a").steps_done == 10 and s.moves == []


def test_estimate_steps_disagreeing_with_the_task_warn_at_the_first_result(fake_tune, no_background, caplog):
    s = SaturnScheduler(scaling, cluster=ClusterSpec.uniform(1, 4), clock=Clock())
    tune = fake_tune(s)
    tune.add("a", {"steps": 100, "lr": 0.1})
    tune.step()
    with caplog.at_level(logging.WARNING):
        tune.result("a", 10, 0.3, total=250)
        tune.result("a", 20, 0.3, total=250)
    assert caplog.text.count("the estimate says 100 steps but its task runs 250") == 1
    assert "'lr': 0.1" in caplog.text


def test_a_slow_estimate_is_warned_about_once_and_timed(fake_tune, no_background, caplog, monkeypatch):
    """The user's estimate runs inside on_trial_add: Tune waits for it. A slow one is named once, with the fix."""
    import ray_saturn.tune._scheduler as sched

    monkeypatch.setattr(sched, "SLOW_ESTIMATE_MS", 20.0)

    def slow(config):
        time.sleep(0.05)
        return scaling(config)

    s = SaturnScheduler(slow, cluster=ClusterSpec.uniform(1, 4), clock=Clock())
    tune = fake_tune(s)
    with caplog.at_level(logging.WARNING):
        tune.add("a", {"steps": 100, "lr": 0.1})
        tune.add("b", {"steps": 100, "lr": 0.2})
    assert caplog.text.count("inside Tune's on_trial_add") == 1
    assert "'lr': 0.1" in caplog.text and "before Tuner.fit()" in caplog.text
    stats = s.stats()
    assert stats.max_estimate_ms >= 50.0 and stats.hook_ms["on_trial_add"] >= stats.max_estimate_ms
    # The estimate slept: the hook's longest call was wall time, not the scheduler's CPU.
    assert stats.hook_cpu_ms["on_trial_add"] < stats.hook_ms["on_trial_add"] - 40.0


def test_a_hook_that_computes_shows_its_cpu_time(fake_tune, no_background):
    """``hook_cpu_ms`` tells a hook's own work from time its thread waited for a core."""

    def busy(config):
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.06:
            pass
        return scaling(config)

    s = SaturnScheduler(busy, cluster=ClusterSpec.uniform(1, 4), clock=Clock())
    fake_tune(s).add("a", {"steps": 100, "lr": 0.1})
    stats = s.stats()
    assert stats.hook_cpu_ms["on_trial_add"] >= 60.0
    assert stats.hook_ms["on_trial_add"] >= stats.hook_cpu_ms["on_trial_add"] - 1.0
    assert stats.hook_process_cpu_ms["on_trial_add"] >= stats.hook_cpu_ms["on_trial_add"] - 1.0


def test_a_hook_shows_the_cpu_other_threads_of_the_driver_took_meanwhile(fake_tune, no_background):
    """``hook_process_cpu_ms`` counts every thread of the process: a hook that waits while another thread
    computes shows little CPU of its own and much of the process's."""
    spun = threading.Event()

    def spin():
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.1:
            pass
        spun.set()

    def waits(config):
        threading.Thread(target=spin, daemon=True).start()
        assert spun.wait(30)
        return scaling(config)

    s = SaturnScheduler(waits, cluster=ClusterSpec.uniform(1, 4), clock=Clock())
    fake_tune(s).add("a", {"steps": 100, "lr": 0.1})
    stats = s.stats()
    assert stats.hook_process_cpu_ms["on_trial_add"] >= 100.0
    assert stats.hook_cpu_ms["on_trial_add"] < stats.hook_process_cpu_ms["on_trial_add"] - 80.0


def test_profile_table_rows_are_taken_as_they_are_with_knobs(fake_tune, no_background):
    table = ProfileTable.from_rows(
        [
            {
                "task": "w64",
                "strategy": "ddp",
                "gpus": 2,
                "step_time_s": 0.5,
                "steps": 50,
                "knobs": '{"bucket_cap_mb": 8}',
            },
            {"task": "w64", "strategy": "single", "gpus": 1, "step_time_s": 0.9, "steps": 50, "knobs": "{}"},
            {"task": "w64", "strategy": "ddp", "gpus": 8, "nodes": 2, "step_time_s": 0.2, "steps": 50, "knobs": "{}"},
            {"task": "w16", "strategy": "single", "gpus": 1, "step_time_s": 0.2, "steps": 50, "knobs": "{}"},
        ]
    )
    rows = trial_rows(profile_rows(table, "w64"), max_gpus_per_node=2)
    assert [(r.strategy, r.gpus, dict(r.knobs)) for r in rows.rows] == [
        ("ddp", 2, {"bucket_cap_mb": 8}),
        ("single", 1, {}),
    ]
    assert rows.left_out == ("ddp on 8 GPU(s): spans 2 nodes; a Tune trial is one bundle on one node",)
    assert [(r.strategy, r.gpus) for r in trial_rows(table.configs("w16"), max_gpus_per_node=2).rows] == [("single", 1)]
    with pytest.raises(TrialRejected, match="profile of 2 tasks"):
        trial_rows(table, max_gpus_per_node=2)
    with pytest.raises(TrialRejected, match="disagree on steps"):
        trial_rows(
            [
                {"strategy": "single", "gpus": 1, "step_time_s": 1, "steps": 5},
                {"strategy": "ddp", "gpus": 2, "step_time_s": 1, "steps": 6},
            ],
            max_gpus_per_node=2,
        )
    with pytest.raises(TrialRejected, match="lacks steps"):
        trial_rows([{"strategy": "single", "gpus": 1, "step_time_s": 1}], max_gpus_per_node=2)
    s = SaturnScheduler(lambda c: profile_rows(table, c["task"]), cluster=ClusterSpec.uniform(1, 2), clock=Clock())
    tune = fake_tune(s)
    t = tune.add("x", {"task": "w64"})
    tune.step()
    assert t.config["_saturn"]["knobs"] == {"bucket_cap_mb": 8} and t.gpus == 2


def test_a_trial_is_one_bundle_pinned_to_its_planned_node(fake_tune, no_background):
    from ray_saturn.spec import NodeSpec

    cluster = ClusterSpec((NodeSpec("node-a", 2, "a" * 56), NodeSpec("node-b", 2, "b" * 56)))
    s = SaturnScheduler(scaling, cluster=cluster, cpus_per_trial=0.5, clock=Clock())
    tune = fake_tune(s)
    t = tune.add("x", {"steps": 10})
    assert tune.step() == ["x"]
    pgf, node = t.placement_group_factory, t.config["_saturn"]["node"]
    assert pgf.bundles == [{"CPU": 0.5, "GPU": 2}] and pgf.strategy == "STRICT_PACK"
    assert pgf._kwargs["bundle_label_selector"] == [{"ray.io/node-id": cluster.node(node).node_id}]


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(TuneIntegrationError, match="restart_s"):
        SaturnScheduler(estimate, restart_s=-1)
    with pytest.raises(TuneIntegrationError, match="unknown policy"):
        SaturnScheduler(estimate, policy="nope")
    with pytest.raises(TuneIntegrationError, match="estimate must be a function"):
        SaturnScheduler([1, 2])
    # were accepted, and failed later inside Tune's loop
    with pytest.raises(TuneIntegrationError, match="base_scheduler is a str; give a Tune scheduler such as ASHA"):
        SaturnScheduler(estimate, base_scheduler="asha")
    with pytest.raises(TuneIntegrationError, match="a SaturnScheduler cannot wrap another"):
        SaturnScheduler(estimate, base_scheduler=SaturnScheduler(estimate))
    with pytest.raises(TuneIntegrationError, match="cluster is a tuple; give a ClusterSpec"):
        SaturnScheduler(estimate, cluster=(1, 4))
    with pytest.raises(TrialTrainingError, match="no ray_saturn decision"):
        trial_decision({"lr": 0.1})


def test_hooks_use_no_restricted_interface_with_or_without_reused_actors(fake_tune, caplog):
    from ray.tune.execution.tune_controller import TrialRunnerWrapper

    for reuse in (False, True):
        s = SaturnScheduler(estimate, cluster=ClusterSpec.uniform(1, 2), clock=Clock())
        inner = FakeTune(s)
        inner._reuse_actors = reuse
        wrapped = TrialRunnerWrapper(inner, trial_executor=object(), runner_whitelist_attr={"get_trials"})
        with caplog.at_level(logging.WARNING):
            assert s.choose_trial_to_run(wrapped) is None
            a = inner.add("a", {"width": 16})
            assert s.choose_trial_to_run(wrapped) is a  # reuse_actors=True is no error
        assert "restricted" not in caplog.text


def test_a_launch_on_a_reused_actor_is_not_a_measure_of_the_restart_cost(fake_tune, inline_background):
    """With reuse_actors=True Tune starts a trial on a finished trial's actor (no new process): its quick
    start is reported apart and does not lower the restart cost a move (always a new actor) is priced at."""
    clock = Clock()
    s = SaturnScheduler(scaling, cluster=ClusterSpec.uniform(1, 1), restart_s=1.0, clock=clock)
    tune = fake_tune(s)
    tune.add("a", {"steps": 10})
    tune.add("b", {"steps": 10})
    assert tune.step() == ["a"]  # one GPU: b waits
    clock.t = 8.0 + 10 * 0.2  # the new actor's start-up: 8 s, then 10 steps
    assert tune.result("a", 10, 0.2, pid=101) == "CONTINUE"
    tune.complete("a")
    assert tune.step() == ["b"]
    clock.t += 0.5 + 10 * 0.2  # b on a's actor (Tune kept it): 0.5 s
    assert tune.result("b", 10, 0.2, pid=101) == "CONTINUE"
    st = s.stats()
    assert st.launch_latencies_s == [pytest.approx(8.0)] and st.restart_s == pytest.approx(8.0)
    assert st.reused_actor_launches == 1 and st.reused_launch_latencies_s == [pytest.approx(0.5)]


def test_hooks_never_wait_on_the_solver_and_apply_background_plans(fake_tune, monkeypatch):
    from ray_saturn.solver import solve as real_solve

    calls = []

    def watched(*args, time_limit_s, **kw):
        calls.append((threading.current_thread() is threading.main_thread(), time_limit_s))
        return real_solve(*args, time_limit_s=time_limit_s, **kw)

    monkeypatch.setattr("ray_saturn.solver.solve", watched)
    clock = Clock()
    s = SaturnScheduler(scaling, cluster=ClusterSpec.uniform(2, 4), clock=clock, solver_time_limit_s=0.3)
    tune = fake_tune(s)
    for i in range(12):
        tune.add(f"t{i}", {"steps": 50 + 10 * i})
    tune.step()  # a quick plan; its input goes to the background from the next hook
    assert s._flush_due and s._planner._candidate is not None  # nothing handed over in that hook
    tune.step()  # hands it over
    assert not s._flush_due and s._planner._candidate is None
    assert s._planner.wait(timeout_s=60)
    clock.t = 1.0
    tune.step()  # takes the finished plan in
    assert s._planner.stats.background_solves == 1 and s._planner.fresh
    tune.step()  # applies it (or finds it changes nothing)
    st = s.stats()
    assert st.planner["background_solves"] >= 1 and not s._planner.fresh
    assert all(limit <= planner_mod.NO_SEARCH_S for in_hook, limit in calls if in_hook)  # only cheap plans in hooks
    assert any(limit > 0 for in_hook, limit in calls if not in_hook)
    assert st.max_hook_ms < 2000  # generous: a loaded 2-core CI machine
    s.close()


# ------------------------------------------------------------ the trial processes
@pytest.mark.parametrize("cuda", [False, True])
def test_each_rank_gets_its_env_device_and_backend(monkeypatch, cuda):
    seen = {}

    class Stop(Exception):
        pass

    def init(backend, **kw):
        import os

        seen.update(backend=backend, rank=kw["rank"], world=kw["world_size"], device_id=kw.get("device_id"),
                    store=kw.get("store"))
        seen["env"] = (os.environ["LOCAL_RANK"], os.environ["RANK"], os.environ["WORLD_SIZE"])
        seen["ifname"] = (os.environ.get("GLOO_SOCKET_IFNAME"), os.environ.get("NCCL_SOCKET_IFNAME"))
        raise Stop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: seen.setdefault("current", d))
    monkeypatch.setattr(torch.distributed, "init_process_group", init)
    # A rank joins the file store in its trial's private folder: nothing listens on a port.
    monkeypatch.setattr(torch.distributed, "FileStore", lambda path, world: ("store", path, world))
    monkeypatch.setattr(trainable_mod, "_die_with_parent", lambda: None)
    with mock.patch.dict("os.environ", {}), pytest.raises(Stop):
        trainable_mod._rank_main(1, 2, "/private/store", b"", "ddp", {}, 10, 5, "/nonexistent", None)
        # (the process group's own sockets on the loopback interface: seen in `init` below)
    assert seen["store"] == ("store", "/private/store", 2)
    assert seen["env"] == ("1", "1", "2")
    assert seen["ifname"] == (trainable_mod._loopback_interface(),) * 2
    assert (seen["backend"], seen["rank"], seen["world"]) == (("nccl" if cuda else "gloo"), 1, 2)
    if cuda:
        assert seen["device_id"] == torch.device("cuda", 1) and seen["current"] == torch.device("cuda", 1)
    else:
        assert seen["device_id"] is None and "current" not in seen


class FakeSession:
    """tune.get_checkpoint / tune.report outside Tune: keeps what a trial reports."""

    def __init__(self, checkpoint=None):
        self.reports, self.checkpoint = [], checkpoint

    def get_checkpoint(self):
        return self.checkpoint

    def report(self, metrics, checkpoint=None):
        import shutil
        import tempfile

        from ray.tune import Checkpoint

        kept = tempfile.mkdtemp()
        shutil.copytree(checkpoint.path, kept, dirs_exist_ok=True)
        self.reports.append((dict(metrics), Checkpoint.from_directory(kept)))


def _train(monkeypatch, config, session):
    import ray.tune

    monkeypatch.setattr(ray.tune, "report", session.report)
    monkeypatch.setattr(ray.tune, "get_checkpoint", session.get_checkpoint)
    trainable = saturn_trainable(functools.partial(regression_task, max_steps=12), report_every=4)
    trainable({"lr": 0.1, "width": 16, **config})
    return session


def test_one_gpu_trial_trains_in_process_and_resumes_without_repeating(monkeypatch):
    import multiprocessing

    def no_processes(*a, **k):
        raise AssertionError("a 1-GPU trial must not start processes or queues")

    monkeypatch.setattr(multiprocessing, "get_context", no_processes)
    first = _train(monkeypatch, {"_saturn": {"strategy": "single", "gpus": 1}}, FakeSession())
    assert [m["saturn_step"] for m, _ in first.reports] == [4, 8, 12]
    assert {m["saturn_gpus"] for m, _ in first.reports} == {1}
    # Restarted from the step-8 checkpoint on the same config: only step 12 is trained again.
    again = _train(monkeypatch, {"_saturn": {"strategy": "single", "gpus": 1}}, FakeSession(first.reports[1][1]))
    assert [m["saturn_step"] for m, _ in again.reports] == [12]
    assert again.reports[0][0]["loss"] == pytest.approx(first.reports[2][0]["loss"], rel=1e-4)


def test_a_trial_checkpoint_with_a_linked_file_is_not_followed(monkeypatch, tmp_path):
    # The trial copied Tune's checkpoint with copytree's default (links followed): a shard linked to any
    # file of the node was copied in as the file's bytes, loaded, and reported back into Tune's storage.
    first = _train(monkeypatch, {"_saturn": {"strategy": "single", "gpus": 1}}, FakeSession())
    ckpt = first.reports[1][1]
    (shard,) = [p for p in Path(ckpt.path).rglob("*.distcp")]
    elsewhere = tmp_path / "elsewhere.bin"
    shard.rename(elsewhere)
    shard.symlink_to(elsewhere)
    again = _train(monkeypatch, {"_saturn": {"strategy": "single", "gpus": 1}}, FakeSession(ckpt))
    assert [m["saturn_step"] for m, _ in again.reports] == [4, 8, 12]  # not resumed through the link


def test_the_ranks_meet_on_a_private_file_not_a_port(monkeypatch, tmp_path):
    """The ranks met on a TCPStore: first on a port found free and closed, which another process could take
    before rank 0 bound it (EADDRINUSE, seen in the suite); then on one the trial held, but torch's store
    listens on every interface of the machine whatever host it is given. Now a FileStore in the trial's own
    folder (a TemporaryDirectory: mode 0700, removed with the trial)."""
    import torch.distributed as dist
    import torch.multiprocessing as tmp

    from ray_saturn.tune._trainable import _loopback_interface, _run_multi

    class Started(Exception):
        pass

    given = {}

    def start_processes(fn, args, **kw):
        given["rendezvous"] = args[1]
        raise Started

    monkeypatch.setattr(tmp, "start_processes", start_processes)
    work = tmp_path / "trial"
    work.mkdir(mode=0o700)
    decision = trainable_mod.TrialDecision(strategy="ddp", gpus=2)
    task = regression_task({"lr": 0.1, "width": 8}, max_steps=4)
    with pytest.raises(Started):
        _run_multi(task, decision, 2, str(work / "c"), str(work), 0)
    assert os.path.dirname(given["rendezvous"]) == str(work)
    a, b = dist.FileStore(given["rendezvous"], 2), dist.FileStore(given["rendezvous"], 2)  # what two ranks do
    a.set("k", "v")
    assert b.get("k") == b"v"
    assert _loopback_interface() in ("lo", "lo0", None)


def test_multi_gpu_trial_that_finishes_ends_cleanly(monkeypatch):
    # Two ranks over gloo; every rank exits on its own after the last step (never SIGTERM'd into an error).
    session = _train(monkeypatch, {"_saturn": {"strategy": "ddp", "gpus": 2}}, FakeSession())
    assert [m["saturn_step"] for m, _ in session.reports] == [4, 8, 12]
    assert {(m["saturn_gpus"], m["saturn_strategy"]) for m, _ in session.reports} == {(2, "ddp")}


# ------------------------------------------------------------------ real Tune
@pytest.fixture
def local_ray():
    import ray

    started = []

    def start(gpus):
        ray.init(address="local", num_cpus=2, num_gpus=gpus, include_dashboard=False)
        started.append(True)
        return ray

    try:
        yield start
    finally:
        if started:
            ray.shutdown()


def _gpus_back(ray, total):
    deadline = time.monotonic() + 60
    while ray.available_resources().get("GPU", 0) < total and time.monotonic() < deadline:
        time.sleep(0.5)
    return ray.available_resources().get("GPU", 0)


@pytest.mark.ray
def test_tuner_with_asha_runs_every_trial_within_the_cluster(local_ray, tmp_path, caplog, capfd):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    ray = local_ray(4)
    scheduler = SaturnScheduler(
        estimate,
        base_scheduler=ASHAScheduler(time_attr="training_iteration", max_t=4, grace_period=1, reduction_factor=2),
        restart_s=2.0,
        cpus_per_trial=0.25,
    )
    tuner = tune.Tuner(
        saturn_trainable(functools.partial(regression_task, max_steps=24), report_every=6),
        param_space={"lr": tune.grid_search([0.3, 0.1, 0.01]), "width": tune.grid_search([16, 64])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler, reuse_actors=False),
        run_config=tune.RunConfig(name="saturn-asha", storage_path=str(tmp_path), verbose=0),
    )
    with caplog.at_level(logging.WARNING):
        grid = tuner.fit()
    scheduler.close()
    assert len(grid) == 6 and not grid.errors
    for r in grid:
        assert r.metrics["saturn_gpus"] == r.config["_saturn"]["gpus"]
        assert r.metrics["saturn_strategy"] == r.config["_saturn"]["strategy"]
        assert r.checkpoint is not None and r.metrics["loss"] == r.metrics["loss"]  # not NaN
    # Width 64 is 2x faster on 2 GPUs: DDP over 2 local processes; width 16 is not (1 GPU, in-process).
    assert any(r.config["width"] == 64 and r.config["_saturn"]["strategy"] == "ddp" for r in grid)
    assert all(r.config["_saturn"]["strategy"] == "single" for r in grid if r.config["width"] == 16)
    iters = sorted(r.metrics["training_iteration"] for r in grid)
    # Each trial ran to max_t or was stopped by ASHA at a rung (1 or 2 iterations), none errored.
    # Which ones ASHA stops depends on the order their results arrive (the first at a rung always
    # goes on), so a run where it stops none is possible; the STOP path itself is asserted with a
    # fixed order in test_trials_are_planned_for_the_steps_asha_is_expected_to_let_them_train.
    assert iters[-1] == 4 and set(iters) <= {1, 2, 4}
    used, peak = _in_use(scheduler.gpu_events)
    assert used == 0 and 0 < peak <= 4
    # One bundle per placement group, no nested ones; nothing holds GPUs afterwards.
    from ray.util import placement_group_table

    groups = list(placement_group_table().values())
    assert 0 < len(groups) <= len([e for e in scheduler.gpu_events if e.gpus > 0])
    assert all(len(g["bundles"]) == 1 for g in groups)
    assert _gpus_back(ray, 4) == 4
    out, err = capfd.readouterr()  # the driver's output, with what Ray forwards from the trials
    for text in (caplog.text, out, err):
        assert "restricted" not in text and "leaked semaphore" not in text


class Slow(torch.nn.Module):
    """A linear layer whose forward takes ``delay_s`` split over the data-parallel ranks (like a real step)."""

    def __init__(self, delay_s):
        super().__init__()
        self.lin, self.delay_s = torch.nn.Linear(8, 1), delay_s

    def forward(self, x):
        ranks = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        time.sleep(self.delay_s / ranks)
        return self.lin(x)


def slow_task(config, *, max_steps):
    from ray_saturn import Task

    task = regression_task({"lr": 0.05, "width": 8}, max_steps=max_steps)
    return Task(
        name=f"slow-{config['name']}",
        model=lambda hp: Slow(config["delay_s"]),
        data=task.data,
        loss=task.loss,
        optimizer=task.optimizer,
        hparams=task.hparams,
        max_steps=max_steps,
        batch_size=task.batch_size,
    )


@pytest.mark.ray
def test_tuner_with_reused_actors_starts_the_next_trial_on_a_finished_ones_actor(local_ray, tmp_path):
    """reuse_actors=True: Tune keeps a finished trial's actor and bundle (1 GPU on the node) for the next
    trial of that bundle, which trains from step 0 with its own decision; the GPUs all come back."""
    from ray import tune

    ray = local_ray(2)
    scheduler = SaturnScheduler(estimate, restart_s=2.0, cpus_per_trial=0.25)
    tuner = tune.Tuner(
        saturn_trainable(functools.partial(regression_task, max_steps=12), report_every=6),
        param_space={"lr": tune.grid_search([0.3, 0.1, 0.03, 0.01]), "width": 16},
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler, reuse_actors=True),
        run_config=tune.RunConfig(name="saturn-reuse", storage_path=str(tmp_path), verbose=0),
    )
    grid = tuner.fit()
    scheduler.close()
    assert len(grid) == 4 and not grid.errors
    for r in grid:
        assert r.config["_saturn"]["gpus"] == r.metrics["saturn_gpus"] == 1
        assert r.metrics["saturn_step"] == 12 and r.metrics["saturn_resumed_from"] == 0
    st = scheduler.stats()
    assert st.reused_actor_launches >= 1, st  # a second wave on the first wave's actors
    assert len(st.launch_latencies_s) + st.reused_actor_launches == 4
    assert len({r.metrics["pid"] for r in grid}) < 4
    used, peak = _in_use(scheduler.gpu_events)
    assert used == 0 and 0 < peak <= 2
    assert _gpus_back(ray, 2) == 2


@pytest.mark.ray
def test_tuner_moves_a_trial_to_more_gpus_and_it_resumes_from_its_checkpoint(local_ray, tmp_path):
    import sys

    from ray import cloudpickle, tune

    ray = local_ray(2)
    steps = 48
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the slow task lives in this test module

    def rows(config):
        d = config["delay_s"]
        return [
            {"strategy": "single", "gpus": 1, "step_time_s": d, "steps": steps},
            {"strategy": "ddp", "gpus": 2, "step_time_s": d * 0.55, "steps": steps},
        ]

    # Side by side on 1 GPU each (planned); "short" is stopped after its first report, so "long" can
    # have both GPUs: the move pays for itself when the long trial has most of its steps left. The
    # scheduler moves only when the planned gain, net of the restart, exceeds the restart cost again
    # (control/moves.py). A cost measured from the trials' launches (5-8 s on 2 idle cores, 15-25 s on
    # loaded ones) made the move a coin toss, so this test, about the move's mechanics, fixes it at 2 s
    # (~0.27 s gained a step at 0.6 s a step over the ~40 steps left clears twice that 2.7 times; it still
    # clears it with 15 steps left, 29 steps or ~17 s of launch skew after "short" stops); the rule
    # against measured costs is test_move_when_gain_beats_measured_restart_and_only_after_tune_paused.
    scheduler = SaturnScheduler(rows, restart_s=2.0, measure_restart=False, cpus_per_trial=0.25)
    stop_short = tune.stopper.FunctionStopper(lambda tid, result: result["config"]["name"] == "short")
    tuner = tune.Tuner(
        saturn_trainable(functools.partial(slow_task, max_steps=steps), report_every=4),
        param_space={"name": tune.grid_search(["long", "short"]), "delay_s": 0.6},
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler, reuse_actors=False),
        run_config=tune.RunConfig(name="saturn-move", storage_path=str(tmp_path), verbose=0, stop=stop_short),
    )
    grid = tuner.fit()
    scheduler.close()
    assert not grid.errors
    long = next(r for r in grid if r.config["name"] == "long")
    assert [(m.from_gpus, m.to_gpus) for m in scheduler.moves if m.trial == long.metrics["trial_id"]] == [(1, 2)]
    history = long.metrics_dataframe
    seen = list(zip(history["saturn_step"], history["saturn_gpus"], history["saturn_resumed_from"], strict=True))
    before = [s for s, g, _ in seen if g == 1]
    after = [(s, r) for s, g, r in seen if g == 2]
    # 1 GPU from the start, then 2 from the move on, to the last step.
    assert [g for _, g, _ in seen] == sorted(g for _, g, _ in seen) and seen[-1][:2] == (steps, 2), seen
    last = before[-1] if before else 0
    assert before == list(range(4, last + 1, 4)) and {r for s, g, r in seen if g == 1} <= {0}, seen
    # The moved trial went on from its checkpoint (saturn_resumed_from: the step its new process loaded):
    # no step repeated, none skipped. Which reports before the pause have a result row is Tune's affair:
    # a report that lands while the trial is being paused keeps its checkpoint but may log no row, and
    # rows of the paused process were seen missing (resumed from 8 with rows [4] and with none).
    (resumed,) = {r for _, r in after}
    assert resumed > 0 and resumed % 4 == 0 and resumed >= last, seen
    assert [s for s, _ in after] == list(range(resumed + 4, steps + 1, 4)), seen
    assert long.config["_saturn"]["gpus"] == 2
    assert _gpus_back(ray, 2) == 2


# ------------------------------------------------------------ shares of one GPU and GPU types
def quarters(config):
    return [{"strategy": "single", "gpus": "1/4", "step_time_s": 0.05, "steps": 20}]


def test_trials_planned_on_a_share_get_the_share_as_their_resources(fake_tune, no_background):
    clock = Clock()
    s = SaturnScheduler(quarters, cluster=ClusterSpec.uniform(1, 1), policy="saturn-static", clock=clock)
    tune = fake_tune(s)
    for i in range(5):
        tune.add(f"q{i}", {"lr": 0.1})
    started = tune.step()
    assert len(started) == 4  # four quarters share the one GPU; the fifth waits for a quarter of it
    for tid in started:
        t = tune.trials[tid]
        bundles = t.placement_group_factory.bundles
        assert bundles == [{"CPU": pytest.approx(bundles[0]["CPU"]), "GPU": 0.25}]
        assert t.config["_saturn"]["gpus"] == 0.25 and t.config["_saturn"]["devices"] == [0]
        assert trial_decision(t.config).workers == 1
    assert sum(e.gpus for e in s.gpu_events) == pytest.approx(1.0) and s.stats().max_gpus_in_use == 1.0
    assert tune.step() == []
    clock.t = 1.0
    tune.complete(started[0])
    assert tune.step() == ["q4"] and tune.trials["q4"].placement_group_factory.bundles[0]["GPU"] == 0.25


def test_trial_rows_take_shares_and_types():
    rows = trial_rows(
        [
            {"strategy": "single", "gpus": 0.25, "step_time_s": 0.3, "steps": 10},
            {"strategy": "single", "gpus": 1, "step_time_s": 0.2, "steps": 10, "gpu_type": "A100"},
            {"strategy": "single", "gpus": 1, "step_time_s": 0.4, "steps": 10, "gpu_type": "T4"},
        ],
        max_gpus_per_node=2,
        gpu_types=("A100", None),
    )
    assert [(r.gpus, r.gpu_type) for r in rows.rows] == [(0.25, None), (1, "A100")]
    assert rows.left_out == ("single on 1 GPU(s) of T4: no node is of type T4 (types: A100)",)
    assert rows.to_rows("t")[1]["gpu_type"] == "A100"
    with pytest.raises(TrialRejected, match=r"gpus is 0.3; give a whole number >= 1, or a share"):
        trial_rows([{"strategy": "single", "gpus": 0.3, "step_time_s": 0.3, "steps": 10}], max_gpus_per_node=2)


def test_typed_trial_runs_on_its_type_and_mixes_with_shares(fake_tune, no_background):
    from ray_saturn.spec import NodeSpec

    def typed(config):
        if config["kind"] == "big":
            return [{"strategy": "single", "gpus": 1, "step_time_s": 0.05, "steps": 20, "gpu_type": "fast"}]
        return [{"strategy": "single", "gpus": 0.5, "step_time_s": 0.05, "steps": 20}]

    cluster = ClusterSpec((NodeSpec("f", 1, gpu_type="fast"), NodeSpec("s", 1, gpu_type="slow")))
    s = SaturnScheduler(typed, cluster=cluster, policy="saturn-static", clock=Clock())
    tune = fake_tune(s)
    tune.add("big", {"kind": "big"})
    for i in range(2):
        tune.add(f"h{i}", {"kind": "half"})
    assert sorted(tune.step()) == ["big", "h0", "h1"]
    assert tune.trials["big"].config["_saturn"]["node"] == "f"
    assert tune.trials["big"].config["_saturn"]["gpu_type"] == "fast"
    assert {tune.trials[f"h{i}"].config["_saturn"]["node"] for i in range(2)} == {"s"}


@pytest.mark.ray
def test_tuner_runs_two_half_share_trials_at_once_on_one_gpu(local_ray, tmp_path):
    """A real Tuner: two trials whose only row is a 1/2 share get {"GPU": 0.5} bundles and train at
    once on the one logical GPU (two training processes, what two cores hold)."""
    from ray import tune

    ray = local_ray(1)

    def halves(config):
        return [{"strategy": "single", "gpus": 0.5, "step_time_s": 0.05, "steps": 24}]

    scheduler = SaturnScheduler(halves, restart_s=2.0, cpus_per_trial=0.25, policy="saturn-static")
    tuner = tune.Tuner(
        saturn_trainable(functools.partial(regression_task, max_steps=24), report_every=6),
        param_space={"lr": tune.grid_search([0.3, 0.1]), "width": 16},
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler, reuse_actors=False),
        run_config=tune.RunConfig(name="saturn-halves", storage_path=str(tmp_path), verbose=0),
    )
    grid = tuner.fit()
    scheduler.close()
    assert len(grid) == 2 and not grid.errors
    for r in grid:
        assert r.config["_saturn"]["gpus"] == 0.5 and r.metrics["saturn_gpus"] == 0.5
        assert r.config["_saturn"]["devices"] == [0] and r.metrics["saturn_step"] == 24
    used, peak = _in_use(scheduler.gpu_events)
    assert used == 0 and peak == pytest.approx(1.0)  # both held the GPU's halves at once
    assert _gpus_back(ray, 1) == 1
