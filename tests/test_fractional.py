"""Fractional-GPU shares and GPU types: profile rows, cluster types, plan devices and the validator."""

from __future__ import annotations

import pytest

from ray_saturn import Assignment, ClusterSpec, Plan, PlanError, ProfileError, ProfileTable, SpecError, validate_plan
from ray_saturn.spec import NodeSpec, ray_node_gpu_type


def row(task="a", gpus=1, step=1.0, steps=10, **kw):
    strategy = "single" if isinstance(gpus, str) or gpus < 1 else "ddp"
    return {"task": task, "strategy": strategy, "gpus": gpus, "step_time_s": step, "steps": steps, **kw}


# ----------------------------------------------------------------------------- profile rows
@pytest.mark.parametrize(
    "gpus, want", [(0.5, 0.5), (0.25, 0.25), (0.125, 0.125), ("1/4", 0.25), ("1/8", 0.125), (2, 2), (2.0, 2)]
)
def test_share_and_whole_gpus_parse(gpus, want):
    t = ProfileTable.from_rows([row(gpus=1), row(gpus=gpus, strategy="x")])
    c = t.configs("a")[1]
    assert c.gpus == want and type(c.gpus) is type(want)
    assert c.is_share == (want < 1)
    assert c.copies == (round(1 / want) if want < 1 else 1)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"gpus": 0.3}, "gpus is 0.3; give a whole number >= 1, or a share of one device: 1/2, 1/4 or 1/8"),
        ({"gpus": "1/3"}, "gpus is '1/3'; give a whole number"),
        ({"gpus": 0}, "gpus is 0; give a whole number from 1"),
        ({"gpus": -0.25}, "gpus is -0.25; give a whole number from 1"),
        ({"gpus": 1.5}, "gpus is 1.5; give a whole number"),
        ({"gpus": 0.25, "nodes": 2}, "a share runs on one node: set nodes to 1"),
        ({"gpu_type": "a/b"}, "gpu_type is 'a/b'; use letters"),
        ({"device_mem_gb": -1}, "device_mem_gb is -1.0; it must be a finite number of GB > 0"),
    ],
)
def test_bad_values_are_one_line_errors(bad, message):
    with pytest.raises(ProfileError, match="profile row 1: ") as exc:
        ProfileTable.from_rows([{**row(), **bad}])
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_old_tables_keep_their_meaning_and_schema():
    t = ProfileTable.from_rows([row(gpus=1), row(gpus=2)])
    assert str(t.to_arrow().schema.field("gpus").type) == "int64"
    assert "gpu_type" not in t.to_arrow().column_names
    assert not t.has_shares and t.gpu_types == set()
    assert [c.gpu_type for c in t] == [None, None]


def test_k_copies_must_fit_the_device():
    t = ProfileTable.from_rows(
        [
            row(gpus=1, peak_mem_gb=30, device_mem_gb=80),
            row(gpus=0.5, strategy="s2", peak_mem_gb=30, device_mem_gb=80),  # 2 x 30 <= 80
            row(gpus=0.25, strategy="s4", peak_mem_gb=30, device_mem_gb=80),  # 4 x 30 > 80
        ]
    )
    whole, half, quarter = t.configs("a")
    assert whole.feasible and half.feasible
    assert not quarter.feasible and quarter.reason == "4 copies x 30 GB peak memory > 80 GB device memory"


def test_shares_and_types_round_trip_csv_and_parquet(tmp_path):
    t = ProfileTable.from_rows(
        [
            row(gpus=1, gpu_type="A100"),
            row(gpus=1, gpu_type="T4", step=3.0),
            row(gpus="1/4", step=1.5),
        ]
    )
    assert str(t.to_arrow().schema.field("gpus").type) == "double"
    for name in ("p.csv", "p.parquet"):
        back = ProfileTable.read(t.write(tmp_path / name))
        assert list(back) == list(t)
    assert t.get("a", "ddp", 1, 1, "T4").step_time_s == 3.0
    assert t.get("a", "single", 0.25).gpus == 0.25
    with pytest.raises(ProfileError, match="measured on V100"):
        t.get("a", "ddp", 1, 1, "V100")
    assert t.has_shares and t.gpu_types == {"A100", "T4"}


