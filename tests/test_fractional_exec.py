"""Executing shares of one GPU and GPU types: the controller's device ledger, dispatch, re-plans around
the devices running tasks hold, and simulated runs whose realised timeline passes the per-device check."""

from __future__ import annotations

import random

import pytest

from ray_saturn import ClusterSpec, ProfileTable
from ray_saturn.control import Controller, TaskFinished
from ray_saturn.control.dispatch import PlannedTask, dispatch
from ray_saturn.control.occupancy import Occupancy
from ray_saturn.control.state import Placement, Segment
from ray_saturn.devices import check_devices
from ray_saturn.errors import SaturnError
from ray_saturn.sim import SimConfig, SimulationError, realised_plan, simulate
from ray_saturn.spec import NodeSpec


def row(task, gpus, step, steps=100, **kw):
    strategy = "single" if gpus < 1 else "ddp"
    return {"task": task, "strategy": strategy, "gpus": gpus, "step_time_s": step, "steps": steps, **kw}


def share_sweep(seed: int = 0, shares: int = 16, whole: int = 4) -> list[dict]:
    """``shares`` small jobs with a whole-GPU row and a 1/4-share row at 1.5 x its step time, and
    ``whole`` jobs with whole-GPU rows only."""
    rng = random.Random(seed)
    rows = []
    for i in range(shares):
        st, steps = rng.uniform(0.8, 1.2), rng.randint(80, 120)
        rows += [row(f"s{i}", 1, st, steps), row(f"s{i}", 0.25, 1.5 * st, steps)]
    for i in range(whole):
        rows += [row(f"w{i}", 1, 1.0, 100), row(f"w{i}", 2, 0.6, 100)]
    return rows


def sharing(result) -> int:
    """How many segments of the run shared a device with another at some instant."""
    segs = [(r.task, s, {(n, d) for n, ds in s.placement.devices for d, _ in ds})
            for r in result.tasks for s in r.segments if s.placement.is_share]
    out = set()
    for i, (t, a, da) in enumerate(segs):
        for u, b, db in segs[i + 1 :]:
            if a.start_s < b.end_s and b.start_s < a.end_s and da & db:
                out |= {t, u}
    return len(out)


# ----------------------------------------------------------------------------- the device ledger
def test_occupancy_packs_shares_and_keeps_whole_devices_free():
    occ = Occupancy({"n": 2})
    quarter = Placement("single", 0.25, ("n",), devices={"n": [(0, 0.25)]})
    for _ in range(4):
        got = occ.fit(quarter)
        assert got is not None and got.device_map() == {"n": ((0, 0.25),)}
        occ.take(got)
    # Device 0 is full: a fifth quarter planned on it goes to the other device, and no whole GPU is left.
    fifth = occ.fit(quarter)
    assert fifth.device_map() == {"n": ((1, 0.25),)}
    occ.take(fifth)
    assert occ.free_gpus() == {"n": 0}
    assert occ.fit(Placement("ddp", 1, ("n",))) is None
    assert occ.fit(Placement("ddp", 1, ("n",), devices={"n": [(1, 1.0)]})) is None
    # Anonymous whole GPUs (a plan without devices) keep a device for themselves.
    occ2 = Occupancy({"n": 2}, [Placement("ddp", 1, ("n",))])
    half = Placement("single", 0.5, ("n",), devices={"n": [(0, 0.5)]})
    occ2.take(occ2.fit(half))
    assert occ2.fit(Placement("ddp", 1, ("n",))) is None
    assert occ2.fit(half).device_map() == {"n": ((0, 0.5),)}
    with pytest.raises(SaturnError, match="names no device"):
        occ2.take(Placement("single", 0.5, ("n",)))
    with pytest.raises(SaturnError, match="device 0 of node 'n' would hold more than one GPU"):
        Occupancy({"n": 1}, [Placement("ddp", 1, ("n",), devices={"n": [(0, 1.0)]})]).take(half)
    with pytest.raises(SaturnError, match="device 2 is not on node 'n', which has 2 GPUs"):
        Occupancy({"n": 2}).take(Placement("single", 0.5, ("n",), devices={"n": [(2, 0.5)]}))


