"""Objectives other than the makespan: completion-time plans, their bounds, and online re-planning.

The plans are checked against what theory says is optimal: SPT/SRPT on one
GPU, heSRPT's fluid optimum for jobs with a concave speed-up ``k^p``, and an
exhaustive search on small random instances.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
import sys

import pytest
from helpers import brute_force_total_completion, random_instance, rows_profile

from ray_saturn import ClusterSpec, ProfileTable
from ray_saturn.context import PlanningContext
from ray_saturn.control import Controller, NodeAdded, TaskArrived, TaskFinished, Tick
from ray_saturn.control.controller import ARRIVAL_WINDOW_S
from ray_saturn.control.moves import decide_moves
from ray_saturn.control.state import Placement
from ray_saturn.errors import ProfileError, SpecError
from ray_saturn.plan import Assignment, Plan
from ray_saturn.sim import SimConfig, oracle_completion_bound, simulate
from ray_saturn.solver import build_problem, solve
from ray_saturn.solver.completion_bound import completion_lower_bound, srpt_total, wspt_mean_busy_bound
from ray_saturn.solver.objective import (
    BACKGROUND_HORIZON_S,
    BACKGROUND_WEIGHT,
    ONLINE_SLACK,
    is_background,
    objective_gain,
    parse_objective,
    solver_policy,
)
from ray_saturn.spec import NodeSpec

# ----------------------------------------------------------------- objective names


def test_parse_objective_names_the_choices():
    assert parse_objective(None) == "makespan"
    with pytest.raises(SpecError, match="makespan, completion, online"):
        parse_objective("fastest")


# ----------------------------------------------------------------- bounds


def test_srpt_total_is_the_one_machine_optimum():
    # Job a (10) at 0, b (2) at 1: SRPT preempts a for b: b ends 3, a ends 12.
    assert srpt_total([0.0, 1.0], [10.0, 2.0]) == pytest.approx(15.0)
    # Exhaustive check on small instances against every non-preemptive order (SRPT can only be better).
    rng = random.Random(3)
    for _ in range(30):
        n = rng.randint(1, 5)
        rel = [float(rng.randint(0, 6)) for _ in range(n)]
        size = [float(rng.randint(1, 6)) for _ in range(n)]
        best = math.inf
        for order in itertools.permutations(range(n)):
            now, total = 0.0, 0.0
            for t in order:
                now = max(now, rel[t]) + size[t]
                total += now
            best = min(best, total)
        assert srpt_total(rel, size) <= best + 1e-9
        # Weights all 1: the mean-busy-time bound is weaker than SRPT but valid.
        assert wspt_mean_busy_bound(rel, size, [1.0] * n) <= srpt_total(rel, size) + 1e-9


@pytest.mark.parametrize("seed", range(12))
def test_completion_bound_is_below_the_exhaustive_optimum(seed):
    profile, cluster = random_instance(seed, max_tasks=4, max_nodes=2)
    rng = random.Random(seed)
    release = {t: float(rng.randint(0, 8)) for t in profile.tasks} if seed % 2 else {}
    weights = {t: float(rng.randint(1, 3)) for t in profile.tasks} if seed % 3 == 0 else {}
    opt = brute_force_total_completion(profile, cluster, release, weights)
    problem = build_problem(profile, cluster, PlanningContext(release_s=release))
    cb = completion_lower_bound(problem, [weights.get(t, 1.0) for t in problem.tasks])
    assert cb.total <= opt * (1 + 1e-9)
    # The plan for completion is valid (the solver validates it) and never beats the optimum.
    plan = solve(profile, cluster, context=PlanningContext(release_s=release), objective="completion",
                 time_limit_s=2)
    total = sum(weights.get(a.task, 1.0) * a.end_s for a in plan.assignments)
    assert total >= opt * (1 - 1e-9)
    # On these small instances the heuristic is near the optimum.
    assert total <= 1.35 * opt + 1e-9


# ----------------------------------------------------------------- against theory


def test_one_gpu_completion_plan_is_spt():
    """One GPU, no releases: shortest processing time first is optimal (Smith 1956)."""
    rng = random.Random(0)
    specs = [(f"t{i}", [(1, 1.0)], rng.randint(5, 100)) for i in range(8)]
    profile = rows_profile(*specs)
    plan = solve(profile, ClusterSpec.uniform(1, 1), objective="completion", time_limit_s=2)
    sizes = sorted(steps for _, _, steps in specs)
    spt = sum(itertools.accumulate(sizes))
    assert sum(a.end_s for a in plan.assignments) == pytest.approx(spt)
    assert plan.completion_lower_bound_s == pytest.approx(spt / len(sizes), rel=1e-6)  # the bound is tight here
    assert plan.status == "optimal"
    # The makespan objective does not care: on this input it is free to pick any order.
    assert plan.mean_completion_s == pytest.approx(spt / len(sizes))


def _hesrpt_total(sizes: list[float], servers: int, p: float) -> float:
    """heSRPT's optimal total completion time for jobs present at 0 with speed-up s(k) = k^p on
    ``servers`` divisible servers (Berg et al. 2020): with m jobs left, ranked 1 (largest) to m,
    rank i gets the fraction (i/m)^c - ((i-1)/m)^c of the servers, c = 1/(1-p)."""
    left = sorted(sizes, reverse=True)
    now, total = 0.0, 0.0
    c = 1.0 / (1.0 - p)
    while left:
        m = len(left)
        rates = [((i / m) ** c - ((i - 1) / m) ** c) ** p * servers**p for i in range(1, m + 1)]
        dt = min(x / r for x, r in zip(left, rates, strict=True))
        now += dt
        left = [x - r * dt for x, r in zip(left, rates, strict=True)]
        done = [x for x in left if x <= 1e-9 * max(sizes)]
        total += now * len(done)
        left = [x for x in left if x > 1e-9 * max(sizes)]
    return total


@pytest.mark.parametrize("p", [0.5, 0.8])
def test_completion_plan_against_hesrpt(p):
    """Jobs with speed-up k^p on one 8-GPU node: heSRPT's fluid optimum (divisible GPUs, free
    preemption) bounds every plan from below; the completion plan stays within 25% of it, and is
    better than both fixed rules (every job on all GPUs in SRPT order; every job on one GPU)."""
    rng = random.Random(1)
    sizes = [float(rng.randint(50, 2000)) for _ in range(10)]
    specs = [(f"j{i}", [(g, 1.0 / g**p) for g in range(1, 9)], int(s)) for i, s in enumerate(sizes)]
    profile = rows_profile(*specs)
    cluster = ClusterSpec.uniform(1, 8)
    plan = solve(profile, cluster, objective="completion", time_limit_s=5)
    total = sum(a.end_s for a in plan.assignments)
    fluid = _hesrpt_total([float(int(s)) for s in sizes], 8, p)
    assert total >= fluid * (1 - 1e-6)
    assert total <= 1.25 * fluid
    ints = sorted(float(int(s)) for s in sizes)
    all_gpus_srpt = sum(itertools.accumulate(x / 8**p for x in ints))
    assert total <= all_gpus_srpt + 1e-6
    one_gpu = sum(sorted(ints)[:8]) + sum(ints[8:]) + 2 * ints[0]  # two jobs wait for the first GPUs to free
    assert total < one_gpu


# ----------------------------------------------------------------- plans and re-planning


def test_online_objective_keeps_the_makespan_near_the_best():
    profile = rows_profile(
        ("long", [(1, 10.0), (2, 5.5), (4, 3.0)], 100),
        *[(f"s{i}", [(1, 1.0), (2, 0.6), (4, 0.4)], 20 + 5 * i) for i in range(6)],
    )
    cluster = ClusterSpec.uniform(1, 4)
    mk = solve(profile, cluster, time_limit_s=2)
    comp = solve(profile, cluster, objective="completion", time_limit_s=2)
    online = solve(profile, cluster, objective="online", time_limit_s=2)
    assert online.makespan_s <= mk.makespan_s * 1.03 + 1e-6
    assert comp.mean_completion_s <= online.mean_completion_s + 1e-6
    assert online.objective == "online" and online.mean_completion_s is not None
    # Round trip through JSON keeps the completion fields; the validator re-checks them.
    again = type(online).from_json(online.to_json())
    assert again.mean_completion_s == pytest.approx(online.mean_completion_s)
    again.validate(profile, cluster)
    again.completion_lower_bound_s = again.mean_completion_s * 2
    with pytest.raises(Exception, match="completion-time lower bound"):
        again.validate(profile, cluster)


def test_objective_gain_respects_the_online_slack():

    keep = Plan("saturn", 100.0, 50.0, 0.0, "feasible",
                [Assignment("a", "ddp", 1, ("n",), 0.0, 100.0), Assignment("b", "ddp", 1, ("n",), 0.0, 90.0)])
    move = Plan("saturn", 110.0, 50.0, 0.0, "feasible",
                [Assignment("a", "ddp", 1, ("n",), 0.0, 110.0), Assignment("b", "ddp", 1, ("n",), 0.0, 10.0)])
    assert objective_gain(keep, move, "makespan", {}) == pytest.approx(-10.0)
    assert objective_gain(keep, move, "completion", {}) == pytest.approx(70.0)
    assert objective_gain(keep, move, "online", {}) == pytest.approx(-10.0)  # 10% over: not worth it
    # The other way round: a move that ends the run 10% sooner is made, though carrying on would
    # finish the other task earlier (the search ranks plans that way; the gain used to be the
    # completion difference, -70 s, so a re-plan after the arrivals kept a plan the search had beaten).
    assert objective_gain(move, keep, "online", {}) == pytest.approx(10.0)
    assert objective_gain(move, keep, "completion", {}) == pytest.approx(-70.0)
    # While jobs arrive (an arrival price) there is no makespan guard: completion and priced GPU-seconds.
    priced = objective_gain(move, keep, "online", {}, area_weight=0.5, area_share={"a": 0.0})
    assert priced == pytest.approx(-70.0 + 0.5 * (10.0 - 90.0))


def test_arrival_price_is_shared_by_the_jobs_that_would_queue_behind():
    """A task's GPU-seconds are priced by the share of expected arrivals that are larger than it (SRPT
    lets the smaller ones pass it): a job no arrival would wait for takes the fast, wide row; a job
    every arrival would wait for takes the area-efficient one."""
    profile = rows_profile(("long", [(1, 1.0), (4, 0.3)], 1000))  # 1 GPU: 1000 GPU-s; 4 GPUs: 1200
    cluster = ClusterSpec.uniform(1, 4)
    policy = solver_policy("saturn", objective="online", deterministic=True, area_weight=5.0)
    gpus = {}
    for share in (0.0, 1.0):
        plan = solve(profile, cluster, policy, context=PlanningContext(area_share={"long": share}),
                     time_limit_s=0.5, seed=0)
        gpus[share] = plan.by_task()["long"].gpus
    assert gpus == {0.0: 4, 1.0: 1}
    with pytest.raises(SpecError, match="area_share"):
        PlanningContext(area_share={"long": 1.5})


def test_background_job_fills_the_gpus_left_now_while_jobs_arrive():
    """While jobs arrive, a job almost every arrival is smaller than (share ~0) and too big for the
    cluster to clear within the horizon is a background job: it takes the widest efficient option
    that starts first, here the 2 GPUs a short job leaves free now, instead of waiting for all 4
    (which ends it sooner in a plan that sees no later arrivals, but leaves 2 GPUs idle, and the next
    arrival would push it back again). With no arrival price it is planned as before."""
    # big: 2 GPUs 10,000 s (20,000 GPU-s, > 4 GPUs x the horizon), 4 GPUs 5,200 s (efficiency 0.96),
    # 1 GPU 24,000 s (more than 4 x its fastest run: never a background row).
    profile = rows_profile(("big", [(1, 24.0), (2, 10.0), (4, 5.2)], 1000), ("short", [(2, 1.0)], 100))
    cluster = ClusterSpec.uniform(1, 4)
    assert 4 * BACKGROUND_HORIZON_S < 20_000
    ctx = PlanningContext(area_share={"big": 0.0, "short": 1.0})
    got = {}
    for weight in (0.0, 0.01):
        policy = solver_policy("saturn", objective="online", deterministic=True, area_weight=weight)
        plan = solve(profile, cluster, policy, context=ctx, time_limit_s=0.5, seed=0)
        big = plan.by_task()["big"]
        got[weight] = (big.gpus, big.start_s)
    assert got[0.0] == (4, pytest.approx(100.0))  # no arrival price: the fastest end, after "short"
    assert got[0.01] == (2, pytest.approx(0.0))  # arrivals priced: it fills the 2 GPUs free now
    # A job that the cluster clears within the horizon, or that some arrivals are larger than, is not.
    assert is_background(0.0, 20_000, 4) and not is_background(0.0, 4 * BACKGROUND_HORIZON_S, 4)
    assert not is_background(0.2, 20_000, 4) and not is_background(None, 20_000, 4)


def test_background_job_completion_counts_less_while_jobs_arrive():
    """A background job's completion time counts BACKGROUND_WEIGHT of its weight in the gain of a
    move while jobs arrive (so a short arrival may shrink it); with the makespan guard on, fully."""
    keep = Plan("saturn", 100.0, 50.0, 0.0, "feasible",
                [Assignment("a", "ddp", 1, ("n",), 0.0, 100.0), Assignment("b", "ddp", 1, ("n",), 0.0, 90.0)])
    move = Plan("saturn", 200.0, 50.0, 0.0, "feasible",
                [Assignment("a", "ddp", 1, ("n",), 0.0, 200.0), Assignment("b", "ddp", 1, ("n",), 0.0, 10.0)])
    share = {"a": 0.0, "b": 1.0}
    full = objective_gain(keep, move, "online", {}, area_weight=0.1, area_share=share)
    quiet = objective_gain(keep, move, "online", {}, area_weight=0.1, area_share=share, background={"a"})
    # ends: a 100 -> 200, b 90 -> 10; priced GPU-seconds (a's share 0): 90 -> 10
    assert full == pytest.approx(-100.0 + 80.0 + 0.1 * 80.0)
    assert quiet == pytest.approx(-100.0 * BACKGROUND_WEIGHT + 80.0 + 0.1 * 80.0)
    assert quiet > 0 > full
    assert objective_gain(keep, move, "online", {}, background={"a"}) == pytest.approx(-100.0)


def test_controller_shares_the_price_and_replans_when_it_lapses():
    """The controller gives each task the share of the jobs arrived so far that are larger than its
    remaining work; once no job has arrived for the pricing window it re-plans by itself (a wake-up),
    with the makespan guard back on, instead of following a plan priced for arrivals that stopped."""
    profile = rows_profile(("a", [(1, 1.0)], 500), ("big", [(1, 1.0)], 10_000), ("small", [(1, 1.0)], 50))
    inputs = []
    ctl = Controller(profile, ClusterSpec.uniform(1, 1), "saturn-replan", restart_s=1.0, solver_time_limit_s=0.5,
                     objective="online", deterministic=True, on_plan=lambda plan, inp: inputs.append(inp))
    ctl.start(0.0, arrived=["a"])
    assert ctl.next_wakeup_s() is None  # only the first instant's arrivals: no price, nothing lapses
    ctl.handle(TaskArrived(time_s=10.0, task="big"))
    ctl.handle(TaskArrived(time_s=20.0, task="small"))
    share = inputs[-1].context.area_share
    # arrived: 500, 10,000, 50 GPU-s; "a" has 480 left
    assert share == pytest.approx({"a": 2 / 3, "big": 0.0, "small": 2 / 3})
    assert ctl._solver_policy.options.area_weight > 0
    lapse = 20.0 + ARRIVAL_WINDOW_S
    assert ctl.next_wakeup_s() == pytest.approx(lapse)
    ctl.handle(Tick(time_s=lapse))
    assert ctl.replans[-1].time_s == pytest.approx(lapse)
    assert "arrival price lapsed" in ctl.replans[-1].reasons[0]
    assert ctl._solver_policy.options.area_weight == 0 and inputs[-1].context.area_share == {}
    assert ctl.next_wakeup_s() is None


def test_controller_shrinks_a_long_job_for_a_short_arrival():
    """SRPT with elastic GPUs: a long job holds the node; a short one arrives. Under the completion
    objective the long job is moved to fewer GPUs at once (paying its restart) and the short one
    starts; under the makespan objective the short one waits."""
    profile = rows_profile(
        ("long", [(1, 10.0), (2, 5.2), (4, 2.8)], 1000),
        ("short", [(1, 1.0), (2, 0.55), (4, 0.3)], 100),
    )
    cluster = ClusterSpec.uniform(1, 4)
    ends = {}
    for objective in ("makespan", "completion"):
        ctl = Controller(profile, cluster, "saturn-replan", restart_s=5.0, solver_time_limit_s=1,
                         objective=objective)
        first = ctl.start(0.0, arrived=["long"])
        assert [a.placement.gpus for a in first] == [4]
        actions = ctl.handle(TaskArrived(time_s=100.0, task="short"))
        kinds = [(a.kind, a.task) for a in actions]
        if objective == "completion":
            assert ("stop", "long") in kinds and ("launch", "short") in kinds
            assert ctl.moves == 1
        else:
            assert ctl.moves == 0 and ("launch", "short") not in kinds
        ends[objective] = ctl.plan.by_task()["short"].end_s + 100.0
    assert ends["completion"] < ends["makespan"]
    ctl.handle(TaskFinished(time_s=ends["completion"], task="short"))


def test_online_objective_pauses_a_long_job_for_a_short_arrival():
    """SRPT preemption: one GPU, a long job runs, a short one arrives. The job cannot shrink, so under
    ``online`` it is stopped with a checkpoint, the short one runs, and the long one restarts after it
    (paying its restart); ``makespan`` (and a controller that may not pause) lets the short one wait."""
    profile = rows_profile(("long", [(1, 1.0)], 1000), ("short", [(1, 1.0)], 50))
    cluster = ClusterSpec.uniform(1, 1)
    out = {}
    for objective in ("makespan", "online"):
        cfg = SimConfig(arrivals={"long": 0.0, "short": 100.0}, objective=objective, restart_s=5.0,
                        solver_time_limit_s=0.5, deterministic=True)
        out[objective] = r = simulate(profile, cluster, "saturn-replan", cfg)
        jct = {t.task: t.finish_s - t.arrival_s for t in r.tasks}
        if objective == "online":
            assert r.moves == 1 and jct["short"] == pytest.approx(50.0)
            long_segs = next(t for t in r.tasks if t.task == "long").segments
            assert [(s.start_s, s.end_s) for s in long_segs] == [(0.0, 100.0), (150.0, 1055.0)]
        else:
            assert r.moves == 0 and jct["short"] == pytest.approx(950.0)
    assert out["online"].mean_completion_s < out["makespan"].mean_completion_s
    # The move rule (the same for every objective): a move whose task restarts later is made when it pays.
    here = Placement("ddp", 1, ("n0",))
    later = Plan("saturn", 60.0, 40.0, 0.1, "feasible", [Assignment("a", "ddp", 1, ("n0",), 30.0, 90.0, setup_s=5.0)])
    assert decide_moves({"a": here}, later, keep_makespan_s=100.0, restart_s=5.0, gain_s=50.0)[0].move
    assert not decide_moves({"a": here}, later, keep_makespan_s=100.0, restart_s=5.0, gain_s=4.0)[0].move


def test_arrival_pricing_ends_when_arrivals_stop():
    """``online`` prices a plan's GPU-seconds by the recent arrival rate; once no job has arrived for
    the window, a re-plan is priced at 0 again (it used to keep the last price, so long jobs stayed
    narrow on an idle cluster after the arrivals ended)."""
    profile = rows_profile(*[(t, [(1, 1.0), (2, 0.6)], 100_000) for t in ("a", "b")])
    ctl = Controller(profile, ClusterSpec.uniform(1, 4), "saturn-replan", restart_s=1.0, solver_time_limit_s=0.5,
                     objective="online", deterministic=True)
    ctl.start(0.0, arrived=["a"])
    ctl.handle(TaskArrived(time_s=10.0, task="b"))
    assert ctl._solver_policy.options.area_weight > 0
    late = 10.0 + 2 * ARRIVAL_WINDOW_S  # a node joins long after the last arrival: a re-plan, no arrival
    ctl.handle(NodeAdded(time_s=late, node=NodeSpec("node-9", 2)))
    assert ctl.replans[-1].time_s == pytest.approx(late)
    assert ctl._solver_policy.options.area_weight == 0


def test_simulated_online_run_beats_makespan_objective_on_arrivals():
    rng = random.Random(5)
    specs = []
    for i in range(14):
        steps = rng.choice([50, 80, 120, 2000, 3000])
        specs.append((f"t{i}", [(1, 1.0), (2, 0.55), (4, 0.3), (8, 0.18)], steps))
    profile = rows_profile(*specs)
    cluster = ClusterSpec.uniform(2, 4)
    arrivals = {t: 40.0 * i for i, t in enumerate(profile.tasks)}
    out = {}
    for objective in ("makespan", "online"):
        cfg = SimConfig(arrivals=arrivals, objective=objective, solver_time_limit_s=0.5, deterministic=True)
        out[objective] = simulate(profile, cluster, "saturn-replan", cfg)
    bound = oracle_completion_bound(profile, cluster, SimConfig(arrivals=arrivals))
    assert bound <= out["online"].mean_completion_s
    assert out["online"].mean_completion_s < out["makespan"].mean_completion_s
    # While jobs arrive there is no makespan guard; the largest jobs, which no arrival queues behind,
    # pay no arrival price and run on wide rows: 471 s mean and 2,275 s here, against 517 s and
    # 1,964 s when every task paid the whole price, and 616 s and 2,041 s under ``makespan``.
    assert out["online"].makespan_s <= out["makespan"].makespan_s * 1.15


def test_weights_come_from_a_profile_column():
    rows = [
        {"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10, "weight": 1.0},
        {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 12, "weight": 5.0},
    ]
    profile = ProfileTable.from_rows(rows)
    plan = solve(profile, ClusterSpec.uniform(1, 1), objective="completion", time_limit_s=1)
    # Smith's rule: b (12/5) before a (10/1).
    assert plan.by_task()["b"].start_s == 0.0
    with pytest.raises(ProfileError, match=r"row 1: weight is -1\.0"):  # refused as the profile is read
        ProfileTable.from_rows([{**rows[0], "weight": -1.0}])


# ----------------------------------------------------------------- CLI


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from ray_saturn.cli import main; raise SystemExit(main())",
                           *args], capture_output=True, text=True, timeout=300)


def test_cli_plan_and_simulate_take_an_objective(tmp_path):
    profile = rows_profile(*[(f"t{i}", [(1, 1.0), (2, 0.6)], 10 * (i + 1)) for i in range(4)])
    path = tmp_path / "p.csv"
    profile.write(path)
    r = _cli("plan", str(path), "--nodes", "1", "--gpus-per-node", "2", "--objective", "completion",
             "--time-limit", "1", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["objective"] == "completion" and d["completion_lower_bound_s"] <= d["mean_completion_s"]
    trace = tmp_path / "arrivals.csv"
    trace.write_text("task,arrival_s\nt0,0\nt1,5\nt2,10\nt3,15\n")
    for arrivals, objective in (("batch", "makespan"), (str(trace), "online")):
        r = _cli("simulate", str(path), "--nodes", "1", "--gpus-per-node", "2", "--arrivals", arrivals,
                 "--policies", "saturn-replan,fifo-min-gpus", "--noise", "0", "--solver-time-limit", "0.5",
                 "--json")
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["objective"] == objective
        assert d["completion_lower_bound_s"] <= min(p["mean_completion_s"] for p in d["policies"].values())
    r = _cli("simulate", str(path), "--nodes", "1", "--gpus-per-node", "2", "--objective", "fast")
    assert r.returncode == 2 and "invalid choice" in r.stderr


@pytest.mark.parametrize("seed", [3, 6, 71, 79, 88, 100, 122])
def test_online_plan_without_arrival_price_is_within_the_slack_of_the_makespan_plan(seed):
    """With no arrival price the ``online`` guard keeps the plan within ONLINE_SLACK of the best
    makespan known. That best used to come from a 60-decoding heuristic, so on these random
    instances the online plan ended up to 12.5% later than the makespan plan; the guard now holds
    against the makespan policy's own (exact) search."""
    profile, cluster = random_instance(seed, max_tasks=14, max_nodes=4, max_options=4)
    mk = solve(profile, cluster, solver_policy("saturn", deterministic=True), time_limit_s=1.0)
    online = solve(profile, cluster, solver_policy("saturn", objective="online", deterministic=True),
                   time_limit_s=1.0)
    assert online.makespan_s <= mk.makespan_s * (1 + ONLINE_SLACK) + 1e-6


