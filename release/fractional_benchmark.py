"""Fractional-GPU shares and GPU types, planned jointly: both targets of the issue as ratios in one run.

1. Shares. 64 small jobs on 2 x 4 GPUs, each with a whole-GPU row and a
   1/4-share row whose step time is at most 2 x the whole-GPU one. Target:
   saturn's makespan <= 0.6 x the best whole-GPU plan of the same profile
   (saturn on the rows with gpus >= 1), and <= 1.1 x the plan's lower bound.
2. Types. The same kind of jobs (rows on 1, 2 and 4 GPUs of one node) on a
   2-type cluster, 2 nodes of a fast type and 2 of a slow type, 4 GPUs each,
   with a row per type. Target: makespan <= 0.85 x the best plan that ignores
   types (one row per job, the slow type's, on the same nodes untyped).

Jobs: a hyper-parameter sweep of the Pollux traces (``release/pollux.py
--sweep``: cifar10 and ncf, the small models of the traces, at every batch size that fits one GPU;
step times and step counts *measured* on real GPUs), repeated with learning
rates until there are 64. What is *assumed*, not measured: the 1/4-share step
time (the whole-GPU one x a factor drawn uniformly from [1.3, 2.0] per job,
seeded; the issue's bound is 2.0) and the slow type's step times (the
trace's x a per-app factor, :data:`SLOW`). All figures are planned makespans
(no run), every plan checked by the independent validator (per device).
saturn runs deterministically (limits counted in work, not seconds), so the
figures depend only on the seed, not on the machine's load.

With ``--simulate``, both profiles also *run* in the simulator (the real
controller, re-planning with saturn-replan on true step times drawn with
``--noise``, the same world for the share and whole-GPU profiles, and for the
typed and type-blind ones): the realised makespans and their ratios, every
realised timeline checked per device (no device over one GPU at any
instant, no job on a type it has no row for).

Usage:
    python release/fractional_benchmark.py [--time-limit 5] [--seed 0] [--wall-clock] [--json out.json]
        [--simulate] [--noise 0.2] [--sim-time-limit 1]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pollux  # noqa: E402

from ray_saturn import ClusterSpec, ProfileTable, validate_plan  # noqa: E402
from ray_saturn.solver import deterministic_policy, get_policy, solve  # noqa: E402
from ray_saturn.spec import NodeSpec  # noqa: E402

APPS = ["cifar10", "ncf"]
JOBS = 64
#: Slow type's step time / fast type's, per app (assumed: compute-bound jobs lose more on a slower GPU).
SLOW = {"cifar10": 2.5, "ncf": 1.6}
SHARE_FACTOR = (1.3, 2.0)


def sweep_jobs(gpus_per_node: int) -> list[list[dict]]:
    """Per job, its rows (1, 2, 4 GPUs on one node), from the Pollux sweep, repeated over learning rates."""
    by_task: dict[str, list[dict]] = {}
    for r in pollux.build_sweep_rows(APPS, gpus_per_node):
        if r["feasible"]:
            by_task.setdefault(r["task"], []).append(r)
    bases = list(by_task.values())
    jobs = []
    for i in range(JOBS):
        base = bases[i % len(bases)]
        jobs.append([{**r, "task": f"{r['task']}-lr{i // len(bases)}"} for r in base])
    return jobs


def share_profiles(seed: int) -> tuple[ProfileTable, ProfileTable]:
    rng = random.Random(seed)
    rows = []
    for job in sweep_jobs(4):
        one = next(r for r in job if r["gpus"] == 1)
        keep = {k: one[k] for k in ("task", "steps", "step_time_s")}
        rows.append({**keep, "strategy": "single", "gpus": 1})
        factor = rng.uniform(*SHARE_FACTOR)
        rows.append({**keep, "strategy": "single", "gpus": 0.25, "step_time_s": one["step_time_s"] * factor})
    both = ProfileTable.from_rows(rows, source="pollux-sweep-shares")
    whole = ProfileTable.from_rows([r for r in rows if r["gpus"] >= 1], source="pollux-sweep-whole")
    return both, whole


def type_profiles() -> tuple[ProfileTable, ProfileTable]:
    typed, slow_only = [], []
    for job in sweep_jobs(4):
        for r in job:
            keep = {k: r[k] for k in ("task", "strategy", "gpus", "nodes", "steps", "step_time_s")}
            slow = {**keep, "step_time_s": r["step_time_s"] * SLOW[r["task"].split("-")[0]]}
            typed += [{**keep, "gpu_type": "fast"}, {**slow, "gpu_type": "slow"}]
            slow_only.append(slow)
    return ProfileTable.from_rows(typed, source="pollux-sweep-typed"), ProfileTable.from_rows(slow_only)


def plan(profile: ProfileTable, cluster: ClusterSpec, time_limit: float, seed: int, wall_clock: bool = False):
    t0 = time.perf_counter()
    policy = get_policy("saturn") if wall_clock else deterministic_policy("saturn")
    p = solve(profile, cluster, policy, time_limit_s=time_limit, seed=seed)
    validate_plan(p, profile, cluster)  # solve validates too; this is the benchmark's own check
    return p, time.perf_counter() - t0


def simulate_pair(profile: ProfileTable, baseline: ProfileTable, cluster: ClusterSpec, base_cluster: ClusterSpec,
                  args: argparse.Namespace) -> dict:
    """Realised makespans of ``profile`` on ``cluster`` and ``baseline`` on ``base_cluster`` (saturn-replan)."""
    from ray_saturn.devices import check_devices
    from ray_saturn.sim import SimConfig, realised_plan, simulate

    cfg = SimConfig(noise=args.noise, seed=args.seed, solver_time_limit_s=args.sim_time_limit, deterministic=True)
    out = {}
    types = {n.name: n.gpu_type for n in cluster.nodes}
    for key, prof, cl in (("run", profile, cluster), ("baseline", baseline, base_cluster)):
        t0 = time.perf_counter()
        r = simulate(prof, cl, "saturn-replan", cfg)
        check_devices(realised_plan(r.tasks), cl)  # simulate checked it too: the benchmark's own check
        for rec in r.tasks:
            for seg in rec.segments:
                assert seg.placement.gpu_type is None or all(
                    types.get(n) == seg.placement.gpu_type for n in seg.nodes
                ), (rec.task, seg)
        out[key] = {"makespan_s": r.makespan_s, "planned_makespan_s": r.planned_makespan_s, "replans": r.replans,
                    "moves": r.moves, "wall_s": time.perf_counter() - t0,
                    "segments_on_shares": sum(s.placement.is_share for rec in r.tasks for s in rec.segments)}
    out["ratio"] = out["run"]["makespan_s"] / out["baseline"]["makespan_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=5.0, help="solver time limit per plan (s of work)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wall-clock", action="store_true",
                    help="limit the solver by wall time (default: by work, so the figures depend only on the seed)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--simulate", action="store_true", help="also run both targets in the simulator (realised)")
    ap.add_argument("--noise", type=float, default=0.2, help="--simulate: spread of true step times (0.2)")
    ap.add_argument("--sim-time-limit", type=float, default=1.0, help="--simulate: solver work per re-plan (s)")
    args = ap.parse_args()

    out: dict = {}
    both, whole = share_profiles(args.seed)
    cluster = ClusterSpec.uniform(2, 4)
    p_share, t_share = plan(both, cluster, args.time_limit, args.seed, args.wall_clock)
    p_whole, t_whole = plan(whole, cluster, args.time_limit, args.seed, args.wall_clock)
    n_shared = sum(a.gpus < 1 for a in p_share.assignments)
    out["shares"] = {
        "jobs": len(both.tasks), "cluster": "2x4", "makespan_s": p_share.makespan_s,
        "lower_bound_s": p_share.lower_bound_s, "whole_gpu_makespan_s": p_whole.makespan_s,
        "vs_whole": p_share.makespan_s / p_whole.makespan_s, "vs_bound": p_share.makespan_s / p_share.lower_bound_s,
        "jobs_on_shares": n_shared, "solve_s": t_share, "whole_solve_s": t_whole,
    }
    fast = [NodeSpec(f"fast-{i}", 4, gpu_type="fast") for i in range(2)]
    slow = [NodeSpec(f"slow-{i}", 4, gpu_type="slow") for i in range(2)]
    typed_cluster = ClusterSpec(tuple(fast + slow))
    untyped_cluster = ClusterSpec(tuple(NodeSpec(n.name, n.gpus) for n in typed_cluster.nodes))
    typed, slow_only = type_profiles()
    p_typed, t_typed = plan(typed, typed_cluster, args.time_limit, args.seed, args.wall_clock)
    p_blind, t_blind = plan(slow_only, untyped_cluster, args.time_limit, args.seed, args.wall_clock)
    on_fast = sum(a.gpu_type == "fast" for a in p_typed.assignments)
    out["types"] = {
        "jobs": len(typed.tasks), "cluster": "2 fast x4 + 2 slow x4", "makespan_s": p_typed.makespan_s,
        "lower_bound_s": p_typed.lower_bound_s, "type_blind_makespan_s": p_blind.makespan_s,
        "vs_type_blind": p_typed.makespan_s / p_blind.makespan_s,
        "vs_bound": p_typed.makespan_s / p_typed.lower_bound_s, "jobs_on_fast": on_fast,
        "solve_s": t_typed, "type_blind_solve_s": t_blind,
    }
    s, ty = out["shares"], out["types"]
    s["met"] = s["vs_whole"] <= 0.6 and s["vs_bound"] <= 1.1
    ty["met"] = ty["vs_type_blind"] <= 0.85
    print("| target | jobs | cluster | makespan | baseline makespan | ratio | target ratio | vs lower bound | met |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| shares (1/4 rows) | {s['jobs']} | 2x4 | {s['makespan_s']:.0f} s | {s['whole_gpu_makespan_s']:.0f} s "
          f"(best whole-GPU plan) | {s['vs_whole']:.3f} | <= 0.6 | {s['vs_bound']:.3f} (<= 1.1) | "
          f"{'yes' if s['met'] else 'NO'} |")
    print(f"| GPU types | {ty['jobs']} | 2 fast x4 + 2 slow x4 | {ty['makespan_s']:.0f} s | "
          f"{ty['type_blind_makespan_s']:.0f} s (type-blind, slow rows) | {ty['vs_type_blind']:.3f} | <= 0.85 | "
          f"{ty['vs_bound']:.3f} | {'yes' if ty['met'] else 'NO'} |")
    print(f"\nshares: {s['jobs_on_shares']} of {s['jobs']} jobs planned on a 1/4 share; "
          f"types: {ty['jobs_on_fast']} of {ty['jobs']} jobs on the fast type; "
          f"solve times {s['solve_s']:.1f} / {s['whole_solve_s']:.1f} / {ty['solve_s']:.1f} / "
          f"{ty['type_blind_solve_s']:.1f} s (time limit {args.time_limit:g} s each)")
    if args.simulate:
        out["simulated"] = {
            "shares": simulate_pair(both, whole, cluster, cluster, args),
            "types": simulate_pair(typed, slow_only, typed_cluster, untyped_cluster, args),
        }
        print(f"\nsimulated (saturn-replan, noise {args.noise:g}, seed {args.seed}; realised timelines pass the "
              "per-device check):")
        print("| target | realised makespan | baseline realised | ratio | re-plans | moves | segments on shares |")
        print("|---|---|---|---|---|---|---|")
        for name, key in (("shares (1/4 rows)", "shares"), ("GPU types", "types")):
            x = out["simulated"][key]
            print(f"| {name} | {x['run']['makespan_s']:.0f} s | {x['baseline']['makespan_s']:.0f} s | "
                  f"{x['ratio']:.3f} | {x['run']['replans']} / {x['baseline']['replans']} | "
                  f"{x['run']['moves']} / {x['baseline']['moves']} | {x['run']['segments_on_shares']} |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
