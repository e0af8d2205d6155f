"""The simulator: plans valid, realised runs consistent, events handled, seeded and deterministic."""

from __future__ import annotations

import json
import logging
import os
import re
from collections import defaultdict

import pytest
from helpers import moldable_profile

from ray_saturn import ClusterSpec, ProfileTable, SaturnError, validate_plan
from ray_saturn.sim import (
    NodeFailure,
    SimConfig,
    compare,
    oracle_lower_bound,
    parse_arrivals,
    parse_failures,
    random_failures,
    simulate,
    true_step_times,
)

POLICIES = [
    "saturn-static",
    "saturn-replan",
    "saturn-periodic",
    "fifo-whole-node",
    "fifo-min-gpus",
    "fifo-fastest",
    "optimus-greedy",
    "random",
]


def check_realised(result, profile: ProfileTable, cluster: ClusterSpec, arrivals=None, failures=()):
    """Independent check of what really ran: capacity per node, arrivals, node downtime, completion."""
    caps = {n.name: n.gpus for n in cluster.nodes}
    events = defaultdict(list)
    down = {f.node: (f.at_s, f.back_s if f.back_s is not None else float("inf")) for f in failures}
    for rec in result.tasks:
        assert rec.state == "finished", rec.task
        assert rec.segments, rec.task
        prev_end = -1.0
        for seg in rec.segments:
            assert seg.end_s is not None and seg.end_s >= seg.start_s
            assert seg.start_s >= prev_end - 1e-6, f"{rec.task} runs twice at once"
            prev_end = seg.end_s
            assert seg.start_s >= (arrivals or {}).get(rec.task, 0.0) - 1e-6, f"{rec.task} before arrival"
            profile.get(rec.task, seg.strategy, seg.gpus, len(seg.nodes))
            per = seg.gpus // len(seg.nodes)
            for n in seg.nodes:
                if n in down:
                    a, b = down[n]
                    assert seg.end_s <= a + 1e-6 or seg.start_s >= b - 1e-6, f"{rec.task} on {n} while down"
                events[n] += [(seg.start_s, 1, per), (seg.end_s, 0, -per)]
        assert rec.finish_s == pytest.approx(rec.segments[-1].end_s)
    for n, evs in events.items():
        used = 0
        for _, _, q in sorted(evs):
            used += q
            assert used <= caps[n], f"node {n} over capacity"
    assert result.makespan_s == pytest.approx(max(r.finish_s for r in result.tasks))
    assert 0 < result.utilisation <= 1 + 1e-9


@pytest.mark.parametrize("seed", [0, 1])
def test_every_plan_of_every_policy_is_valid_and_the_run_is_consistent(seed):
    profile, cluster = moldable_profile(12, 2, 4, seed=seed)
    cfg = SimConfig(noise=0.3, seed=seed, restart_s=20.0, solver_time_limit_s=0.1, keep_plans=True)
    results = compare(profile, cluster, POLICIES, cfg)
    assert list(results) == POLICIES
    lb = oracle_lower_bound(profile, cluster, cfg)
    for name, r in results.items():
        assert r.plans, name
        for plan, inp in r.plans:
            validate_plan(plan, inp.profile, inp.cluster, inp.context)
        check_realised(r, profile, cluster)
        assert r.makespan_s >= lb * (1 - 1e-9), name
        assert set(r.to_dict()) >= {"makespan_s", "mean_completion_s", "utilisation", "moves", "solver_time_s"}
    assert results["saturn-static"].moves == 0 and results["saturn-static"].replans == 1
    assert results["saturn-replan"].replans > 1


def test_noise_draws_are_seeded_and_policy_independent():
    profile, _ = moldable_profile(6, 1, 4, seed=3)
    a = true_step_times(profile, noise=0.2, seed=7)
    assert a == true_step_times(profile, noise=0.2, seed=7)
    assert a != true_step_times(profile, noise=0.2, seed=8)
    exact = true_step_times(profile, noise=0.0, seed=7)
    assert all(exact[c.key] == c.step_time_s for c in profile if c.feasible)
    ratios = [a[k] / exact[k] for k in a]
    assert min(ratios) < 1 < max(ratios)