def test_same_configuration_on_two_types_is_not_a_duplicate_but_twice_on_one_is():
    ProfileTable.from_rows([row(gpu_type="A100"), row(gpu_type="T4")])
    with pytest.raises(ProfileError, match=r"duplicate of row 1 .* on T4\)"):
        ProfileTable.from_rows([row(gpu_type="T4"), row(gpu_type="T4")])


# ----------------------------------------------------------------------------- cluster types
def test_cluster_json_carries_gpu_type(tmp_path):
    spec = ClusterSpec.from_dict({"nodes": [{"name": "a", "gpus": 4, "gpu_type": "A100"}, {"name": "b", "gpus": 4}]})
    assert spec.gpu_types == ("A100", None)
    assert spec.to_dict()["nodes"][0]["gpu_type"] == "A100" and "gpu_type" not in spec.to_dict()["nodes"][1]
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(SpecError, match="node 'a' gpu_type is 'A 100'"):
        ClusterSpec.from_dict({"nodes": [{"name": "a", "gpus": 4, "gpu_type": "A 100"}]})


def test_ray_node_type_from_label_or_accelerator_resource():
    assert ray_node_gpu_type({"Resources": {"GPU": 4.0}}) is None
    assert ray_node_gpu_type({"Resources": {"GPU": 4.0, "accelerator_type:T4": 1.0}}) == "T4"
    info = {"Resources": {"accelerator_type:T4": 1.0}, "Labels": {"ray.io/accelerator-type": "L4"}}
    assert ray_node_gpu_type(info) == "L4"


# ----------------------------------------------------------------------------- plan devices
PROFILE = ProfileTable.from_rows(
    [row(task=f"s{i}", gpus=0.25, step=2.0) for i in range(5)]
    + [row(task="w", gpus=2, step=1.0), row(task="w", gpus=1, step=2.0)]
)
CLUSTER = ClusterSpec.uniform(1, 2)


def shares(n, device=0, start=0.0):
    return [
        Assignment(f"s{i}", "single", 0.25, ("node-0",), start, start + 20.0, devices={"node-0": [(device, 0.25)]})
        for i in range(n)
    ]


def plan(assignments):
    end = max(a.end_s for a in assignments)
    return Plan("hand", end, 0.0, 0.0, "feasible", assignments)


def test_packed_plan_validates_and_round_trips_devices():
    a = [
        *shares(4),
        Assignment("s4", "single", 0.25, ("node-0",), 0.0, 20.0, devices={"node-0": [(1, 0.25)]}),
        Assignment("w", "ddp", 1, ("node-0",), 20.0, 40.0, devices={"node-0": [(0, 1.0)]}),
    ]
    p = plan(a)
    validate_plan(p, PROFILE, CLUSTER)
    d = p.to_dict()
    assert d["assignments"][0]["devices"] == {"node-0": [[0, 0.25]]}
    assert Plan.from_json(p.to_json()) == p


@pytest.mark.parametrize(
    "extra, message",
    [
        # A fifth quarter on device 0 at once: 1.25 of one GPU.
        (
            Assignment("s4", "single", 0.25, ("node-0",), 10.0, 30.0, devices={"node-0": [(0, 0.25)]}),
            "device 0 of node 'node-0' holds 1.25 of one GPU at 10.000 s",
        ),
        (Assignment("s4", "single", 0.25, ("node-0",), 0.0, 20.0), "names no device"),
        (
            Assignment("s4", "single", 0.25, ("node-0",), 0.0, 20.0, devices={"node-0": [(2, 0.25)]}),
            "device 2 is not on node 'node-0', which has devices 0..1",
        ),
        (
            Assignment("s4", "single", 0.25, ("node-0",), 0.0, 20.0, devices={"node-0": [(1, 0.5)]}),
            "holds one device at share 0.25",
        ),
        (
            Assignment("s4", "single", 0.25, ("node-0",), 0.0, 20.0, devices={"node-1": [(1, 0.25)]}),
            "devices name nodes ['node-1'] but the task runs on ['node-0']",
        ),
    ],
)
def test_device_over_full_or_malformed_is_caught(extra, message):
    a = [*shares(4), extra, Assignment("w", "ddp", 1, ("node-0",), 40.0, 60.0)]
    with pytest.raises(PlanError) as exc:
        validate_plan(plan(a), PROFILE, CLUSTER)
    assert message in str(exc.value)


