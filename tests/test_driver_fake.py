"""The driver's state machine, stepped with the Ray-free fake launcher and ledger."""

from __future__ import annotations

import pytest

from ray_saturn import ClusterSpec, ProfileTable, SaturnError
from ray_saturn.runtime.driver import (
    EVENTS_FILE,
    STATE_FILE,
    Driver,
    DriverConfig,
    Launching,
    Planning,
    Running,
    TaskRecord,
)
from ray_saturn.runtime.fake import FakeLauncher, LedgerManager
from ray_saturn.runtime.storage import RunStorage


def profile(n=3, steps=100, gpus=(1, 2)):
    rows = []
    for i in range(n):
        for g in gpus:
            rows.append(
                {
                    "task": f"t{i}",
                    "strategy": "ddp",
                    "gpus": g,
                    "step_time_s": round(1.0 / g**0.8, 4),
                    "steps": steps,
                }
            )
    return ProfileTable.from_rows(rows)


def config(**kw):
    base = dict(
        solver_time_limit_s=1.0,
        checkpoint_interval_s=10.0,
        poll_wall_s=2.0,
        restart_s=5.0,
        node_check_wall_s=0.0,
    )
    base.update(kw)
    return DriverConfig(**base)


def make(tmp_path, prof=None, cluster=None, launcher=None, **kw):
    prof = prof or profile()
    mgr = LedgerManager(cluster or ClusterSpec.uniform(2, 2))
    launcher = launcher or FakeLauncher()
    return Driver(prof, mgr, launcher, RunStorage(tmp_path), config(**kw)), mgr, launcher


def test_states_step_one_at_a_time(tmp_path):
    d, _, launcher = make(tmp_path)
    assert isinstance(d.state, Planning)
    assert isinstance(d.step(), Launching)
    assert isinstance(d.step(), Running)
    assert launcher.launched, "launching started segments"
    assert all(r.state in ("launching", "running", "queued") for r in d.records.values())


def test_runs_to_the_end_and_records_everything(tmp_path):
    d, mgr, _ = make(tmp_path)
    result = d.run(max_steps=10_000)
    assert result.state == "finished"
    for rec in result.tasks.values():
        assert rec.state == "finished" and rec.steps_done == rec.total_steps == 100
        assert rec.segments[-1].status == "finished"
    assert mgr.ledger.reservations() == []  # every GPU handed back
    # Realised makespan is close to the plan (the fake runs at the profiled speed).
    assert result.realised_makespan_s == pytest.approx(result.planned_makespan_s, rel=0.1)
    state = RunStorage(tmp_path).read_json(STATE_FILE)
    assert state["driver_state"] == "finished"
    assert {t["state"] for t in state["tasks"].values()} == {"finished"}
    kinds = [e["kind"] for e in RunStorage(tmp_path).read_jsonl(EVENTS_FILE)]
    assert kinds.count("launch") == 3 and kinds.count("task_finished") == 3 and "replan" in kinds


def test_off_estimate_replans_and_moves_with_reasons(tmp_path):
    # t0 runs 3x slower than profiled on every configuration: the driver re-plans and moves.
    slow = FakeLauncher(true_step_time=lambda s: s.step_time_s * (3.0 if s.task == "t0" else 1.0))
    prof = profile(n=4, steps=200, gpus=(1, 2))
    # The fake reports once per driver poll (2 s here): 3 of them span what 10 of a real run do (5 s).
    d, _, _ = make(tmp_path, prof=prof, launcher=slow, restart_s=1.0, min_reports=3)
    result = d.run(max_steps=10_000)
    assert result.state == "finished"
    events = RunStorage(tmp_path).read_jsonl(EVENTS_FILE)
    replans = [e for e in events if e["kind"] == "replan"]
    assert any("t0 runs at" in r for e in replans for r in e["reasons"]), replans
    assert all(e["reasons"] for e in replans)
    moves = [e for e in events if e["kind"] == "move"]
    # The slow task is moved onto more GPUs once the others free them (gain >> the 1 s restart).
    assert result.moves >= 1 and len(moves) == result.moves
    assert any(m["task"] == "t0" and m["to"]["gpus"] == 2 for m in moves), moves
    for m in moves:
        assert "restart cost" in m["reason"]
    assert all(r.steps_done == 200 for r in result.tasks.values())


def test_killed_worker_resumes_from_its_last_checkpoint(tmp_path):
    d, _, launcher = make(
        tmp_path,
        prof=profile(n=2, steps=100),
        cluster=ClusterSpec.uniform(1, 2),
        checkpoint_interval_s=10.0,
    )
    while not any(r.steps_done >= 35 for r in d.records.values()):
        d.step()
    victim = next(t for t, r in d.records.items() if r.steps_done >= 35)
    launcher.kill(victim)
    result = d.run(max_steps=10_000)
    rec = result.tasks[victim]
    assert result.state == "finished" and rec.steps_done == rec.total_steps
    failed, resumed = rec.segments[-2], rec.segments[-1]
    assert failed.status == "failed" and "worker killed" in failed.reason
    every = launcher.launched[0].checkpoint_every
    assert resumed.steps_start >= failed.steps_end - every and resumed.steps_start > 0
    assert resumed.steps_start % every == 0  # from a checkpoint