def test_same_seed_same_run():
    profile, cluster = moldable_profile(10, 2, 4, seed=5)
    cfg = SimConfig(
        noise=0.2,
        seed=3,
        solver_time_limit_s=0.1,
        deterministic=True,
        arrivals=parse_arrivals("poisson:20", profile, seed=3),
    )
    for policy in ("saturn-replan", "fifo-whole-node"):
        r1, r2 = simulate(profile, cluster, policy, cfg), simulate(profile, cluster, policy, cfg)
        assert r1.to_dict() | {"solver_time_s": 0} == r2.to_dict() | {"solver_time_s": 0}, policy
        assert [t.segments for t in r1.tasks] == [t.segments for t in r2.tasks], policy


def test_arrivals_are_respected_and_planned_online():
    profile, cluster = moldable_profile(10, 2, 4, seed=2)
    arrivals = parse_arrivals("poisson:6", profile, seed=1)
    assert arrivals[profile.tasks[0]] == 0.0 and max(arrivals.values()) > 0
    cfg = SimConfig(noise=0.2, arrivals=arrivals, solver_time_limit_s=0.3, keep_plans=True)
    for policy in ("saturn-static", "saturn-replan", "fifo-whole-node"):
        r = simulate(profile, cluster, policy, cfg)
        check_realised(r, profile, cluster, arrivals)
        for _plan, inp in r.plans:
            # Online: a plan only ever holds tasks that had arrived when it was made.
            assert all(arrivals[t] <= inp.now_s + 1e-9 for t in inp.tasks)
        assert r.mean_completion_s > 0


def test_node_failure_and_recovery():
    profile, cluster = moldable_profile(10, 3, 4, seed=4)
    failures = [NodeFailure("node-1", 500.0, 3000.0), NodeFailure("node-2", 800.0)]
    cfg = SimConfig(noise=0.1, failures=failures, checkpoint_interval_s=100.0, solver_time_limit_s=0.3, keep_plans=True)
    for policy in ("saturn-static", "saturn-replan", "fifo-min-gpus"):
        r = simulate(profile, cluster, policy, cfg)
        check_realised(r, profile, cluster, failures=failures)
        lost = [e for e in r.log if e.get("kind") == "node_lost"]
        assert [e["node"] for e in lost] == ["node-1", "node-2"]
        assert any(e.get("kind") == "node_added" for e in r.log)
        after = [inp for _, inp in r.plans if inp.now_s >= 800.0]
        assert after and all("node-2" not in inp.cluster.names for inp in after)
        assert r.utilisation <= 1


def test_failure_specs_and_bad_inputs():
    cluster = ClusterSpec.uniform(4, 2)
    assert parse_failures("node-1@10:20,node-2@5", cluster) == [
        NodeFailure("node-1", 10.0, 20.0),
        NodeFailure("node-2", 5.0),
    ]
    with pytest.raises(SaturnError, match="NODE@AT"):
        parse_failures("node-1", cluster)
    with pytest.raises(SaturnError, match="not in the cluster"):
        parse_failures("node-9@1", cluster)
    with pytest.raises(SaturnError, match="not after"):
        NodeFailure("node-1", 10.0, 5.0)
    fs = random_failures(cluster, 2, horizon_s=1000.0, recovery_s=100.0, seed=1)
    assert len({f.node for f in fs}) == 2 and all(f.back_s == f.at_s + 100.0 for f in fs)
    with pytest.raises(SaturnError, match="node failures"):
        random_failures(cluster, 4, horizon_s=1.0, recovery_s=None, seed=0)
    with pytest.raises(SaturnError, match="noise"):
        SimConfig(noise=-0.1)
    profile, _ = moldable_profile(2, 1, 2)
    with pytest.raises(SaturnError, match="poisson"):
        parse_arrivals("poisson:-1", profile, seed=0)
    with pytest.raises(SaturnError, match="arrival_s column"):
        parse_arrivals("profile", profile, seed=0)