def test_dispatch_launches_shares_where_they_fit_and_keeps_the_node_order():
    q = [PlannedTask(f"q{i}", Placement("single", 0.5, ("n",), devices={"n": [(0, 0.5)]}), float(i), 10.0)
         for i in range(3)]
    q.append(PlannedTask("w", Placement("ddp", 1, ("n",), devices={"n": [(1, 1.0)]}), 5.0, 15.0))
    out = dispatch(q, Occupancy({"n": 2}), now_s=0.0)
    # q0, q1 share device 0; q2 would need device 1, so w (planned after it on the node) waits too.
    assert [(p.task, p.placement.device_map()["n"]) for p in out] == [
        ("q0", ((0, 0.5),)), ("q1", ((0, 0.5),)), ("q2", ((1, 0.5),))
    ]


def test_placement_and_segment_round_trip_devices_and_type():
    p = Placement("single", 0.25, ("n",), "A100", {"n": [(3, 0.25)]})
    seg = Segment(p, 1.0, end_s=2.0)
    back = Segment.from_dict(seg.to_dict())
    assert back == seg and back.placement.gpus == 0.25 and back.placement.config_key == ("single", 0.25, 1, "A100")
    assert Segment.from_dict(Segment(Placement("ddp", 2, ("n",)), 0.0).to_dict()).to_dict() == {
        "strategy": "ddp", "gpus": 2, "nodes": ["n"], "start_s": 0.0, "end_s": None, "first_step_s": None,
        "steps_start": 0, "steps_end": None, "status": "running", "attempt": 0, "reason": "",
    }


# ----------------------------------------------------------------------------- the controller
def test_controller_keeps_running_shares_on_their_devices_through_a_replan():
    rows = [row(f"s{i}", 0.25, 1.0, 10 + 3 * i) for i in range(6)] + [row("w", 1, 1.0, 30)]
    ctl = Controller(ProfileTable.from_rows(rows), ClusterSpec.uniform(1, 2), "saturn-replan",
                     solver_time_limit_s=0.5, deterministic=True)
    launched = {a.task: a.placement for a in ctl.start(0.0)}
    assert len(launched) >= 5 and all(p.devices is not None for p in launched.values())
    occ = Occupancy({"node-0": 2})
    for p in launched.values():
        occ.take(p)  # raises if the launches over-fill a device
    # A task finishes far before its planned end: the re-plan must plan around the devices the others hold.
    first = sorted(launched)[0]
    ctl.handle(TaskFinished(time_s=2.0, task=first))
    assert len(ctl.replans) == 2
    running = {t: ctl.state(t).placement for t in ctl.tasks if ctl.state(t).state.value == "running"}
    for t, p in running.items():
        if t in launched:
            assert p == launched[t]  # kept where it runs, on its devices ...
            assert ctl.plan.assignment(t).devices == p.device_map()  # ... and the new plan says so
    check_devices(ctl.plan, ClusterSpec.uniform(1, 2))


