"""Solver benchmark: every policy on Pollux-derived profiles, as ratios to the lower bound.

For each (tasks, cluster) instance it prints, per policy, makespan / lower
bound and solve time; for ``saturn`` also the time to its first valid plan,
whether it proved optimality, and its makespan reduction against the
strongest baseline on that instance (the baseline with the shortest
makespan there), named. All ratios in a row come from the same run.

Usage:
    python release/solver_benchmark.py                   # the full table (about 6 minutes)
    python release/solver_benchmark.py --quick           # smaller time limits
    python release/solver_benchmark.py --tasks 64 --clusters 4x4 --time-limit 30
    python release/solver_benchmark.py --workload 3      # jobs from another Pollux workload file
    python release/solver_benchmark.py --tasks 64 --clusters 4x4 --workload 2 3 4 5 6   # held-out job mixes
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pollux

from ray_saturn import ClusterSpec
from ray_saturn.solver import build_problem, lower_bound, solve_problem

BASELINES = ("fifo-whole-node", "fifo-max-gpus", "fifo-min-gpus", "fifo-fastest", "optimus-greedy", "random")


def run_instance(n_tasks: int, nodes: int, gpn: int, time_limit: float, seed: int, workload: int = 1) -> dict:
    profile, _ = pollux.build_profile(n_tasks, nodes, gpn, workload=workload)
    cluster = ClusterSpec.uniform(nodes, gpn)
    t0 = time.perf_counter()
    problem = build_problem(profile, cluster)
    bound = lower_bound(problem)
    bound_time = time.perf_counter() - t0
    row = {"tasks": n_tasks, "cluster": f"{nodes}x{gpn}", "lb": bound.value, "binding": bound.binding,
           "bound_time": bound_time, "policies": {}}
    for name in BASELINES:
        plan = solve_problem(problem, name, bound=bound, seed=seed)
        row["policies"][name] = (plan.makespan_s, plan.solve_time_s)
    first: list[float] = []
    t0 = time.perf_counter()
    plan = solve_problem(problem, "saturn", bound=bound, time_limit_s=time_limit, seed=seed,
                         on_plan=lambda p: first.append(time.perf_counter() - t0) if not first else None)
    row["policies"]["saturn"] = (plan.makespan_s, plan.solve_time_s)
    row["saturn_first_s"] = first[0] if first else float("nan")
    row["saturn_status"] = plan.status
    row["saturn_lb"] = plan.lower_bound_s  # may be raised by CP-SAT's proven bound
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, nargs="*", default=[16, 64, 256])
    ap.add_argument("--clusters", nargs="*", default=["4x4", "16x4", "16x8"])
    ap.add_argument("--time-limit", type=float, default=None,
                    help="saturn's limit; default 30 s, 60 s for 256 tasks on 16x8")
    ap.add_argument("--quick", action="store_true", help="5 s limits (for a smoke run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workload", type=int, nargs="+", default=[1],
                    help="Pollux workload file(s) the jobs come from (1); with several, a row per file")
    args = ap.parse_args()
    wl = len(args.workload) > 1
    print(("| workload " if wl else "") + "| tasks | cluster | bound | " + " | ".join(("saturn", *BASELINES))
          + " | saturn time | first plan | strongest baseline | saturn vs it |")
    print("|---" * (8 + wl + len(BASELINES)) + "|")
    for w, n, c in ((w, n, c) for w in args.workload for n in args.tasks for c in args.clusters):
        nodes, gpn = (int(x) for x in c.split("x"))
        limit = args.time_limit or (60.0 if (n >= 256 and nodes * gpn >= 128) else 30.0)
        if args.quick:
            limit = 5.0
        row = run_instance(n, nodes, gpn, limit, args.seed, w)
        lb = row["lb"]
        ratios = [row["policies"][p][0] / lb for p in ("saturn", *BASELINES)]
        best = min(BASELINES, key=lambda p: (row["policies"][p][0], p))
        sat, ref = row["policies"]["saturn"][0], row["policies"][best][0]
        status = " (optimal)" if row["saturn_status"] == "optimal" else ""
        print((f"| {w} " if wl else "") + f"| {n} | {c} | {row['binding']} | " + " | ".join(f"{r:.3f}" for r in ratios)
              + f" | {row['policies']['saturn'][1]:.1f} s{status} | {row['saturn_first_s']:.3f} s"
              + f" | {best} | {100 * (sat / ref - 1):+.1f}% |", flush=True)


if __name__ == "__main__":
    main()
