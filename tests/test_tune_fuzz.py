"""The Tune integration's public interface under bad or unusual input: each case was a traceback, a
crashed search, a hang or a silently wrong plan; now a one-line error (of that trial alone where the
problem is one trial's) or the right result."""

from __future__ import annotations

import numpy as np
import pytest
from tune_fakes import Clock, FakeTrial

from ray_saturn import ClusterSpec, ProfileTable
from ray_saturn.tune import SaturnScheduler, TrialRejected, TrialTrainingError, trial_decision, trial_rows
from ray_saturn.tune import _planner as planner_mod


def row(**kw):
    r = {"strategy": "single", "gpus": 1, "step_time_s": 1.0, "steps": 10}
    r.update(kw)
    return r


# ------------------------------------------------------------ estimate rows
@pytest.mark.parametrize(
    ("bad", "why"),
    [
        # were truncated (10.7 -> 10 steps, nodes 1.5 -> 1), read as 1 step (True) or nodes 0 as 1
        (row(steps=10.7), "steps is 10.7; give a whole number"),
        (row(steps=True), "steps is True; give a whole number"),
        (row(nodes=1.5), "nodes is 1.5; give a whole number"),
        (row(nodes=0), "nodes is 0; give a whole number"),
        # was an OverflowError, reported as "the estimate raised OverflowError"
        (row(steps=float("inf")), "steps is inf; give a whole number"),
        (row(feasible=2), "feasible is 2; use true or false"),
        (row(feasible="maybe"), "feasible is 'maybe'; use true or false"),
    ],
)
def test_rows_the_profile_table_would_refuse_are_refused_with_the_column(bad, why):
    with pytest.raises(TrialRejected, match=why):
        trial_rows([bad], max_gpus_per_node=4)


def test_a_nan_feasible_is_an_empty_cell_as_in_the_profile_table():
    # pandas' missing value (rows from to_dict("records")): the table reads it as an empty cell, i.e. feasible
    rows = trial_rows([row(feasible=float("nan"))], max_gpus_per_node=4)
    assert [(r.strategy, r.gpus) for r in rows.rows] == [("single", 1)]


def test_feasible_false_in_any_spelling_leaves_the_row_out():
    # numpy's False (rows from pandas' to_dict("records")) and 0 were taken as feasible
    for false in (np.bool_(False), 0, "no", "FALSE"):
        rows = trial_rows([row(feasible=false, step_time_s=float("nan")), row(strategy="ddp", gpus=2)],
                          max_gpus_per_node=4)
        assert [(r.strategy, r.gpus) for r in rows.rows] == [("ddp", 2)], false
        assert "single on 1 GPU(s): infeasible" in rows.left_out[0]


def test_strategy_names_are_matched_as_in_a_profile_table():
    # " DDP" was "not registered" here although a profile table (and run) takes it as ddp
    rows = trial_rows([row(strategy=" DDP", gpus=2)], max_gpus_per_node=4)
    assert rows.rows[0].strategy == "ddp"


def test_rows_of_several_tasks_are_refused_not_merged_into_one_trial():
    table = ProfileTable.from_rows([row(task="a"), row(task="b", strategy="ddp", gpus=2)])
    # mappings and Config rows of two tasks were merged into one trial's rows (a ProfileTable was refused)
    for raw in (table.to_arrow().to_pylist(), table.configs("a") + table.configs("b")):
        with pytest.raises(TrialRejected, match=r"rows are of 2 tasks \(a, b\); return the rows of the one task"):
            trial_rows(raw, max_gpus_per_node=4)
    assert len(trial_rows(table.configs("a"), max_gpus_per_node=4).rows) == 1


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({"steps": 1e30}, "steps is 1e\\+30; give a whole number"),
        ({"steps": 10**12, "step_time_s": 1e3}, "steps x step_time_s = .* beyond 1e\\+12 s"),
    ],
)
def test_rows_the_controller_would_refuse_error_that_trial_not_the_search(fake_tune, no_background, bad, why):
    # They passed the trial's check and then made the controller's profile table raise inside
    # choose_trial_to_run: the whole search crashed (every trial of the batch with it).
    s = SaturnScheduler(lambda c: [row(**c)], cluster=ClusterSpec.uniform(1, 2), clock=Clock())
    tune = fake_tune(s)
    tune.add("ok", {})
    tune.add("bad", bad)
    assert sorted(tune.step()) == ["bad", "ok"]
    assert trial_decision(tune.trials["ok"].config).gpus == 1
    with pytest.raises(TrialTrainingError, match=why):
        trial_decision(tune.trials["bad"].config)
    s.close()


