"""Tune integration: a real Tuner with ASHA on a local Ray with logical GPUs, and the scheduler's decisions."""

from __future__ import annotations

import functools
import time

import pytest

from ray_saturn import ClusterSpec
from ray_saturn.tune import SaturnScheduler, TuneIntegrationError, saturn_trainable
from ray_saturn.workloads.regression import regression_task


def estimate(config):
    # Wider models gain from 2 GPUs, narrow ones do not.
    return [
        {"strategy": "single", "gpus": 1, "step_time_s": 0.02 * config["width"] / 16, "steps": 24},
        {"strategy": "ddp", "gpus": 2, "step_time_s": 0.004 * config["width"] / 16 + 0.01, "steps": 24},
    ]


# ------------------------------------------------------------ scheduler alone
class FakeTrial:
    PENDING, RUNNING, PAUSED, TERMINATED, ERROR = "PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR"

    def __init__(self, tid, config):
        self.trial_id, self.config, self.status = tid, dict(config), self.PENDING
        self.placement_group_factory = None

    def set_status(self, status):
        self.status = status

    def update_resources(self, pgf):
        assert self.status != self.RUNNING
        self.placement_group_factory = pgf

    def invalidate_json_state(self):
        pass


class FakeController:
    _reuse_actors = False

    def __init__(self):
        self.trials = []

    def get_trials(self):
        return self.trials


@pytest.fixture
def patched_trial(monkeypatch):
    import ray_saturn.tune._scheduler as sched

    monkeypatch.setattr(sched, "Trial", FakeTrial)
    return FakeTrial


def _used(events):
    used, peak = 0, 0
    for e in events:
        used += e.gpus
        peak = max(peak, used)
    return used, peak


def test_scheduler_holds_orders_and_frees(patched_trial):
    s = SaturnScheduler(estimate, cluster=ClusterSpec.uniform(1, 2), allow_moves=False)
    tc = FakeController()
    for i, width in enumerate([16, 64, 16]):
        t = FakeTrial(f"t{i}", {"width": width, "lr": 0.1})
        tc.trials.append(t)
        s.on_trial_add(tc, t)
        assert t.status == FakeTrial.PAUSED  # held: no actor, no GPUs
    started = []
    while (t := s.choose_trial_to_run(tc)) is not None:
        assert t.config["_saturn"]["gpus"] == t.placement_group_factory.required_resources["GPU"]
        t.status = FakeTrial.PENDING
        started.append(t.trial_id)
    assert started  # something fits
    used, peak = _used(s.gpu_events)
    assert peak <= 2 and used <= 2
    # The plan's start order is respected: started trials are the earliest planned.
    starts = {a.task: a.start_s for a in s.plans[-1].assignments}
    waiting = [t.trial_id for t in tc.trials if t.trial_id not in started]
    assert all(starts[a] <= starts[b] + 1e-9 for a in started for b in waiting)
    # An early stop (ASHA) frees the GPUs at once and the next trial starts.
    first = next(t for t in tc.trials if t.trial_id == started[0])
    first.status = FakeTrial.TERMINATED
    s.on_trial_complete(tc, first, {})
    assert _used(s.gpu_events)[0] == used - first.config["_saturn"]["gpus"]
    nxt = s.choose_trial_to_run(tc)
    assert nxt is not None and nxt.trial_id in waiting