def test_the_packer_keeps_running_tasks_on_the_devices_they_hold():
    from ray_saturn.context import PlanningContext, RunningTask
    from ray_saturn.solver import build_problem, solve
    from ray_saturn.solver.packing import pack_schedule

    rows = [row("r", 0.25, 1.0, 50), row("q", 0.25, 1.0, 10), row("w", 1, 1.0, 10)]
    profile = ProfileTable.from_rows(rows)
    cluster = ClusterSpec.uniform(1, 2)
    ctx = PlanningContext(running=(RunningTask("r", "single", 0.25, ("node-0",), devices={"node-0": [(1, 0.25)]}),))
    problem = build_problem(profile, cluster, ctx)
    s = pack_schedule(problem, [0, 0, 0], [0, 1, 2])
    assert s.devices[0] == {0: ((1, 0.25),)} and s.start[0] == 0.0
    assert s.devices[2] == {0: ((0, 1.0),)} and s.start[2] == 0.0  # the whole GPU takes the free device
    for policy in ("saturn", "fifo-min-gpus", "optimus-greedy", "random"):
        plan = solve(profile, cluster, policy, context=ctx, time_limit_s=1)
        assert plan.assignment("r").devices == {"node-0": ((1, 0.25),)}, policy
    with pytest.raises(Exception, match=r"holds devices \[2\] on node 'node-0', which has devices 0..1"):
        build_problem(profile, cluster, PlanningContext(
            running=(RunningTask("r", "single", 0.25, ("node-0",), devices={"node-0": [(2, 0.25)]}),)))
    full = PlanningContext(running=(
        RunningTask("r", "single", 0.25, ("node-0",), devices={"node-0": [(0, 0.25)]}),
        RunningTask("w", "ddp", 1, ("node-0",), devices={"node-0": [(0, 1.0)]}),
    ))
    with pytest.raises(Exception, match="no longer fits the devices"):
        pack_schedule(build_problem(profile, cluster, full), [0, 0, 0], [0, 1, 2])


def test_a_whole_node_replan_keeps_running_tasks_on_what_they_use():
    # A re-plan with a whole GPU running (its devices unnamed) beside a share on device 1: fifo-whole-node
    # (and saturn, which it seeds) asked the running whole GPU for the whole node, which the share holds.
    from ray_saturn.context import PlanningContext, RunningTask
    from ray_saturn.solver import build_problem, solve
    from ray_saturn.solver.packing import pack_schedule

    rows = [row("b", 1, 1.0, 800), row("c", 0.25, 1.0, 10), row("d", 1, 1.0, 10)]
    profile = ProfileTable.from_rows(rows)
    cluster = ClusterSpec.uniform(1, 2)
    ctx = PlanningContext(running=(
        RunningTask("b", "ddp", 1, ("node-0",), restart_s=30.0),
        RunningTask("c", "single", 0.25, ("node-0",), restart_s=30.0, devices={"node-0": [(1, 0.25)]}),
    ))
    problem = build_problem(profile, cluster, ctx)
    choice = problem.choose(lambda t, o: o.duration_s)
    s = pack_schedule(problem, choice, [0, 1, 2], strict=True, whole_node=True)
    assert s.start[:2] == [0.0, 0.0]
    assert s.devices[0] == {0: ((0, 1.0),)} and s.devices[1] == {0: ((1, 0.25),)}
    assert s.start[2] == 800.0  # the queued task waits for the whole node
    for policy in ("fifo-whole-node", "saturn"):
        plan = solve(profile, cluster, policy, context=ctx, time_limit_s=1)  # validated inside solve
        assert plan.assignment("b").start_s == 0.0 and plan.assignment("c").devices == {"node-0": ((1, 0.25),)}


def test_running_tasks_without_named_devices_fill_what_is_left_widest_first():
    # Device 0 holds 1/8, device 1 holds 1/2 (named). Placed in task order, a (1/4) went on device 1 and
    # c (1/2) found no room; widest first, b fills device 1, then c, a and e fill device 0.
    from ray_saturn.context import PlanningContext, RunningTask
    from ray_saturn.solver import build_problem
    from ray_saturn.solver.packing import pack_schedule

    shares = {"x": 0.125, "y": 0.5, "a": 0.25, "b": 0.5, "c": 0.5, "e": 0.125}
    profile = ProfileTable.from_rows([row(t, g, 1.0, 10) for t, g in shares.items()])
    named = {"x": 0, "y": 1}
    ctx = PlanningContext(running=tuple(
        RunningTask(t, "single", g, ("node-0",), devices={"node-0": [(named[t], g)]} if t in named else None)
        for t, g in shares.items()
    ))
    problem = build_problem(profile, ClusterSpec.uniform(1, 2), ctx)
    choice = [problem.pinned_option(t) for t in range(problem.num_tasks)]
    for whole_node in (False, True):
        s = pack_schedule(problem, choice, range(problem.num_tasks), whole_node=whole_node)
        assert s.start == [0.0] * 6
        on = {problem.tasks[t]: next(iter(ds.values()))[0][0] for t, ds in enumerate(s.devices)}
        load = [sum(shares[t] for t, d in on.items() if d == i) for i in (0, 1)]
        assert on["x"] == 0 and on["y"] == 1 and load == [1.0, 1.0], on