def test_arrivals_trace_file(tmp_path):
    profile, _cluster = moldable_profile(3, 1, 2)
    f = tmp_path / "arr.csv"
    f.write_text("task,arrival_s\nt0,0\nt1,100\nt2,250.5\n")
    assert parse_arrivals(str(f), profile, seed=0) == {"t0": 0.0, "t1": 100.0, "t2": 250.5}
    f.write_text("task,arrival_s\nt0,0\n")
    with pytest.raises(SaturnError, match="no arrival time"):
        parse_arrivals(str(f), profile, seed=0)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (b"task,arrival_s\nt0,0\nt1,abc\n", "arrival_s of task 't1' is 'abc'"),
        (b"task,arrival_s\nt0,0\nt1\n", "line 3: 1 field"),
        (b"task,arrival_s\nt0,0\nt1,\n", "arrival_s of task 't1' is empty"),
        (b"task,arrival_s\nt0,-1\nt1,0\n", "'-1'; give a finite number from 0"),
        (b"task,arrival_s\nt0,nan\nt1,0\n", "'nan'"),
        (b"task,arrival_s\nt0,inf\nt1,0\n", "'inf'"),
        (b"task,arrival_s\nt0,1e308\nt1,0\n", "'1e308'; give a finite number from 0 to 1e\\+12"),
        (b"task,arrival_s\nt0,0\n\xc4\xff,1\n", "cannot read the arrivals trace"),
        (b"task,arrival_s\nt0,0\nt1,1\nzzz,5\n", "'zzz' are not in the profile"),
        (b"task,arrival_s\nt0,0\nt1,1\nt1,2\n", "'t1' is listed twice"),
        (b"task,arrival_s\nt0,0\nt1,1,99\n", "line 3: 3 field"),
    ],
)
def test_arrivals_trace_bad_values_are_one_line_errors(tmp_path, text, match):
    profile, _ = moldable_profile(2, 1, 2)
    f = tmp_path / "arr.csv"
    f.write_bytes(text)
    with pytest.raises(SaturnError, match=match) as err:
        parse_arrivals(str(f), profile, seed=0)
    assert "\n" not in str(err.value)


def test_arrivals_trace_with_a_bom(tmp_path):
    profile, _ = moldable_profile(2, 1, 2)
    f = tmp_path / "arr.csv"
    f.write_bytes(b"\xef\xbb\xbftask,arrival_s\nt0,0\nt1,10\n")
    assert parse_arrivals(str(f), profile, seed=0) == {"t0": 0.0, "t1": 10.0}


@pytest.mark.parametrize(
    ("cells", "match"),
    [
        (["abc", "3"], "arrival_s of task 't0' is 'abc'"),
        (["", "3"], "no arrival time for task\\(s\\) t0"),
        (["-5", "3"], "arrival_s of task 't0' is -5"),
        (["inf", "3"], "arrival_s of task 't0' is inf"),
    ],
)
def test_arrivals_profile_column_bad_values(tmp_path, cells, match):
    f = tmp_path / "p.csv"
    f.write_text("task,strategy,gpus,step_time_s,steps,arrival_s\n"
                 + "".join(f"t{i},ddp,1,1.0,10,{c}\n" for i, c in enumerate(cells)))
    with pytest.raises(SaturnError, match=match):
        parse_arrivals("profile", ProfileTable.read(f), seed=0)