def test_replan_moves_a_running_trial_and_paused_trial_gives_gpus_back(patched_trial):
    def sublinear(config):  # 2 GPUs are barely faster: best alone, wasteful when another waits
        return [{"strategy": "single", "gpus": 1, "step_time_s": 0.08, "steps": 24},
                {"strategy": "ddp", "gpus": 2, "step_time_s": 0.075, "steps": 24}]

    s = SaturnScheduler(sublinear, cluster=ClusterSpec.uniform(1, 2), restart_s=0.0, replan_interval_s=1e-6)
    tc = FakeController()
    a = FakeTrial("a", {"width": 64, "lr": 0.1})
    tc.trials.append(a)
    s.on_trial_add(tc, a)
    assert s.choose_trial_to_run(tc) is a
    assert a.config["_saturn"]["strategy"] == "ddp" and a.config["_saturn"]["gpus"] == 2  # alone: 2 GPUs faster
    a.status = FakeTrial.RUNNING
    for i in range(1):  # another arrives: 1 GPU each is better
        t = FakeTrial(f"b{i}", {"width": 64, "lr": 0.1})
        tc.trials.append(t)
        s.on_trial_add(tc, t)
    decision = s.on_trial_result(tc, a, {"saturn_step": 2, "saturn_step_time_s": 0.075})
    assert decision == "PAUSE" and s.moves and s.moves[0][0] == "a"
    a.status = FakeTrial.PAUSED  # Tune checkpointed it and stopped its actor
    s.choose_trial_to_run(tc)
    released = [e for e in s.gpu_events if e.trial == "a" and e.gpus < 0]
    assert released and released[0].reason == "moved"
    assert _used(s.gpu_events)[1] <= 2


def test_bad_estimates_are_one_line_errors(patched_trial):
    tc = FakeController()
    t = FakeTrial("x", {"width": 16, "lr": 0.1})
    with pytest.raises(TuneIntegrationError, match="no feasible single-node row"):
        SaturnScheduler(lambda c: [{"strategy": "magic", "gpus": 2, "step_time_s": 1, "steps": 3},
                                   {"strategy": "ddp", "gpus": 4, "nodes": 2, "step_time_s": 1, "steps": 3},
                                   {"strategy": "single", "gpus": 2, "step_time_s": 1, "steps": 3}],
                        cluster=ClusterSpec.uniform(1, 2)).on_trial_add(tc, t)
    with pytest.raises(TuneIntegrationError, match="lacks"):
        SaturnScheduler(lambda c: [{"strategy": "single"}], cluster=ClusterSpec.uniform(1, 2)).on_trial_add(tc, t)
    with pytest.raises(TuneIntegrationError, match="restart_s"):
        SaturnScheduler(estimate, restart_s=-1)


# ------------------------------------------------------------------ real Tune
@pytest.fixture
def ray_4gpus():
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=4, include_dashboard=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.ray
def test_tuner_with_asha_runs_every_trial_within_the_cluster(ray_4gpus, tmp_path):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    ray = ray_4gpus
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
    t0 = time.monotonic()
    grid = tuner.fit()
    assert time.monotonic() - t0 < 240
    assert len(grid) == 6 and not grid.errors
    for r in grid:
        assert r.metrics["saturn_gpus"] == r.config["_saturn"]["gpus"]
        assert r.checkpoint is not None
        assert r.metrics["loss"] == r.metrics["loss"]  # not NaN
    # Width 64 is 3x faster on 2 GPUs: those trials ran DDP over 2 local processes.
    assert any(r.config["_saturn"]["strategy"] == "ddp" and r.metrics["saturn_gpus"] == 2 for r in grid)
    iters = sorted(r.metrics["training_iteration"] for r in grid)
    assert iters[-1] == 4 and iters[0] < 4  # ASHA stopped some trials early, others ran to max_t
    # The ledger never held more than the cluster and ends empty: every trial gave its GPUs back.
    used, peak = _used(scheduler.gpu_events)
    assert used == 0 and 0 < peak <= 4
    assert len(scheduler.plans) >= 6  # planned online, once per arrival at least
    # No nested placement groups: the only placement groups are the trials' own, one bundle each, one per start.
    from ray.util import placement_group_table

    groups = list(placement_group_table().values())
    starts = [e for e in scheduler.gpu_events if e.gpus > 0]
    assert 0 < len(groups) <= len(starts)
    assert all(len(g["bundles"]) == 1 for g in groups), [g["bundles"] for g in groups]
    # Nothing kept GPUs after the run (no paused trial or leaked placement group holds them).
    deadline = time.monotonic() + 20
    while ray.available_resources().get("GPU", 0) < 4 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("GPU", 0) == 4