def test_completion_schedule_keeps_a_fixed_option():
    """``fixed`` gives a task its option (a large task keeps a makespan plan's GPU count while the
    others are planned for completion around it), even one that no efficiency floor would allow."""
    from ray_saturn.solver.completion import completion_schedule

    profile = rows_profile(("big", [(1, 10.0), (2, 5.5), (4, 3.0)], 100), ("s", [(1, 1.0), (2, 0.6)], 10))
    problem = build_problem(profile, ClusterSpec.uniform(1, 4), None)
    big = problem.tasks.index("big")
    four = next(j for j, o in enumerate(problem.options[big]) if o.gpus == 4)
    free = completion_schedule(problem, list(range(problem.num_tasks)), 1.0, keep_running=True)
    assert problem.options[big][free.option[big]].gpus == 1  # efficiency 1: the least-area option
    got = completion_schedule(problem, list(range(problem.num_tasks)), 1.0, keep_running=True,
                              fixed={big: four})
    assert got.option[big] == four and got.durations[big] == pytest.approx(300.0)


def _sweep_calls(monkeypatch, problem, objective, clock=None, time_limit_s=60.0):
    """The decodings of completion_search's sweep (the priority orders of _orders; the improvement's
    swapped orders are left out), as (order index, efficiency, cap, keep), and the search's result."""
    import types

    from ray_saturn.solver import completion

    weights = [1.0] * problem.num_tasks
    orders = [tuple(o) for o in completion._orders(problem, weights, critical=objective == "online")]
    calls = []
    real = completion.completion_schedule

    def counted(problem, order, e, **kw):
        if tuple(order) in orders and kw.get("fixed") is None:
            calls.append((orders.index(tuple(order)), e, kw.get("cap"), kw["keep_running"]))
        return real(problem, order, e, **kw)

    monkeypatch.setattr(completion, "completion_schedule", counted)
    if clock is not None:
        monkeypatch.setattr(completion, "time", types.SimpleNamespace(perf_counter=clock))
    found = completion.completion_search(problem, objective, weights, time_limit_s=time_limit_s)
    return calls, orders, found