def test_cli_replan_with_shares_noise_and_arrivals(capsys, tmp_path):
    # The fuzzer's case: b (a whole GPU) runs beside shares when c arrives; a re-plan refused b's devices.
    import json

    from ray_saturn.cli import main

    (tmp_path / "p.csv").write_text(
        "task,strategy,gpus,step_time_s,steps\na,single,1/2,1,1\nb,ddp,1,1,1000\nc,single,1/4,1,10\n"
    )
    (tmp_path / "arrivals.csv").write_text("task,arrival_s\na,0\nb,10\nc,100\n")
    code = main(["simulate", str(tmp_path / "p.csv"), "--nodes", "1", "--gpus-per-node", "2", "--json",
                 "--deterministic", "--policies", "saturn-replan", "--arrivals", str(tmp_path / "arrivals.csv"),
                 "--objective", "makespan", "--noise", "0.2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    res = json.loads(out)["policies"]["saturn-replan"]
    assert res["replans"] >= 1 and res["makespan_s"] >= json.loads(out)["lower_bound_s"] - 1e-6


@pytest.mark.parametrize("policy", ["saturn-static", "saturn-replan", "fifo-whole-node"])
def test_simulated_share_sweep_passes_the_device_check_and_beats_whole_gpus(policy):
    cluster = ClusterSpec.uniform(2, 4)
    rows = share_sweep()
    cfg = SimConfig(noise=0.15, seed=1, solver_time_limit_s=0.1, deterministic=True)
    shared = simulate(ProfileTable.from_rows(rows), cluster, policy, cfg)
    whole = simulate(ProfileTable.from_rows([r for r in rows if r["gpus"] >= 1]), cluster, policy, cfg)
    plan = realised_plan(shared.tasks)
    check_devices(plan, cluster)  # simulate checked it too
    assert all(r.state == "finished" for r in shared.tasks)
    if policy == "fifo-whole-node":
        return  # a task holds whole nodes: nothing shares a device
    assert sharing(shared) >= 8, policy
    if policy == "saturn-replan":
        assert shared.replans >= 5  # drift re-plans happened with shares running
    # 16 quarters at 1.5 x fill four devices at once: well below the whole-GPU plan and run.
    assert shared.planned_makespan_s <= 0.8 * whole.planned_makespan_s
    assert shared.makespan_s <= 0.8 * whole.makespan_s, (shared.makespan_s, whole.makespan_s)


def test_two_type_cluster_runs_each_job_only_on_types_it_has_rows_for():
    cluster = ClusterSpec(tuple(NodeSpec(f"f{i}", 2, gpu_type="fast") for i in range(2))
                          + tuple(NodeSpec(f"s{i}", 2, gpu_type="slow") for i in range(2)))
    rng = random.Random(3)
    rows = []
    for i in range(12):
        st, steps = rng.uniform(0.8, 1.2), rng.randint(60, 120)
        rows.append(row(f"j{i}", 1, st, steps, gpu_type="fast"))
        if i % 3:  # two jobs in three also run on the slow type, at 2.5 x
            rows.append(row(f"j{i}", 1, 2.5 * st, steps, gpu_type="slow"))
        if i % 4 == 0:
            rows.append(row(f"j{i}", 0.5, 1.6 * st, steps, gpu_type="slow"))
    profile = ProfileTable.from_rows(rows)
    types = {n.name: n.gpu_type for n in cluster.nodes}
    for policy in ("saturn-replan", "fifo-min-gpus"):
        r = simulate(profile, cluster, policy, SimConfig(noise=0.2, seed=2, solver_time_limit_s=0.3,
                                                          deterministic=True))
        check_devices(realised_plan(r.tasks), cluster)
        for rec in r.tasks:
            measured = {c.gpu_type for c in profile.configs(rec.task)}
            assert rec.segments and rec.state == "finished"
            for seg in rec.segments:
                assert seg.placement.gpu_type in measured
                assert all(types[n] == seg.placement.gpu_type for n in seg.placement.nodes), (policy, rec.task)
        # Jobs with only a fast row ran on fast nodes.
        assert all(types[n] == "fast" for i in (3, 6, 9) for s in r.tasks[i].segments for n in s.nodes)


def test_simulator_refuses_a_launch_that_over_fills_a_device():
    from ray_saturn.control import Launch
    from ray_saturn.sim import simulator

    profile = ProfileTable.from_rows([row("a", 0.5, 1.0), row("b", 0.5, 1.0), row("c", 0.5, 1.0)])
    world = simulator._World(profile, ClusterSpec.uniform(1, 1), simulate.__globals__["get_replan_policy"](
        "saturn-static"), SimConfig(), simulator.true_step_times(profile, noise=0.0, seed=0))
    half = Placement("single", 0.5, ("node-0",), devices={"node-0": [(0, 0.5)]})
    world.execute([Launch("a", half, 0, 0.0, 0.0), Launch("b", half, 0, 0.0, 0.0)], 0.0)
    with pytest.raises(SimulationError, match="device 0 of node node-0 holds more than one GPU"):
        world.execute([Launch("c", half, 0, 0.0, 0.0)], 0.0)
    typed = Placement("single", 0.5, ("node-0",), "A100", {"node-0": [(0, 0.5)]})
    with pytest.raises(SimulationError, match="runs its A100 row on node node-0, of type None"):
        world.execute([Launch("c", typed, 0, 0.0, 0.0)], 0.0)


# ----------------------------------------------------------------------------- the runtime's ledger
def test_runtime_ledger_books_shares_on_devices_and_types_on_their_nodes():
    from ray_saturn.runtime.ledger import GpuLedger, LedgerError

    cluster = ClusterSpec((NodeSpec("a", 2, gpu_type="fast"), NodeSpec("b", 1, gpu_type="slow")))
    ledger = GpuLedger(cluster)
    d0 = {"a": [(0, 0.5)]}
    ledger.reserve("h0", ("a",), 0.5, devices=d0)
    assert ledger.fits(("a",), 0.5, devices=d0) and ledger.free("a") == 1 and ledger.used("a") == 1
    ledger.reserve("h1", ("a",), 0.5, devices=d0)
    assert not ledger.fits(("a",), 0.5, devices=d0)
    with pytest.raises(LedgerError, match="device 0 of node 'a' would hold more than one GPU"):
        ledger.reserve("h2", ("a",), 0.5, devices=d0)
    with pytest.raises(LedgerError, match=r"holds one device of one node; give one node and its device"):
        ledger.reserve("h3", ("a",), 0.5)
    with pytest.raises(LedgerError, match="give a whole number >= 1 or a share 1/k"):
        ledger.reserve("h4", ("a",), 0.3, devices={"a": [(1, 0.3)]})
    with pytest.raises(LedgerError, match="runs a row measured on fast, but node 'b' is of type slow"):
        ledger.reserve("t", ("b",), 1, gpu_type="fast")
    assert not ledger.fits(("b",), 1, gpu_type="fast") and ledger.fits(("a",), 1, gpu_type="fast")
    ledger.reserve("w", ("a",), 1, gpu_type="fast")  # a whole GPU without devices takes device 1
    assert ledger.free("a") == 0 and not ledger.fits(("a",), 0.5, devices={"a": [(1, 0.5)]})
    ledger.release("h0")
    assert not ledger.fits(("a",), 1) and ledger.fits(("a",), 0.5, devices=d0)
    ledger.release("h1")
    assert ledger.fits(("a",), 1)
    assert [n.gpu_type for n in ledger.cluster().nodes] == ["fast", "slow"]


def test_trainer_placement_gives_a_share_one_worker_with_its_fraction():
    from ray_saturn.runtime.pg_manager import TrainerPlacement

    cfg = TrainerPlacement("t", 1, ({"ray.io/node-id": "x"},), "STRICT_PACK", gpus_per_worker=0.25).scaling_config()
    assert cfg.num_workers == 1 and cfg.resources_per_worker == {"GPU": 0.25} and cfg.use_gpu
    whole = TrainerPlacement("t", 2, ({"ray.io/node-id": "x"},) * 2, "STRICT_PACK").scaling_config()
    assert whole.resources_per_worker == {"GPU": 1}


def test_driver_runs_shares_and_typed_rows_through_the_ledger(tmp_path):
    """The runtime's driver (fake launcher, bare ledger): shares share devices, typed rows run on
    their type's nodes, the realised segments pass the per-device check."""
    from ray_saturn.runtime.driver import Driver, DriverConfig
    from ray_saturn.runtime.fake import FakeLauncher, LedgerManager
    from ray_saturn.runtime.storage import RunStorage

    cluster = ClusterSpec((NodeSpec("f", 1, gpu_type="fast"), NodeSpec("s", 2, gpu_type="slow")))
    rows = [row(f"q{i}", 0.25, 1.0, 40, gpu_type="slow") for i in range(6)]
    rows += [row("w", 1, 1.0, 60, gpu_type="fast"), row("w", 1, 3.0, 60, gpu_type="slow")]
    launcher = FakeLauncher()
    mgr = LedgerManager(cluster)
    cfg = DriverConfig(solver_time_limit_s=1.0, checkpoint_interval_s=10.0, poll_wall_s=2.0, restart_s=5.0,
                       node_check_wall_s=0.0, policy="saturn-static")
    result = Driver(ProfileTable.from_rows(rows), mgr, launcher, RunStorage(tmp_path), cfg).run(max_steps=10_000)
    assert result.state == "finished"
    assert mgr.ledger.reservations() == []
    segs = {t: r.segments for t, r in result.tasks.items()}
    assert all(s.placement.nodes == ("s",) and s.placement.is_share for i in range(6) for s in segs[f"q{i}"])
    assert segs["w"][0].placement.nodes == ("f",) and segs["w"][0].placement.gpu_type == "fast"
    from ray_saturn.plan import Assignment, Plan

    plan = Plan("realised", 1.0, 0.0, 0.0, "feasible", [
        Assignment(t, s.strategy, s.gpus, s.nodes, s.start_s, s.end_s, devices=s.placement.device_map(),
                   gpu_type=s.placement.gpu_type)
        for t, ss in segs.items() for s in ss
    ])
    check_devices(plan, cluster)
    quarters = [s for i in range(6) for s in segs[f"q{i}"]]
    assert max(sum(a.start_s <= s.start_s < a.end_s for a in quarters) for s in quarters) >= 4  # four at once


def test_moves_of_running_shares_keep_every_device_within_one_gpu():
    """Cheap restarts: periodic re-plans move running tasks (shares among them) many times; every
    realised instant still passes the per-device check (simulate checks it, and so does this test)."""
    cluster = ClusterSpec.uniform(2, 4)
    cfg = SimConfig(noise=0.3, seed=3, solver_time_limit_s=0.1, deterministic=True, restart_s=1.0)
    r = simulate(ProfileTable.from_rows(share_sweep(seed=2, shares=12)), cluster, "saturn-periodic", cfg)
    assert r.moves >= 5 and all(rec.state == "finished" for rec in r.tasks)
    moved = [rec for rec in r.tasks if len(rec.segments) > 1]
    assert any(s.placement.is_share for rec in moved for s in rec.segments)
    check_devices(realised_plan(r.tasks), cluster)
    for rec in r.tasks:  # every step ran once
        assert sum(s.steps_end - s.steps_start for s in rec.segments) == rec.segments[-1].steps_end