def test_whole_gpus_without_devices_count_against_busy_devices():
    # Quarters on both devices leave no whole device for w, although only 1.75 GPUs are in use.
    a = [shares(5)[i] for i in (0, 1)] + [
        Assignment("s2", "single", 0.25, ("node-0",), 0.0, 20.0, devices={"node-0": [(1, 0.25)]}),
        *[
            Assignment(f"s{i}", "single", 0.25, ("node-0",), 100.0, 120.0, devices={"node-0": [(0, 0.25)]})
            for i in (3, 4)
        ],
        Assignment("w", "ddp", 1, ("node-0",), 5.0, 25.0),
    ]
    with pytest.raises(PlanError, match=r"node 'node-0' has 2 device.s. in use and 1 more whole GPU"):
        validate_plan(plan(a), PROFILE, CLUSTER)
    a[-1] = Assignment("w", "ddp", 1, ("node-0",), 5.0, 25.0, devices={"node-0": [(1, 1.0)]})
    with pytest.raises(PlanError, match=r"device 1 of node 'node-0' holds 1.25"):
        validate_plan(plan(a), PROFILE, CLUSTER)
    a[-1] = Assignment("w", "ddp", 1, ("node-0",), 20.0, 40.0, devices={"node-0": [(1, 1.0)]})
    validate_plan(plan(a), PROFILE, CLUSTER)
    a[-1] = Assignment("w", "ddp", 1, ("node-0",), 15.0, 35.0, devices={"node-0": [(0, 1.0)]})
    with pytest.raises(PlanError, match=r"device 0 of node 'node-0' holds 1\.5"):
        validate_plan(plan(a), PROFILE, CLUSTER)


def test_node_sum_of_shares_over_its_gpus_is_caught():
    cluster = ClusterSpec.uniform(1, 1)
    a = [
        *shares(4),
        Assignment("s4", "single", 0.25, ("node-0",), 0.0, 20.0, devices={"node-0": [(0, 0.25)]}),
        Assignment("w", "ddp", 1, ("node-0",), 20.0, 40.0),
    ]
    with pytest.raises(PlanError, match=r"holds 1.25 GPUs"):
        validate_plan(plan(a), PROFILE, cluster)


def test_no_job_on_a_type_it_has_no_row_for():
    profile = ProfileTable.from_rows([row(task="a", gpu_type="fast"), row(task="a", gpu_type="slow", step=3.0)])
    cluster = ClusterSpec((NodeSpec("f", 1, gpu_type="fast"), NodeSpec("s", 1, gpu_type="slow")))
    ok = plan([Assignment("a", "ddp", 1, ("s",), 0.0, 30.0, gpu_type="slow")])
    validate_plan(ok, profile, cluster)
    assert Plan.from_json(ok.to_json()) == ok
    bad = plan([Assignment("a", "ddp", 1, ("f",), 0.0, 30.0, gpu_type="slow")])
    with pytest.raises(PlanError, match=r"measured on slow on node 'f' of type fast"):
        validate_plan(bad, profile, cluster)
    untyped = plan([Assignment("a", "ddp", 1, ("f",), 0.0, 10.0)])
    with pytest.raises(PlanError, match=r"is not a profiled configuration"):
        validate_plan(untyped, profile, cluster)