def test_a_task_whose_every_configuration_fails_is_marked_failed(tmp_path):
    broken = FakeLauncher(fail=lambda s: "CUDA error: boom" if s.task == "t1" else None)
    d, _, _ = make(tmp_path, launcher=broken, max_failures=2)
    result = d.run(max_steps=10_000)
    assert result.state == "finished"
    assert result.failed_tasks == ["t1"]
    assert "CUDA error: boom" in result.tasks["t1"].reason
    assert len(result.tasks["t1"].segments) == 3  # first try + max_failures retries
    others = {t: r.state for t, r in result.tasks.items() if t != "t1"}
    assert others == {"t0": "finished", "t2": "finished"}
    state = RunStorage(tmp_path).read_json(STATE_FILE)
    assert state["tasks"]["t1"]["state"] == "failed" and "boom" in state["tasks"]["t1"]["reason"]


def test_lost_node_replans_onto_the_others(tmp_path):
    d, mgr, _ = make(tmp_path, prof=profile(n=4, steps=100))
    while not any(r.steps_done >= 20 for r in d.records.values()):
        d.step()
    victim_node = next(s.nodes[0] for r in d.records.values() for s in r.segments if r.current)
    mgr.lose_node(victim_node)
    result = d.run(max_steps=10_000)
    assert result.state == "finished"
    assert all(r.steps_done == r.total_steps for r in result.tasks.values())
    interrupted = [s for r in result.tasks.values() for s in r.segments if s.status == "interrupted"]
    assert interrupted, "the lost node was running something"
    for rec in result.tasks.values():
        cut = [s for s in rec.segments if s.status == "interrupted"]
        for s in cut:
            assert s.reason == "node lost"
        later = rec.segments[len(rec.segments) - 1]
        if cut:
            assert victim_node not in later.nodes
    kinds = [e["kind"] for e in RunStorage(tmp_path).read_jsonl(EVENTS_FILE)]
    assert "node_lost" in kinds and "node_lost_detected" in kinds


