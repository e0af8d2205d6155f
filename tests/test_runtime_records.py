"""The runtime's own house: one task-state model, one Segment type, the run folder's files,
settings checked up front. Ray-free (fake launcher and ledger)."""

from __future__ import annotations

import pytest

import ray_saturn
from ray_saturn import ClusterSpec, ProfileTable, SaturnError
from ray_saturn.control import Controller, Placement, Segment, TaskFinished, TaskState
from ray_saturn.runtime.config import DriverConfig, emulation_config
from ray_saturn.runtime.driver import Driver
from ray_saturn.runtime.fake import FakeLauncher, LedgerManager
from ray_saturn.runtime.journal import Journal
from ray_saturn.runtime.records import DriverResult, TaskRecord
from ray_saturn.runtime.storage import RunStorage


def _profile(steps=(40, 100)):
    return ProfileTable.from_rows(
        [{"task": f"t{i}", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": n} for i, n in enumerate(steps)]
    )


def _driver(tmp_path, prof, **kw):
    cfg = DriverConfig(solver_time_limit_s=1.0, checkpoint_interval_s=10.0, poll_wall_s=2.0, node_check_wall_s=0.0)
    return Driver(prof, LedgerManager(ClusterSpec.uniform(1, 2)), FakeLauncher(), RunStorage(tmp_path), cfg, **kw)


def test_records_read_their_state_from_the_controller(tmp_path):
    d = _driver(tmp_path, _profile())
    for rec in d.records.values():
        assert rec.progress is d.controller.state(rec.task)
    while not any(r.state == "running" for r in d.records.values()):
        d.step()
    for t, rec in d.records.items():
        p = d.controller.state(t)
        assert (rec.state == "running") == (p.state is TaskState.RUNNING and rec.current is not None)
    result = d.run(max_steps=10_000)
    assert {r.state for r in result.tasks.values()} == {"finished"}
    assert all(r.progress.state is TaskState.FINISHED for r in result.tasks.values())


def test_segment_and_result_round_trip_through_json_and_read_the_older_key(tmp_path):
    d = _driver(tmp_path, _profile())
    result = d.run(max_steps=10_000)
    again = DriverResult.from_dict(result.to_dict())
    assert again.to_dict() == result.to_dict()
    seg = result.tasks["t0"].segments[0]
    assert isinstance(seg, Segment) and seg.status == "finished" and seg.first_step_s is not None
    legacy = {**seg.to_dict(), "launch_s": seg.start_s}
    del legacy["start_s"]
    assert Segment.from_dict(legacy) == seg
    state = Journal(RunStorage(tmp_path)).read_state()
    assert {t: r["state"] for t, r in state["tasks"].items()} == {"t0": "finished", "t1": "finished"}


def test_controller_starts_from_steps_already_done():
    prof = _profile(steps=(40, 100, 50))
    ctl = Controller(
        prof, ClusterSpec.uniform(1, 2), "saturn-static", solver_time_limit_s=1, steps_done={"t0": 40, "t1": 30},
        failed={"t2": "gave up"},
    )
    assert ctl.state("t0").state is TaskState.FINISHED and ctl.state("t2").state is TaskState.FAILED
    (launch,) = ctl.start(0.0)
    assert (launch.task, launch.steps_done) == ("t1", 30)
    assert ctl.plan.makespan_s == pytest.approx(70.0)  # the remaining 70 steps, not 100
    assert ctl.handle(TaskFinished(time_s=70.0, task="t1")) == [] and ctl.done
    with pytest.raises(SaturnError, match=r"give 0\.\.40"):
        Controller(prof, ClusterSpec.uniform(1, 2), "saturn-static", steps_done={"t0": 41})


def test_a_resumed_driver_with_everything_done_finishes_at_once(tmp_path):
    prof = _profile()
    done = {t: TaskRecord(t, n, steps_done=n) for t, n in (("t0", 40), ("t1", 100))}
    for rec in done.values():
        rec.progress.state = TaskState.FINISHED
        rec.segments.append(Segment(Placement("ddp", 1, ("node-0",)), 0.0, end_s=rec.total_steps, status="finished"))
    records = {t: TaskRecord.from_dict(r.to_dict(0.0)) for t, r in done.items()}
    d = _driver(tmp_path, prof, records=records, clock_offset_s=100.0)
    result = d.run(max_steps=100)
    assert result.state == "finished" and not d.launcher.launched


def test_unknown_policy_is_refused_before_anything_starts(tmp_path):
    import ray

    from ray_saturn.toy import mlp_task

    with pytest.raises(SaturnError, match="unknown policy 'nope'"):
        ray_saturn.run([mlp_task("a", lr=0.1)], storage=tmp_path / "run", policy="nope")
    assert not ray.is_initialized() and not (tmp_path / "run").exists()
    with pytest.raises(SaturnError, match="unknown policy"):
        ray_saturn.emulate(_profile(), 1, 1, time_scale=0.01, policy="nope", storage=tmp_path / "e")


@pytest.mark.parametrize("policy", ["nope", "saturn", 5, None])
def test_a_driver_config_with_an_unknown_policy_is_refused_at_construction(policy):
    """DriverConfig(policy="nope") was accepted; only run() refused it, later."""
    with pytest.raises(SaturnError, match=r"unknown policy .*; choose from: saturn-static, saturn-replan") as err:
        DriverConfig(policy=policy)
    assert "\n" not in str(err.value) and "fifo-whole-node" in str(err.value)
    with pytest.raises(SaturnError, match="unknown policy 'nope'"):
        DriverConfig().with_policy("nope")
    assert DriverConfig(policy="fifo-whole-node").policy == "fifo-whole-node"


def test_a_config_policy_is_never_overwritten_by_a_default(tmp_path):
    from ray_saturn.toy import mlp_task

    cfg = DriverConfig(policy="saturn-static")
    assert cfg.with_policy(None) is cfg
    with pytest.raises(SaturnError, match="give it once"):
        ray_saturn.run([mlp_task("a", lr=0.1)], storage=tmp_path / "run", policy="saturn-replan", config=cfg)
    with pytest.raises(SaturnError, match="give it once"):
        ray_saturn.emulate(_profile(), 1, 1, time_scale=0.01, config=emulation_config(0.01), policy="saturn-static")


def test_local_mode_never_runs_more_training_processes_than_cores():
    from ray_saturn.runtime.local import local_gpus

    lg = local_gpus(4, cores=2, cuda_devices=0)
    assert (lg.gpus, lg.threads_per_worker, lg.cuda) == (2, 1, False)
    assert "2 logical GPUs" in lg.describe() and "asked for 4" in lg.describe() and "2 cores" in lg.describe()
    assert local_gpus(None, cores=16, cuda_devices=0).gpus == 4  # default: up to 4
    assert local_gpus(2, cores=16, cuda_devices=0).threads_per_worker == 8
    assert local_gpus(None, cores=8, cuda_devices=2).describe() == "Using 2 CUDA GPU(s)."
    with pytest.raises(SaturnError, match="at least 1"):
        local_gpus(0)