def test_a_user_key_named_saturn_errors_that_trial_and_own_gpus_are_warned_about(fake_tune, no_background, caplog):
    # The '_saturn' key was overwritten by the scheduler's decision at launch, and resources of the
    # trainable's own (tune.with_resources) silently replaced by the planned bundle.
    from ray.tune.execution.placement_groups import PlacementGroupFactory

    s = SaturnScheduler(lambda c: [row()], cluster=ClusterSpec.uniform(1, 2), clock=Clock())
    tune = fake_tune(s)
    own = FakeTrial("own", {})
    own.placement_group_factory = PlacementGroupFactory([{"CPU": 1, "GPU": 2}])
    tune.trials["own"] = own
    with caplog.at_level("WARNING", logger="ray_saturn.tune._scheduler"):
        s.on_trial_add(tune, own)
        tune.add("mine", {"_saturn": "my value"})
    assert sum("asks for 2 GPU(s) of its own" in r.getMessage() for r in caplog.records) == 1
    assert sorted(tune.step()) == ["mine", "own"]
    assert trial_decision(tune.trials["own"].config).gpus == 1
    with pytest.raises(TrialTrainingError, match=r"its config has the key '_saturn'.*rename that key in param_space"):
        trial_decision(tune.trials["mine"].config)
    s.close()


def test_start_order_plan_with_a_completion_objective_is_refused():
    from ray_saturn.tune import TuneIntegrationError

    with pytest.raises(TuneIntegrationError, match="start_order='plan' applies to objective 'makespan' only"):
        SaturnScheduler(lambda c: [row()], objective="online", start_order="plan")


# ------------------------------------------------------------ constructor arguments
@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        # were accepted: a bundle asking Ray for infinitely many CPUs (the search waited for ever), a
        # background solve with no time limit, True taken as 1
        ({"cpus_per_trial": float("inf")}, "cpus_per_trial is inf; it must be a finite number >= 0"),
        ({"cpus_per_trial": True}, "cpus_per_trial is True; it must be a finite number"),
        ({"solver_time_limit_s": float("inf")}, "solver_time_limit_s is inf; it must be a finite number > 0"),
        ({"restart_s": True}, "restart_s is True; it must be a finite number >= 0"),
        # were read as True (any non-empty string is)
        ({"measure_restart": "no"}, "measure_restart is 'no'; give True or False"),
        ({"expect_early_stops": "false"}, "expect_early_stops is 'false'; give True or False"),
        # failed at the first trial, inside Tune's loop, with "'int' object is not callable"
        ({"clock": 3}, "clock is a int; give a function"),
    ],
)
def test_bad_constructor_arguments_are_one_line_errors(kwargs, why):
    from ray_saturn.tune import TuneIntegrationError

    with pytest.raises(TuneIntegrationError, match=why):
        SaturnScheduler(lambda c: [row()], **kwargs)


def test_numpy_numbers_are_numbers():
    s = SaturnScheduler(lambda c: [row()], cpus_per_trial=np.int64(2), restart_s=np.float32(3.0))
    assert s.stats().restart_s == 3.0
    s.close()


# ------------------------------------------------------------ the trial side
@pytest.mark.parametrize("every", [2.5, "x", None, float("nan"), float("inf")])
def test_saturn_trainable_refuses_a_report_every_that_is_not_a_whole_number(every):
    from ray_saturn.tune import saturn_trainable

    # 2.5 was cut to 2; the others were a bare ValueError / TypeError / OverflowError
    with pytest.raises(TrialTrainingError, match=r"report_every is .*; give a whole number >= 1"):
        saturn_trainable(lambda c: None, report_every=every)
    assert callable(saturn_trainable(lambda c: None, report_every="5"))


@pytest.mark.parametrize(
    "raw",
    [{}, {"strategy": "ddp"}, {"strategy": "ddp", "gpus": "x"}, {"strategy": "ddp", "gpus": 0},
     {"strategy": "ddp", "gpus": 2, "knobs": "[1]"}, {"error": ""}],
)
def test_a_config_saturn_key_that_is_no_decision_is_a_one_line_error(raw):
    # were KeyError 'gpus', ValueError, or a decision on 0 GPUs
    with pytest.raises(TrialTrainingError, match=r"not a decision of SaturnScheduler .* leave it out of param_space"):
        trial_decision({"lr": 0.1, "_saturn": raw})
    assert trial_decision({"_saturn": {"strategy": "ddp", "gpus": 2.0, "knobs": None}}).gpus == 2


# ------------------------------------------------------------ the cluster against Ray's resources
def _ray_node(node_id, gpus, cpus=2.0, alive=True):
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": cpus, **({"GPU": gpus} if gpus else {})}}


RAY_NODES = [_ray_node("a" * 56, 4), _ray_node("b" * 56, 2, cpus=8.0), _ray_node("c" * 56, 0, cpus=64.0),
             _ray_node("d" * 56, 8, cpus=64.0, alive=False)]