def test_resume_after_the_driver_died(tmp_path):
    prof = ProfileTable.from_rows(
        [
            {"task": f"t{i}", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": n}
            for i, n in enumerate((40, 100, 150))
        ]
    )
    first = FakeLauncher()
    d, _, _ = make(
        tmp_path,
        prof=prof,
        launcher=first,
        cluster=ClusterSpec.uniform(1, 2),
        checkpoint_interval_s=10.0,
    )
    while not any(r.state == "finished" for r in d.records.values()) or all(
        r.state == "finished" for r in d.records.values()
    ):
        d.step()
    d.persist(force=True)
    # The driver dies here. A new one starts from the persisted state and the checkpoints.
    state = RunStorage(tmp_path).read_json(STATE_FILE)
    done = {t for t, r in state["tasks"].items() if r["state"] == "finished"}
    at_death = {t: r["steps_done"] for t, r in state["tasks"].items()}
    assert done and any(0 < at_death[t] < 150 for t in at_death if t not in done)
    second = FakeLauncher()
    second.checkpoints = dict(first.checkpoints)
    records = {t: TaskRecord.from_dict(r) for t, r in state["tasks"].items()}
    d2 = Driver(
        prof,
        LedgerManager(ClusterSpec.uniform(1, 2)),
        second,
        RunStorage(tmp_path),
        config(checkpoint_interval_s=10.0),
        records=records,
        clock_offset_s=state["time_s"],
    )
    result = d2.run(max_steps=10_000)
    assert result.state == "finished"
    assert all(r.steps_done == r.total_steps for r in result.tasks.values())
    relaunched = {s.task for s in second.launched}
    assert not relaunched & done, "finished tasks are not run again"
    every = first.launched[0].checkpoint_every
    for spec in second.launched:
        start = first.checkpoints.get(spec.checkpoint_dir, 0)
        assert at_death[spec.task] - start <= every, "at most one checkpoint interval lost"
        assert start > 0 or at_death[spec.task] < every
        seg = result.tasks[spec.task].segments[-1]
        assert seg.steps_start == start
    assert result.realised_makespan_s > state["time_s"]


def test_a_task_arriving_later_is_planned_when_it_arrives(tmp_path):
    prof = profile(n=3, steps=100)
    d = Driver(
        prof,
        LedgerManager(ClusterSpec.uniform(2, 2)),
        FakeLauncher(),
        RunStorage(tmp_path),
        config(),
        arrivals={"t2": 50.0},
    )
    result = d.run(max_steps=10_000)
    assert result.state == "finished"
    assert result.tasks["t2"].segments[0].start_s >= 50.0
    # The planned makespan is the plan made once t2 had arrived, not the first plan (t0 and t1 only).
    replans = [e for e in RunStorage(tmp_path).read_jsonl(EVENTS_FILE) if e["kind"] == "replan"]
    at_arrival = next(e for e in replans if "t2 arrived" in e["reasons"])
    assert result.planned_makespan_s == pytest.approx(at_arrival["planned_makespan_s"], abs=1.0)
    assert result.planned_makespan_s > replans[0]["planned_makespan_s"]
    assert all(r.steps_done == r.total_steps for r in result.tasks.values())
    events = RunStorage(tmp_path).read_jsonl(EVENTS_FILE)
    assert any(e["kind"] == "replan" and "t2 arrived" in e["reasons"] and e["time_s"] >= 50 for e in events)


def _shapes_profile():
    rows = [{"task": t, "strategy": "fsdp", "gpus": 2, "step_time_s": 1.0, "steps": 30, "startup_s": 20.0}
            for t in ("a", "b")]
    rows.append({"task": "c", "strategy": "single", "gpus": 1, "step_time_s": 1.0, "steps": 30, "startup_s": 20.0})
    return ProfileTable.from_rows(rows)


def test_a_finished_segments_workers_run_the_next_task_of_its_shape_without_a_new_start(tmp_path):
    cluster = ClusterSpec.uniform(1, 2)
    results = {}
    for reuse in (False, True):
        launcher = FakeLauncher(launch_latency_s=0.0, reuse_latency_s=0.5 if reuse else None)
        d, mgr, _ = make(tmp_path / str(reuse), prof=_shapes_profile(), cluster=cluster, launcher=launcher,
                         poll_wall_s=0.5)
        results[reuse] = (d.run(max_steps=10_000), launcher, d)
        assert results[reuse][0].state == "finished"
        assert mgr.ledger.reservations() == []
    plain, _, _ = results[False]
    result, launcher, d = results[True]
    # The two 2-GPU tasks run back to back: the second on the first one's parked workers.
    assert len(launcher.reused) == 1 and launcher.reused[0] in ("a", "b")
    events = RunStorage(tmp_path / "True").read_jsonl(EVENTS_FILE)
    reused = [e["task"] for e in events if e["kind"] == "launch" and e.get("reused_workers")]
    assert reused == launcher.reused
    started = {e["task"]: e["launch_latency_s"] for e in events if e["kind"] == "started"}
    assert started[launcher.reused[0]] < 1.0 and started["c"] >= 20.0
    # Parked workers of no use to the next launch (c needs 1 GPU) are let go.
    assert launcher.released >= 1
    # A reused launch's short start is no evidence of what a move's new trainer costs.
    assert len(d._latencies) == 2
    assert result.realised_makespan_s <= plain.realised_makespan_s - 19.0


def test_a_backfilled_task_runs_narrow_then_moves_onto_its_planned_row(tmp_path):
    """Backfill through the driver: "big" waits for all 4 GPUs in the plan, runs on the idle one
    meanwhile, is stopped (checkpoint) when "a" ends and relaunched on 4 GPUs from its checkpoint."""
    rows = [
        {"task": "a", "strategy": "ddp", "gpus": 3, "step_time_s": 1.0, "steps": 300},
        {"task": "big", "strategy": "ddp", "gpus": 4, "step_time_s": 1.0, "steps": 200},
        {"task": "big", "strategy": "single", "gpus": 1, "step_time_s": 4.0, "steps": 200},
    ]
    launcher = FakeLauncher(launch_latency_s=0.0)
    mgr = LedgerManager(ClusterSpec.uniform(1, 4))
    d = Driver(ProfileTable.from_rows(rows), mgr, launcher, RunStorage(tmp_path),
               config(backfill=True, restart_s=1.0, poll_wall_s=1.0, checkpoint_interval_s=5.0),
               arrivals={"big": 5.0})
    result = d.run(max_steps=10_000)
    assert result.state == "finished" and mgr.ledger.reservations() == []
    segs = result.tasks["big"].segments
    assert [s.gpus for s in segs] == [1, 4]
    assert segs[0].status == "stopped" and 0 < segs[0].steps_end == segs[1].steps_start
    assert result.tasks["big"].steps_done == 200
    events = RunStorage(tmp_path).read_jsonl(EVENTS_FILE)
    assert [e["task"] for e in events if e["kind"] == "backfill"] == ["big"]
    assert any(e["kind"] == "move" and "backfill" in e["reason"] for e in events)
    # Without backfill the GPU stays idle and "big" runs once, later.
    d2 = Driver(ProfileTable.from_rows(rows), LedgerManager(ClusterSpec.uniform(1, 4)),
                FakeLauncher(launch_latency_s=0.0), RunStorage(tmp_path / "plain"),
                config(backfill=False, restart_s=1.0, poll_wall_s=1.0), arrivals={"big": 5.0})
    plain = d2.run(max_steps=10_000)
    assert [s.gpus for s in plain.tasks["big"].segments] == [4]
    assert result.realised_makespan_s < plain.realised_makespan_s


def test_driver_config_backfill_must_be_a_bool_or_none():
    with pytest.raises(SaturnError, match=r"DriverConfig\.backfill is 'yes'; give True, False or None"):
        DriverConfig(backfill="yes")