# ----------------------------------------------------------------------------- solver
def mixed_problem():
    import random

    rng = random.Random(1)
    rows = []
    for i in range(12):
        steps, base = rng.randint(10, 50), rng.uniform(0.5, 2.0)
        rows.append(row(task=f"j{i}", gpus=2, step=base / 1.7, steps=steps, gpu_type="fast"))
        rows.append(row(task=f"j{i}", gpus=1, step=base, steps=steps))
        if i % 3:
            share = rng.choice([0.5, 0.25, 0.125])
            rows.append(
                row(task=f"j{i}", gpus=share, step=base * 1.6, steps=steps, gpu_type=rng.choice(["fast", "slow"]))
            )
    cluster = ClusterSpec(
        (NodeSpec("f0", 2, gpu_type="fast"), NodeSpec("f1", 2, gpu_type="fast"), NodeSpec("s0", 3, gpu_type="slow"))
    )
    return ProfileTable.from_rows(rows), cluster


def test_every_policy_packs_shares_on_devices_and_keeps_types():
    from ray_saturn.solver import policy_names, solve

    profile, cluster = mixed_problem()
    types = {n.name: n.gpu_type for n in cluster.nodes}
    for name in policy_names():
        plan = solve(profile, cluster, name, time_limit_s=1, seed=0)  # validated inside solve
        validate_plan(Plan.from_json(plan.to_json()), profile, cluster)
        for a in plan.assignments:
            assert a.devices is not None and set(a.devices) == set(a.nodes)
            if a.gpu_type is not None:
                assert all(types[n] == a.gpu_type for n in a.nodes), (name, a)
        assert plan.lower_bound_s <= plan.makespan_s


@pytest.mark.parametrize("policy", ["fifo-whole-node", "saturn", "fifo-max-gpus", "fifo-min-gpus", "optimus-greedy"])
@pytest.mark.parametrize("packs", ["type", "share"])
def test_whole_node_tasks_only_on_nodes_that_hold_their_gpus(policy, packs):
    # A GPU type or a share makes the problem pack on devices; a task on a whole node still needs its GPUs
    # there: a (8 GPUs) fits only on "big", never on "small" (6), whatever fifo-whole-node holds.
    from ray_saturn.solver import solve

    other = row(task="b", gpus=6, steps=100, gpu_type="A100") if packs == "type" else row(task="b", gpus=0.5)
    profile = ProfileTable.from_rows([row(task="a", gpus=8, steps=1), other])
    cluster = ClusterSpec((NodeSpec("small", 6, gpu_type="H100"), NodeSpec("big", 8, gpu_type="A100")))
    plan = solve(profile, cluster, policy, time_limit_s=1, seed=0)  # validated inside solve
    validate_plan(Plan.from_json(plan.to_json()), profile, cluster)
    a = next(a for a in plan.assignments if a.task == "a")
    assert a.nodes == ("big",) and set(a.devices) == {"big"} and len(a.devices["big"]) == 8


def test_whole_node_packing_holds_every_device_of_a_large_enough_node():
    from ray_saturn.solver import build_problem
    from ray_saturn.solver.packing import pack_schedule

    profile = ProfileTable.from_rows([row(task="a", gpus=4, steps=1), row(task="b", gpus=0.5, steps=5)])
    problem = build_problem(profile, ClusterSpec((NodeSpec("small", 2), NodeSpec("big", 4))))
    s = pack_schedule(problem, [0, 0], [0, 1], strict=True, whole_node=True)
    assert s.nodes == [(1,), (0,)] and s.start == [0.0, 0.0]
    assert s.devices[0] == {1: tuple((d, 1.0) for d in range(4))}