@pytest.mark.parametrize(
    ("cluster", "cpus", "why"),
    [
        # a bundle of 8 GPUs / 4 CPUs no alive GPU node holds: Tune waited for it for ever
        (ClusterSpec.uniform(1, 8), 1.0, "cluster node 'node-0' has 8 GPUs but the largest Ray node has 4"),
        (None, 16.0, "cpus_per_trial is 16, but no GPU node of the Ray cluster has more than 8 CPUs"),
        ("ids", 1.0, "has node_id dddddddddddd..., which no alive node of the Ray cluster has"),
    ],
)
def test_a_cluster_or_bundle_ray_cannot_hold_is_refused_before_any_trial(monkeypatch, cluster, cpus, why):
    import ray

    from ray_saturn.spec import NodeSpec
    from ray_saturn.tune import TuneIntegrationError

    if cluster == "ids":
        cluster = ClusterSpec((NodeSpec("node-a", 4, "a" * 56), NodeSpec("node-d", 8, "d" * 56)))
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: RAY_NODES)
    monkeypatch.setattr(planner_mod.BackgroundPlanner, "start", lambda self: None)  # no Ray actor here
    s = SaturnScheduler(lambda c: [row()], cluster=cluster, cpus_per_trial=cpus)
    try:
        with pytest.raises(TuneIntegrationError, match=why):
            s.set_search_properties("loss", "min")
    finally:
        s.close()
    # what Ray can hold is taken: 4 GPUs on the first node, 8 CPUs on the second
    ok = SaturnScheduler(lambda c: [row()], cluster=ClusterSpec.uniform(2, 4), cpus_per_trial=8.0)
    try:
        assert ok.set_search_properties("loss", "min")
    finally:
        ok.close()


# ------------------------------------------------------------ what a trainable of one's own reports
@pytest.mark.parametrize(
    "bad",
    [
        # were ValueError / OverflowError / TypeError raised from on_trial_result: the whole search ended
        {"saturn_step": float("nan")},
        {"saturn_step": "x"},
        {"saturn_step": float("inf")},
        {"saturn_step_time_s": float("nan")},  # was an AttributeError in statistics.stdev
        {"saturn_step_time_s": "0.5"},
        {"saturn_total_steps": "x"},
        # were taken: a step before the start made the measured restart cost 8 s instead of 0
        {"saturn_step": -5},
        {"saturn_step": 3.7},
    ],
)
def test_odd_progress_reports_are_warned_about_and_left_out(fake_tune, no_background, caplog, bad):
    import logging

    two = [row(), row(strategy="ddp", gpus=2, step_time_s=0.6)]
    clock = Clock()
    s = SaturnScheduler(lambda c: two, cluster=ClusterSpec.uniform(1, 2), clock=clock)
    tune = fake_tune(s)
    tune.add("a", {})
    tune.step()
    clock.t = 3.0
    result = {"saturn_step": 3, "saturn_step_time_s": 1.0, "saturn_total_steps": 10, **bad}
    with caplog.at_level(logging.WARNING, logger="ray_saturn"):
        assert s.on_trial_result(tune, tune.trials["a"], dict(result)) == "CONTINUE"
        assert s.on_trial_result(tune, tune.trials["a"], dict(result)) == "CONTINUE"
    key = next(iter(bad))
    warned = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    assert len(warned) == 1 and f"trial a reported {key}={bad[key]!r}, not" in warned[0], caplog.text
    # a good report after it counts as ever
    clock.t = 4.0
    tune.step()
    s.on_trial_result(tune, tune.trials["a"], {"saturn_step": 4, "saturn_step_time_s": 1.0})
    assert s.controller.state("a").steps_done == 4 and s.stats().restart_s == 0.0
    s.close()


def test_an_endless_num_samples_is_refused_before_any_trial(monkeypatch):
    import sys

    from ray_saturn.tune import TuneIntegrationError

    monkeypatch.setattr(planner_mod.BackgroundPlanner, "start", lambda self: None)
    s = SaturnScheduler(lambda c: [row()], cluster=ClusterSpec.uniform(1, 2))
    # Tune turns num_samples=-1 into sys.maxsize; every added trial was held PAUSED, so Tune's loop asked
    # the searcher for trials without end (16,000 trials in 40 s, none started) and never came back.
    with pytest.raises(TuneIntegrationError, match=r"num_samples=-1 .* give TuneConfig\(num_samples=N\)"):
        s.set_search_properties("loss", "min", num_samples=sys.maxsize, stop=None, time_budget_s=None)
    assert s.set_search_properties("loss", "min", num_samples=12, stop=None, time_budget_s=None)
    s.close()


