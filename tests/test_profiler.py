"""The profiler runs for real on a local Ray with logical GPUs (gloo, small models)."""

from __future__ import annotations

import json

import pytest
import ray
from ray_head import local_ray

import ray_saturn
from ray_saturn.errors import InfeasibleError, ProfileError, SaturnError
from ray_saturn.profile_table import ProfileTable
from ray_saturn.profiler import Profiler, gpu_ladder, knobs_for
from ray_saturn.profiler.ladder import LadderWalk
from ray_saturn.profiler.store import StoredTrial
from ray_saturn.spec import ClusterSpec
from ray_saturn.strategies import strategy_names
from ray_saturn.toy import faulty_task, mlp_task

CLUSTER = ClusterSpec.uniform(1, 2)
# (the start-up probe: tests/test_segment_costs.py)
FAST = {"warmup": 1, "steps": 2, "min_measure_s": 0.0, "segment_costs": False}


@pytest.fixture(scope="module")
def ray_local():
    with local_ray(num_gpus=2, num_cpus=2):
        yield


@pytest.fixture(scope="module")
def sweep(ray_local, tmp_path_factory):
    store = str(tmp_path_factory.mktemp("store") / "store.parquet")
    tasks = [
        mlp_task("a-lr0.1", lr=0.1, seed=1, max_steps=500),
        mlp_task("a-lr0.01", lr=0.01, seed=2, max_steps=700),
        mlp_task("b-wide", width=64, max_steps=300),
    ]
    result = Profiler(CLUSTER, strategies=["single", "ddp", "pipeline"], store=store, **FAST).run(tasks)
    return tasks, store, result


@pytest.mark.ray
def test_profile_table_passes_validation_and_the_planner(sweep, tmp_path):
    tasks, _, result = sweep
    table = result.table
    path = table.write(tmp_path / "profile.parquet")
    again = ProfileTable.read(path)
    again.check_strategies(strategy_names())
    again.check_feasible()
    assert set(again.tasks) == {t.name for t in tasks}
    for t in tasks:
        rows = {(c.strategy, c.gpus): c for c in again.configs(t.name)}
        assert set(rows) == {("single", 1), ("ddp", 2), ("pipeline", 2)}
        assert all(c.feasible and c.step_time_s > 0 and c.peak_mem_gb >= 0 for c in rows.values())
        assert all(c.steps == t.total_steps for c in rows.values())
    plan = ray_saturn.plan(again, CLUSTER)
    ray_saturn.validate_plan(plan, again, CLUSTER)
    assert {a.task for a in plan.assignments} == {t.name for t in tasks}


@pytest.mark.ray
def test_trials_on_one_node_run_on_warm_workers(sweep):
    # 6 trials (2 signatures x single on 1 GPU, ddp and pipeline on 2) need 10 worker processes
    # started afresh; lent from trial to trial, the 2 GPUs' workers are started once.
    _, _, result = sweep
    assert result.trials_run == 6 and result.workers_started == 2


@pytest.mark.ray
def test_tasks_differing_only_in_lr_and_seed_are_measured_once(sweep):
    _, _, result = sweep
    assert result.trials_run == 6  # 2 signatures x (single@1, ddp@2, pipeline@2)
    a = {(c.strategy, c.gpus): c.step_time_s for c in result.table.configs("a-lr0.1")}
    b = {(c.strategy, c.gpus): c.step_time_s for c in result.table.configs("a-lr0.01")}
    assert a == b
    sig = result.table.to_arrow().column("signature").to_pylist()
    assert len(set(sig)) == 2


@pytest.mark.ray
def test_profiler_reports_its_cost_next_to_the_workload(sweep):
    _, _, result = sweep
    assert result.cost_gpu_s > 0 and result.workload_gpu_s > 0
    assert result.cost_ratio == pytest.approx(result.cost_gpu_s / result.workload_gpu_s)
    assert "GPU-s" in result.summary() and "% of the workload" in result.summary()
    knobs = knobs_for(result.table, "b-wide", "pipeline", 2)
    assert set(knobs) == {"microbatches", "split"}


@pytest.mark.ray
def test_store_makes_a_second_run_free(sweep):
    tasks, store, first = sweep
    again = Profiler(CLUSTER, strategies=["single", "ddp", "pipeline"], store=store, **FAST).run(tasks[:2])
    assert again.trials_run == 0 and again.trials_cached == 3 and again.cost_gpu_s == 0
    assert [c.step_time_s for c in again.table.configs("a-lr0.1")] == [
        c.step_time_s for c in first.table.configs("a-lr0.1")
    ]


@pytest.mark.ray
def test_failures_and_hangs_become_infeasible_rows(ray_local):
    tasks = [
        faulty_task("raises", "raise"),
        faulty_task("ooms", "oom"),
        faulty_task("hangs", "hang"),
        mlp_task("fine"),
    ]
    result = Profiler(CLUSTER, strategies=["single"], trial_timeout_s=12, **FAST).run(tasks)
    t = result.table
    reasons = {name: t.get(name, "single", 1).reason or "" for name in ("raises", "ooms", "hangs")}
    assert not any(t.get(name, "single", 1).feasible for name in reasons)
    assert "RuntimeError: toy model failure" in reasons["raises"]
    assert "out of memory" in reasons["ooms"]
    assert "hung" in reasons["hangs"] and "killed" in reasons["hangs"]
    assert t.get("fine", "single", 1).feasible
    with pytest.raises(InfeasibleError, match="raises"):
        ray_saturn.plan(t, CLUSTER)