def test_exact_packing_model_finds_the_optimum():
    from ray_saturn.solver import build_problem, solve
    from ray_saturn.solver.packing_cpsat import solve_packing_cpsat

    # Five jobs on one GPU: whole 6 s, or a quarter share 10 s. Best: four quarters at once, then one whole.
    rows = [row(task=f"t{i}", gpus=1, step=0.6) for i in range(5)]
    rows += [row(task=f"t{i}", gpus=0.25, step=1.0) for i in range(5)]
    profile = ProfileTable.from_rows(rows)
    problem = build_problem(profile, ClusterSpec.uniform(1, 1))
    whole = [next(i for i, o in enumerate(opts) if o.gpus == 1) for opts in problem.options]
    result = solve_packing_cpsat(problem, whole, list(range(5)), horizon_s=30.0, time_limit_s=10.0)
    assert result.optimal and result.schedule.makespan == pytest.approx(16.0)
    plan = solve(profile, ClusterSpec.uniform(1, 1), time_limit_s=10)
    assert plan.makespan_s == pytest.approx(16.0) and plan.status == "optimal"
    assert sorted(a.gpus for a in plan.assignments) == [0.25] * 4 + [1]


def test_typed_lower_bound_counts_capacity_per_type():
    from ray_saturn.solver import build_problem, lower_bound, solve

    # One fast and one slow GPU; each job 10 s on fast, 30 s on slow. Untyped LP: 10 s; per type: 15 s; optimum 20 s.
    rows = [row(task=t, gpu_type="fast") for t in ("a", "b")] + [row(task=t, step=3.0, gpu_type="slow") for t in "ab"]
    profile = ProfileTable.from_rows(rows)
    cluster = ClusterSpec((NodeSpec("f", 1, gpu_type="fast"), NodeSpec("s", 1, gpu_type="slow")))
    bound = lower_bound(build_problem(profile, cluster))
    assert bound.value == pytest.approx(15.0, rel=1e-6)
    plan = solve(profile, cluster, time_limit_s=5)
    assert plan.makespan_s == pytest.approx(20.0) and {a.nodes for a in plan.assignments} == {("f",)}


def test_a_task_without_a_row_for_any_node_type_is_a_one_line_error():
    from ray_saturn import InfeasibleError
    from ray_saturn.solver import solve

    profile = ProfileTable.from_rows([row(task="a", gpu_type="A100")])
    cluster = ClusterSpec((NodeSpec("t", 4, gpu_type="T4"),))
    with pytest.raises(InfeasibleError, match=r"task 'a' fits nowhere .*on A100.*types T4\)$"):
        solve(profile, cluster, time_limit_s=1)


def test_unsupported_paths_refuse_shares_and_types():
    from ray_saturn.solver import solve

    profile, cluster = mixed_problem()
    with pytest.raises(SpecError, match="objective 'completion' does not yet plan shares of one GPU or GPU types"):
        solve(profile, cluster, objective="completion", time_limit_s=1)