def test_arrivals_profile_column_one_time_per_task(tmp_path):
    f = tmp_path / "p.csv"
    f.write_text("task,strategy,gpus,step_time_s,steps,arrival_s\nt0,ddp,1,1.0,10,5\nt0,ddp,2,0.6,10,5\n"
                 "t1,ddp,1,1.0,10,\nt1,ddp,2,0.6,10,7\n")
    assert parse_arrivals("profile", ProfileTable.read(f), seed=0) == {"t0": 5.0, "t1": 7.0}
    f.write_text("task,strategy,gpus,step_time_s,steps,arrival_s\nt0,ddp,1,1.0,10,1\nt0,ddp,2,0.6,10,50\n")
    with pytest.raises(SaturnError, match="'t0' has two arrival times \\(1, 50\\)"):
        parse_arrivals("profile", ProfileTable.read(f), seed=0)


@pytest.mark.parametrize(("plot", "match"), [
    ("sim.xyz", "matplotlib cannot write .xyz files; end the name in one of .*png"),
    ("/proc/sim.png", "cannot write there"),
])
def test_cli_simulate_checks_the_plot_path_before_simulating(tmp_path, capsys, monkeypatch, plot, match):
    import ray_saturn.cli.simulate as cli_simulate
    from ray_saturn.cli import main

    profile, _ = moldable_profile(2, 1, 2, seed=1)
    profile.write(tmp_path / "p.csv")
    monkeypatch.setattr(cli_simulate, "compare", lambda *a, **k: pytest.fail("simulated before the check"))
    target = plot if plot.startswith("/") else str(tmp_path / plot)
    rc = main(["simulate", str(tmp_path / "p.csv"), "--nodes", "1", "--gpus-per-node", "2", "--plot", target])
    out, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and re.search(match, err), err
    assert not out and not os.path.exists(target)