def test_the_completion_sweep_stops_at_the_time_limit_after_trying_every_order(monkeypatch):
    # A 1,000-task online simulation re-planned in 2.6 s against a 2 s limit: the sweep ran to its end.
    from helpers import moldable_profile

    profile, cluster = moldable_profile(30, 4, 4, seed=3)
    problem = build_problem(profile, cluster)
    full, orders, whole = _sweep_calls(monkeypatch, problem, "online")
    assert len(orders) == 6 and len(full) > 2 * len(orders)
    # A clock that moves one second a reading: the limit of 8.5 s stops the sweep after a few decodings.
    ticks = itertools.count()
    cut, _, found = _sweep_calls(monkeypatch, problem, "online", clock=lambda: float(next(ticks)), time_limit_s=8.5)
    assert 0 < len(cut) < len(full)
    # Rule by rule across the orders: every order was tried before any order's second rule.
    assert [c[0] for c in cut[: len(orders)]] == list(range(len(orders)))
    assert len({(c[1], c[2]) for c in cut[: len(orders)]}) == 1
    assert set(cut) <= set(full)
    # The cut search's plan is a valid plan of every task (the independent validator), as the full one's.
    for res in (found, whole):
        problem.to_plan(res.schedule, policy="online", lower_bound_s=0.0, solve_time_s=0.0).validate(profile, cluster)


def test_rules_that_give_every_task_the_same_options_are_decoded_once(monkeypatch):
    # One row per task: every efficiency and cap leaves each task the same option, so one rule per order.
    profile = rows_profile(*[(f"t{i}", [(1, 1.0 + i)], 10 + i) for i in range(12)])
    problem = build_problem(profile, ClusterSpec.uniform(2, 2))
    calls, orders, _ = _sweep_calls(monkeypatch, problem, "online")
    assert len(calls) == len(orders)
    # Rows at 1 and 2 GPUs of very different efficiency: the rules differ, and more than one is decoded.
    profile = rows_profile(*[(f"t{i}", [(1, 1.0 + i), (2, 0.9 + i)], 10 + i) for i in range(12)])
    problem = build_problem(profile, ClusterSpec.uniform(2, 2))
    calls, orders, _ = _sweep_calls(monkeypatch, problem, "online")
    assert len({(c[1], c[2]) for c in calls}) > 1