@pytest.mark.parametrize("seed", range(12))
def test_lower_bounds_never_exceed_the_exact_packing_optimum(seed):
    import random

    from ray_saturn.solver import build_problem, lower_bound
    from ray_saturn.solver.packing_cpsat import solve_packing_cpsat
    from ray_saturn.solver.threshold_bound import threshold_area_bound

    rng = random.Random(seed)
    rows = []
    for i in range(5):
        whole = rng.randint(2, 9)
        rows.append(row(task=f"t{i}", gpus=1, step=float(whole), steps=1))
        if rng.random() < 0.5:
            rows.append(row(task=f"t{i}", gpus=2, step=float(max(1, whole * 6 // 10)), steps=1))
        share = rng.choice([0.5, 0.25])
        rows.append(row(task=f"t{i}", gpus=share, step=float(rng.randint(whole, 2 * whole)), steps=1))
    cluster = ClusterSpec.from_dict({"nodes": [{"name": "a", "gpus": 2, "gpu_type": "x"}, {"name": "b", "gpus": 1}]})
    problem = build_problem(ProfileTable.from_rows(rows), cluster)
    horizon = sum(max(o.duration_s for o in opts) for opts in problem.options)
    result = solve_packing_cpsat(problem, [0] * 5, list(range(5)), horizon_s=horizon, time_limit_s=20.0)
    assert result is not None and result.optimal
    bound = lower_bound(problem)
    assert bound.value <= result.schedule.makespan + 1e-9
    assert threshold_area_bound(problem) <= result.schedule.makespan + 1e-9


# ----------------------------------------------------------------------------- CLI
def test_cli_plans_and_simulates_shares_and_types(capsys, tmp_path):
    import json

    from ray_saturn.cli import main

    prof = tmp_path / "p.csv"
    prof.write_text(
        "task,strategy,gpus,step_time_s,steps,gpu_type\n"
        "a,ddp,1,1.0,100,fast\na,ddp,1,2.5,100,slow\n"
        "b,single,1/4,1.8,100,\nb,ddp,1,1.0,100,\n"
        + "".join(f"c{i},single,1/4,1.5,100,\nc{i},ddp,1,1.0,100,\n" for i in range(4))
    )
    cluster = tmp_path / "c.json"
    cluster.write_text(
        json.dumps(
            {"nodes": [{"name": "f", "gpus": 1, "gpu_type": "fast"}, {"name": "s", "gpus": 1, "gpu_type": "slow"}]}
        )
    )
    code = main(["plan", str(prof), "--cluster", str(cluster), "--json", "--time-limit", "5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    plan = Plan.from_dict(data)
    validate_plan(plan, ProfileTable.read(prof), ClusterSpec.from_json(cluster))
    assert all("devices" in a for a in data["assignments"])
    assert plan.assignment("a").gpu_type == "fast" and plan.assignment("a").nodes == ("f",)
    assert sum(a.gpus == 0.25 for a in plan.assignments) >= 3  # quarters share the slow node's device
    code = main(["simulate", str(prof), "--cluster", str(cluster), "--json", "--solver-time-limit", "0.5",
                 "--policies", "saturn-replan,fifo-min-gpus,fifo-whole-node", "--plot", str(tmp_path / "g.png")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["policies"]["saturn-replan"]["makespan_s"] > 0
    prof.write_text("task,strategy,gpus,step_time_s,steps\na,single,0.3,1.0,100\n")
    code = main(["plan", str(prof), "--nodes", "1", "--gpus-per-node", "1"])
    out, err = capsys.readouterr()
    assert code == 2 and "row 1: gpus is 0.3; give a whole number >= 1, or a share" in err


def test_emulate_checks_gpu_types_before_any_cluster_starts(capsys, tmp_path):
    from ray_saturn.cli import main

    prof = tmp_path / "p.csv"
    prof.write_text("task,strategy,gpus,step_time_s,steps,gpu_type\na,single,1/2,1.0,10,\na,single,1,0.8,10,A100\n"
                    "b,single,1,0.8,10,A100\n")
    args = ["emulate", str(prof), "--nodes", "2", "--gpus-per-node", "1", "--time-scale", "0.01"]
    code = main([*args, "--gpu-types", "A100"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1
    assert "1 GPU type(s) for 2 emulated node(s); give one per node, e.g. --gpu-types A100,A100" in err
    code = main([*args, "--gpu-types", "T4,T4"])  # b has rows for A100 only
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "task 'b' fits nowhere" in err and "types T4" in err


def test_untyped_whole_gpu_profiles_plan_as_before_on_a_typed_cluster():
    from ray_saturn.solver import build_problem, lower_bound, solve

    rows = [row(task=f"t{i}", gpus=g, step=4.0 / g + i, steps=10) for i in range(6) for g in (1, 2)]
    profile = ProfileTable.from_rows(rows)
    typed = ClusterSpec((NodeSpec("a", 2, gpu_type="A100"), NodeSpec("b", 2, gpu_type="T4")))
    plain = ClusterSpec((NodeSpec("a", 2), NodeSpec("b", 2)))
    assert not build_problem(profile, typed).packing
    assert lower_bound(build_problem(profile, typed)).value == lower_bound(build_problem(profile, plain)).value
    p1 = solve(profile, typed, "saturn", time_limit_s=2, seed=0)
    p2 = solve(profile, plain, "fifo-min-gpus", time_limit_s=2, seed=0)
    assert all(a.devices is None and a.gpu_type is None for a in p1.assignments + p2.assignments)
    assert "devices" not in p1.to_json()