@pytest.mark.ray
def test_memory_limit_makes_a_configuration_infeasible(ray_local):
    tasks = [mlp_task("m"), mlp_task("n", width=48)]
    result = Profiler(CLUSTER, strategies=["single", "ddp"], memory_limit_gb=1e-9, **FAST).run(tasks)
    for task in ("m", "n"):
        for strategy, gpus in (("single", 1), ("ddp", 2)):
            row = result.table.get(task, strategy, gpus)
            assert not row.feasible and "exceeds the 1e-09 GB per GPU" in row.reason
    # Refused by the budget after measuring: a 2-GPU group is intact and its workers are lent on.
    assert result.trials_run == 4 and result.workers_started == 2


def test_only_a_search_that_raised_ends_its_workers():
    from ray_saturn.profiler.pool import group_intact
    from ray_saturn.strategies.base import Infeasible, SearchResult, Trial

    measured = Trial({}, 0.1, 0.5, "peak memory 0.50 GB exceeds the 0.1 GB per GPU")
    raised = Trial({"micro_batches": 2}, None, None, "RuntimeError: connection closed by peer")
    assert group_intact(SearchResult("ddp", 2, {}, 0.1, 0.5, (Trial({}, 0.1, 0.5),)))
    assert group_intact(Infeasible("ddp", 2, "no knob setting ran", (measured,)))
    assert group_intact(Infeasible("ddp", 2, "needs an even batch"))  # never started a setting
    assert not group_intact(Infeasible("ddp", 2, "no knob setting ran", (measured, raised)))


@pytest.mark.ray
def test_cli_profile(ray_local, tmp_path, capsys):
    from ray_saturn.cli import main

    tasks_file = tmp_path / "tasks.py"
    tasks_file.write_text(
        "from ray_saturn.toy import mlp_task\ntasks = [mlp_task('x', lr=0.1), mlp_task('y', lr=0.2)]\n"
    )
    out = tmp_path / "p.csv"
    rc = main(
        [
            "profile",
            str(tasks_file),
            "-o",
            str(out),
            "--nodes",
            "1",
            "--gpus-per-node",
            "1",
            "--strategies",
            "single",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--no-segment-costs",
            "--json",
        ]
    )
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["trials_run"] == 1 and report["rows"] == 2 and report["profile_gpu_s"] > 0
    assert ProfileTable.read(out).tasks == ["x", "y"]


def test_profile_needs_ray(monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(SaturnError, match=r"ray.init\(\)"):
        ray_saturn.profile([mlp_task()], CLUSTER)


def test_gpu_ladder_and_stop_rule():
    assert gpu_ladder(ClusterSpec.uniform(1, 8)) == [(1, 1), (2, 1), (4, 1), (8, 1)]
    assert gpu_ladder(ClusterSpec.uniform(3, 2)) == [(1, 1), (2, 1), (4, 2), (6, 3)]
    chain = LadderWalk(mlp_task(), "s", "ddp", [(1, 1), (2, 1), (4, 1), (8, 1)])

    def trial(g, t, reason=None):
        return StoredTrial("s", "ddp", g, 1, t, reason is None, None, reason, "{}", 1.0)

    chain.advance(trial(1, 1.0), 0.05)
    chain.advance(trial(2, 0.6), 0.05)
    assert chain.next() == (4, 1)
    chain.advance(trial(4, 0.59), 0.05)  # under 5% better: stop growing
    assert chain.next() is None
    oom = LadderWalk(mlp_task(), "s", "fsdp", [(1, 1), (2, 1), (4, 1)])
    oom.advance(trial(1, None, "no knob setting ran: out of memory: CUDA out of memory"), 0.05)
    assert oom.next() == (2, 1)  # more GPUs may fit
    broken = LadderWalk(mlp_task(), "s", "ddp", [(1, 1), (2, 1)])
    broken.advance(trial(1, None, "RuntimeError: bug"), 0.05)
    assert broken.next() is None  # more GPUs will not fix a bug


def test_knobs_for_missing_row():
    t = ProfileTable.from_rows(
        [{"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 1, "knobs": "{}"}]
    )
    with pytest.raises(ProfileError, match="no row"):
        knobs_for(t, "a", "ddp", 4)


def test_profiler_option_errors():
    with pytest.raises(SaturnError, match="min_improvement"):
        Profiler(CLUSTER, min_improvement=1.5)
    with pytest.raises(SaturnError, match="not registered"):
        Profiler(CLUSTER, strategies=["nope"])


@pytest.mark.ray
def test_a_trial_that_cannot_be_placed_is_infeasible(ray_local):
    # the spec claims 4 GPUs on the node; Ray has 2, so the 4-GPU trial never gets its bundles
    result = Profiler(ClusterSpec.uniform(1, 4), strategies=["ddp"], placement_timeout_s=3, **FAST).run([mlp_task("p")])
    assert result.table.get("p", "ddp", 2).feasible
    row = result.table.get("p", "ddp", 4)
    assert not row.feasible and "no placement for 4 GPU(s) on 1 node(s) within 3 s" in row.reason


def test_a_strategy_that_fits_no_gpu_count_says_why_for_each_count():
    # It gave the first count's reason only: "pipeline needs at least 2 GPUs" on a 2-GPU cluster, where
    # the reason on 2 GPUs (the model is no nn.Sequential) was the one to fix.
    from ray_saturn.profiler.profiler import _reasons_by_count

    got = _reasons_by_count({(1, 1): "needs at least 2 GPUs", (2, 1): "needs an nn.Sequential model",
                             (4, 2): "needs an nn.Sequential model"})
    assert got == "on 1 GPU: needs at least 2 GPUs; on 2 GPUs, 4 GPUs over 2 nodes: needs an nn.Sequential model"
    assert _reasons_by_count({}) == "no GPU count fits"