def test_cli_simulate_prints_the_results_before_a_plot_that_fails(tmp_path, capsys, monkeypatch):
    from matplotlib.figure import Figure

    from ray_saturn.cli import main

    def full_disk(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    profile, _ = moldable_profile(2, 1, 2, seed=1)
    profile.write(tmp_path / "p.csv")
    rc = main(["simulate", str(tmp_path / "p.csv"), "--nodes", "1", "--gpus-per-node", "2", "--policies",
               "fifo-fastest", "--solver-time-limit", "0.1", "--json", "--plot", str(tmp_path / "sim.png")])
    out, err = capsys.readouterr()
    assert "fifo-fastest" in json.loads(out)["policies"]
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "cannot write the chart" in err, err


def test_cli_simulate_json_plot_and_errors(tmp_path, capsys):
    from ray_saturn.cli import main

    profile, _ = moldable_profile(8, 2, 2, seed=1)
    path = tmp_path / "p.csv"
    profile.write(path)
    png = tmp_path / "sim.png"
    rc = main(
        [
            "simulate",
            str(path),
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--noise",
            "0.2",
            "--seed",
            "1",
            "--policies",
            "saturn-static,saturn-replan,fifo-whole-node",
            "--solver-time-limit",
            "0.3",
            "--json",
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"saturn-static", "saturn-replan", "fifo-whole-node"}
    for v in out["policies"].values():
        assert {"makespan_s", "mean_completion_s", "utilisation", "moves", "solver_time_s"} <= set(v)
        assert v["makespan_s"] >= out["lower_bound_s"]
    assert png.stat().st_size > 10_000
    rc = main(["simulate", str(path), "--nodes", "2", "--gpus-per-node", "2", "--policies", "nope"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown policy" in err and len(err.strip().splitlines()) == 1
    rc = main(["simulate", str(path), "--nodes", "2", "--gpus-per-node", "2", "--noise", "-1"])
    assert rc == 2


def test_a_policy_named_twice_is_refused_before_simulating(tmp_path, capsys, monkeypatch):
    import ray_saturn.cli.simulate as cli_simulate
    from ray_saturn.cli import main
    from ray_saturn.control.replan import StaticReplan

    profile, _ = moldable_profile(2, 1, 2, seed=1)
    profile.write(tmp_path / "p.csv")
    monkeypatch.setattr(cli_simulate, "compare", lambda *a, **k: pytest.fail("simulated a policy named twice"))
    rc = main(["simulate", str(tmp_path / "p.csv"), "--nodes", "1", "--gpus-per-node", "2", "--policies",
               "fifo-fastest, saturn-static,fifo-fastest"])
    out, err = capsys.readouterr()
    assert rc == 2 and not out and err.count("\n") == 1, err
    assert "--policies names fifo-fastest more than once; name each policy once" in err
    # The library too: results are keyed by name, so one of the two runs would be lost.
    with pytest.raises(SaturnError, match="policy fifo-fastest given more than once"):
        compare(profile, ClusterSpec.uniform(1, 2), ["fifo-fastest", StaticReplan("fifo-fastest")])


def _one_gpu_tasks(*steps: int) -> ProfileTable:
    return ProfileTable.from_rows([{"task": f"t{i}", "strategy": "single", "gpus": 1, "step_time_s": 1.0,
                                    "steps": s} for i, s in enumerate(steps)])


def test_periodic_replans_scale_with_the_longest_plan_when_tasks_arrive():
    """The periodic interval is a fraction of the longest plan so far: a first plan for a 1-step task
    used to set a 0.1 s interval for the 1000 s task arriving after it (the event guard tripped)."""
    cfg = SimConfig(noise=0.0, arrivals={"t0": 0.0, "t1": 1.0}, deterministic=True)
    r = simulate(_one_gpu_tasks(1, 1000), ClusterSpec.uniform(1, 1), "saturn-periodic", cfg)
    assert r.makespan_s == pytest.approx(1001.0) and r.replans < 30


def test_periodic_replans_with_a_gap_longer_than_their_interval_end():
    """A gap (20% of the makespan) longer than the periodic interval (10%) defers each tick to the gap's
    end; the tick no longer wakes the run at the same instant until the event guard trips."""
    cfg = SimConfig(noise=0.0, min_replan_gap_fraction=0.2, deterministic=True)
    r = simulate(_one_gpu_tasks(300, 200, 100), ClusterSpec.uniform(1, 2), "saturn-periodic", cfg)
    assert all(t.finish_s is not None for t in r.tasks) and r.replans <= 8


@pytest.mark.parametrize("policy", ["saturn-static", "saturn-replan", "saturn-periodic", "fifo-fastest"])
def test_a_task_waits_while_every_node_is_down_and_runs_when_one_comes_back(policy):
    cfg = SimConfig(noise=0.0, failures=(NodeFailure("node-0", 10.0, 20.0),), deterministic=True)
    r = simulate(_one_gpu_tasks(100), ClusterSpec.uniform(1, 1), policy, cfg)
    (t,) = r.tasks
    assert t.finish_s is not None and t.finish_s >= 110.0
    assert [s.status for s in t.segments] == ["interrupted", "finished"] and t.segments[1].start_s == 20.0
    assert any(e.get("kind") == "waiting" and e["reason"] == "no node is alive" for e in r.log)


def test_a_task_too_big_for_the_nodes_left_waits_for_its_node():
    # A 2-node task on 2 one-GPU nodes: while node-0 is down it fits nowhere; it waits, then runs.
    prof = ProfileTable.from_rows([{"task": "a", "strategy": "fsdp", "gpus": 2, "nodes": 2, "step_time_s": 1.0,
                                    "steps": 100}])
    cfg = SimConfig(noise=0.0, failures=(NodeFailure("node-0", 10.0, 20.0),), deterministic=True)
    r = simulate(prof, ClusterSpec.uniform(2, 1), "saturn-replan", cfg)
    assert r.tasks[0].finish_s is not None and r.tasks[0].segments[-1].start_s == 20.0
    assert any(e.get("kind") == "waiting" and e["tasks"] == ["a"] for e in r.log)


def test_a_node_that_never_comes_back_ends_the_run_with_a_hint():
    cfg = SimConfig(noise=0.0, failures=(NodeFailure("node-0", 10.0),), deterministic=True)
    with pytest.raises(SaturnError, match="never came back: give the failures a recovery time"):
        simulate(_one_gpu_tasks(100), ClusterSpec.uniform(1, 1), "saturn-replan", cfg)


@pytest.mark.parametrize("spec, message", [
    ("node-0@10,node-0@20", "node 'node-0' fails at 20 while it is down \\(from 10 for good\\)"),
    ("node-0@10:50,node-0@20:60", "node 'node-0' fails at 20 while it is down \\(from 10 until 50\\)"),
    ("node-0@-5", "node failure of 'node-0' at -5.0; give a time >= 0"),
    ("node-0@10:5", "comes back at 5.0, not after its failure at 10.0"),
    ("node-0", "write NODE@AT or NODE@AT:BACK"),
    ("node-0@1_0", "write NODE@AT or NODE@AT:BACK"),
])
def test_failure_specs_that_cannot_happen_are_refused_when_parsed(spec, message):
    with pytest.raises(SaturnError, match=message):
        parse_failures(spec, ClusterSpec.uniform(2, 1))


def test_a_node_may_fail_again_after_it_came_back_and_a_name_may_hold_an_at():
    fs = parse_failures("node-0@10:20,node-0@30", ClusterSpec.uniform(1, 1))
    assert [(f.at_s, f.back_s) for f in fs] == [(10.0, 20.0), (30.0, None)]
    cluster = ClusterSpec.from_dict({"nodes": [{"name": "gpu@1", "gpus": 1}]})
    assert parse_failures("gpu@1@10:20", cluster)[0].node == "gpu@1"
    cluster = ClusterSpec.from_dict({"nodes": [{"name": "rack1,gpu0", "gpus": 1}, {"name": "b", "gpus": 1}]})
    fs = parse_failures("rack1,gpu0@10:20, b@5", cluster)  # a comma in a node name is not a separator
    assert [(f.node, f.at_s, f.back_s) for f in fs] == [("rack1,gpu0", 10.0, 20.0), ("b", 5.0, None)]
    with pytest.raises(SaturnError, match="fails at 20 while it is down"):
        SimConfig(failures=(NodeFailure("n", 10.0), NodeFailure("n", 20.0)))


def test_cli_recovery_without_random_failures_is_refused(tmp_path, capsys):
    from ray_saturn.cli import main

    p = tmp_path / "p.csv"
    _one_gpu_tasks(10).write(p)
    assert main(["simulate", str(p), "--nodes", "1", "--gpus-per-node", "1", "--recovery", "30"]) == 2
    assert "--recovery S applies to --random-failures K only" in capsys.readouterr().err


def test_cli_simulate_keeps_the_controllers_simulated_clock_warnings_for_verbose(tmp_path, capsys, caplog):
    """A failed simulate printed the controller's WARNING lines (t=20 s: no node is alive) before its error."""
    from ray_saturn.cli import main

    p = tmp_path / "p.csv"
    _one_gpu_tasks(100).write(p)
    args = ["simulate", str(p), "--nodes", "2", "--gpus-per-node", "1", "--failures", "node-0@10,node-1@20"]
    assert main(args) == 2
    assert "never came back" in capsys.readouterr().err
    assert not [r for r in caplog.records if r.name.startswith("ray_saturn.control")]
    assert main(["-v", *args]) == 2
    assert any("no node is alive" in r.getMessage() for r in caplog.records)
    assert logging.getLogger("ray_saturn.control").level == logging.NOTSET  # put back after the command


def test_the_planned_makespan_is_the_first_plan_that_knew_every_task():
    cfg = SimConfig(noise=0.0, arrivals={"t0": 0.0, "t1": 500.0}, deterministic=True)
    r = simulate(_one_gpu_tasks(100, 1000), ClusterSpec.uniform(1, 1), "saturn-replan", cfg)
    assert r.planned_makespan_s == pytest.approx(1500.0) and r.makespan_s == pytest.approx(1500.0)
    batch = simulate(_one_gpu_tasks(100, 1000), ClusterSpec.uniform(1, 1), "saturn-replan", SimConfig(noise=0.0))
    assert batch.planned_makespan_s == pytest.approx(1100.0)


@pytest.mark.parametrize("policy", ["saturn-periodic", "saturn-replan"])
def test_a_task_that_fits_no_node_of_the_cluster_is_refused_not_waited_for(policy):
    """Waiting is for tasks too big for the nodes alive while some are down; one that fits no node the
    cluster ever had is the solver's one-line error (it waited for a node that never failed, and
    saturn-periodic re-planned until the event guard tripped)."""
    prof = ProfileTable.from_rows([
        {"task": "big", "strategy": "ddp", "gpus": 4, "nodes": 2, "step_time_s": 0.5, "steps": 100},
        {"task": "small", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 100},
    ])
    with pytest.raises(SaturnError, match="task 'big' fits nowhere on this cluster"):
        simulate(prof, ClusterSpec.uniform(1, 8), policy, SimConfig(objective="online", deterministic=True))


def test_periodic_replans_stop_ticking_while_every_queued_task_waits_for_a_node():
    # "big" fits only on node a, which fails for good: the run ends with the hint (it ticked forever).
    prof = ProfileTable.from_rows([
        {"task": "big", "strategy": "ddp", "gpus": 8, "step_time_s": 1.0, "steps": 1000},
        {"task": "small", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 5000},
    ])
    cluster = ClusterSpec.from_dict({"nodes": [{"name": "a", "gpus": 8}, {"name": "b", "gpus": 2}]})
    cfg = SimConfig(noise=0.0, arrivals={"big": 100.0, "small": 0.0}, failures=(NodeFailure("a", 50.0),),
                    deterministic=True)
    with pytest.raises(SaturnError, match="task\\(s\\) big unfinished; they waited for nodes that failed"):
        simulate(prof, cluster, "saturn-periodic", cfg)


@pytest.mark.parametrize("scale,unit,label", [(0.01, "s", "seconds"), (1.0, "min", "minutes"), (100.0, "h", "hours")])
def test_plot_axis_unit_follows_the_run_length_and_titles_count_in_words(tmp_path, monkeypatch, scale, unit, label):
    """A 100 s run is drawn in seconds, not as '0.03 h'; '1 plan', not '1 plans'."""
    from matplotlib.figure import Figure

    from ray_saturn.sim.plot import plot_results, time_unit

    assert time_unit(119) == (1.0, "s") and time_unit(120) == (60.0, "min") and time_unit(7200) == (3600.0, "h")
    profile = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": scale, "steps": 3000},
                                      {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": scale, "steps": 2000}])
    cluster = ClusterSpec.uniform(1, 2)
    results = compare(profile, cluster, ["saturn-static"], SimConfig(noise=0.0))
    seen = {}

    def keep(self, *a, **k):
        seen["xlabel"] = self.axes[-1].get_xlabel()
        seen["titles"] = [ax.get_title() for ax in self.axes]
        seen["legend"] = [t.get_text() for t in self.axes[0].get_legend().get_texts()]

    monkeypatch.setattr(Figure, "savefig", keep)
    plot_results(results, tmp_path / "p.png", cluster=cluster)
    r = results["saturn-static"]
    assert seen["xlabel"] == label
    assert f"makespan {r.makespan_s / time_unit(r.makespan_s)[0]:.2f} {unit}" in seen["titles"][1]
    assert seen["titles"][1].endswith(f"{r.moves} move{'' if r.moves == 1 else 's'}, 1 plan"), seen["titles"]
    assert seen["legend"][0].endswith(f" {unit})")