@pytest.fixture(scope="module")
def ray_2_gpus():
    from tests.ray_head import local_ray

    with local_ray(num_gpus=2, num_cpus=2):
        yield


@pytest.mark.ray
def test_tuner_refuses_what_would_have_waited_for_ever_at_once(ray_2_gpus, tmp_path):
    import functools

    from ray import tune

    from ray_saturn.tune import TuneIntegrationError, saturn_trainable
    from ray_saturn.workloads.regression import regression_task

    def fit(scheduler):
        tuner = tune.Tuner(
            saturn_trainable(functools.partial(regression_task, max_steps=6), report_every=3),
            param_space={"lr": 0.1, "width": 16},
            # without the checks the search ran out its time budget with no trial started (Tune only warned)
            tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler, time_budget_s=20),
            run_config=tune.RunConfig(name="refused", storage_path=str(tmp_path), verbose=0),
        )
        # (without the checks fit() returned after the budget, having raised nothing)
        try:
            with pytest.raises(TuneIntegrationError) as err:
                tuner.fit()
        finally:
            scheduler.close()
        return str(err.value)

    est = lambda config: [row(steps=6, step_time_s=0.01)]  # noqa: E731
    assert "cpus_per_trial is 4, but no GPU node of the Ray cluster has more than 2 CPUs" in fit(
        SaturnScheduler(est, cpus_per_trial=4))
    assert "cluster node 'node-0' has 8 GPUs but the largest Ray node has 2" in fit(
        SaturnScheduler(est, cpus_per_trial=0.25, cluster=ClusterSpec.uniform(1, 8)))


#: what the counting searcher saw: for each suggestion, how many trials had completed by then
_SUGGESTED_AFTER: list[int] = []


@pytest.mark.ray
def test_a_searcher_under_max_concurrent_trials_sees_results_before_it_suggests_more(ray_2_gpus, tmp_path):
    """Waiting trials are held PAUSED, so Tune asks a searcher for its next config at once: a searcher
    that learns from results (Optuna, HyperOpt) would suggest every config before any result. With
    ``max_concurrent_trials`` (what the README tells users of such searchers) it is asked only as trials end."""
    import functools

    from ray import tune
    from ray.tune.search import Searcher

    from ray_saturn.tune import saturn_trainable
    from ray_saturn.workloads.regression import regression_task

    class Counting(Searcher):
        def __init__(self):
            super().__init__()
            self.completed = 0

        def set_search_properties(self, metric, mode, config, **spec):
            self._metric, self._mode = metric, mode
            return True

        def suggest(self, trial_id):
            _SUGGESTED_AFTER.append(self.completed)
            return {"lr": 0.1, "width": 16}

        def on_trial_complete(self, trial_id, result=None, error=False):
            self.completed += 1

    _SUGGESTED_AFTER.clear()
    scheduler = SaturnScheduler(lambda config: [row(steps=6, step_time_s=0.01)], cpus_per_trial=0.5)
    tuner = tune.Tuner(
        saturn_trainable(functools.partial(regression_task, max_steps=6), report_every=3),
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=4, search_alg=Counting(),
                                    max_concurrent_trials=2, scheduler=scheduler),
        run_config=tune.RunConfig(name="searcher", storage_path=str(tmp_path), verbose=0),
    )
    try:
        results = tuner.fit()
    finally:
        scheduler.close()
    assert results.num_errors == 0 and len(results) == 4
    assert len(_SUGGESTED_AFTER) == 4
    # at most 2 trials live at once: the k-th suggestion (0-based) came after k - 1 trials had completed
    assert all(seen >= k - 1 for k, seen in enumerate(_SUGGESTED_AFTER)), _SUGGESTED_AFTER


def test_no_background_planner_is_started_when_the_base_scheduler_refuses_the_search(monkeypatch):
    # Tune never closes a scheduler whose set_search_properties raised: its planner actor was left running.
    from ray.tune.schedulers import FIFOScheduler

    started = []
    monkeypatch.setattr(planner_mod.BackgroundPlanner, "start", lambda self: started.append(self))

    class Refusing(FIFOScheduler):
        def set_search_properties(self, metric, mode, **spec):
            raise ValueError("metric and mode already set")

    s = SaturnScheduler(lambda c: [row()], base_scheduler=Refusing(), cluster=ClusterSpec.uniform(1, 2))
    with pytest.raises(ValueError, match="already set"):
        s.set_search_properties("loss", "min", num_samples=4)
    assert started == []
    ok = SaturnScheduler(lambda c: [row()], cluster=ClusterSpec.uniform(1, 2))
    assert ok.set_search_properties("loss", "min", num_samples=4)
    assert len(started) == 1
    ok.close()
    s.close()
