"""Planning at scale: how planning time grows with tasks and GPUs, and the 1000-task targets.

Profiles come from the Pollux traces (``release/pollux.py``), all tasks
arriving at 0. For every (tasks, nodes x 8 GPUs) point it measures, on this
machine, in one process:

- ``setup_s``: building the problem arrays and the lower bound (allotment LP);
- ``first_s``: time from the start of ``solve`` to the first valid plan
  (``on_plan``), and that plan's makespan / lower bound;
- ``to_1.15_s``: time to the first plan within 1.15 x the lower bound;
- ``final``: makespan / lower bound after the time limit;
- ``pop``: the POP-style decomposition (``ray_saturn.solver.decompose``)
  given the same time limit: its makespan / lower bound and time;
- ``sim_wall_s`` (with ``--targets``): wall time of the simulator replaying
  the 1000 tasks with 20% noise under ``saturn-replan`` (re-plans at least 10%
  of the first makespan apart, a rolling window of 128 queued tasks, 0.5 s
  solver limit).

Usage:
    python release/scale_benchmark.py                       # growth table + plot
    python release/scale_benchmark.py --targets             # 1000 tasks / 1024 GPUs targets
    python release/scale_benchmark.py --plot release/scale.png
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from pollux import build_profile  # noqa: E402

from ray_saturn import ClusterSpec, validate_plan  # noqa: E402
from ray_saturn.solver import build_problem, lower_bound, solve_problem  # noqa: E402
from ray_saturn.solver.decompose import pop_schedule  # noqa: E402
from ray_saturn.solver.policies.saturn import SaturnPolicy  # noqa: E402

GPUS_PER_NODE = 8


def measure(tasks: int, nodes: int, time_limit_s: float, *, pop: bool = True, seed: int = 0) -> dict:
    profile, _ = build_profile(tasks, nodes, GPUS_PER_NODE)
    cluster = ClusterSpec.uniform(nodes, GPUS_PER_NODE)
    t0 = time.perf_counter()
    problem = build_problem(profile, cluster)
    bound = lower_bound(problem)
    setup = time.perf_counter() - t0
    firsts: list[tuple[float, float]] = []
    t1 = time.perf_counter()
    plan = solve_problem(
        problem,
        "saturn",
        time_limit_s=time_limit_s,
        seed=seed,
        bound=bound,
        on_plan=lambda p: firsts.append((time.perf_counter() - t1, p.makespan_s)),
    )
    total = time.perf_counter() - t1
    validate_plan(plan, profile, cluster)
    row = {
        "tasks": tasks,
        "gpus": nodes * GPUS_PER_NODE,
        "nodes": nodes,
        "setup_s": round(setup, 2),
        "first_s": round(setup + firsts[0][0], 2),
        "first_ratio": round(firsts[0][1] / bound.value, 4),
        "to_1.15_s": next((round(setup + t, 2) for t, m in firsts if m <= 1.15 * bound.value), None),
        "final_s": round(setup + total, 2),
        "final_ratio": round(plan.makespan_s / bound.value, 4),
        "bound": bound.binding,
    }
    if pop:
        t2 = time.perf_counter()
        res = pop_schedule(problem, bound, SaturnPolicy().solve_part, time_limit_s=time_limit_s, seed=seed)
        if res is not None:
            p2 = problem.to_plan(res.schedule, policy="pop", lower_bound_s=bound.value, solve_time_s=0.0)
            validate_plan(p2, profile, cluster)
            row.update(
                pop_s=round(time.perf_counter() - t2, 2),
                pop_ratio=round(res.schedule.makespan / bound.value, 4),
                pop_parts=res.parts,
            )
    return row


def simulate_time(tasks: int, nodes: int, time_limit_s: float) -> dict:
    from ray_saturn.sim import SimConfig, simulate

    profile, _ = build_profile(tasks, nodes, GPUS_PER_NODE)
    cluster = ClusterSpec.uniform(nodes, GPUS_PER_NODE)
    cfg = SimConfig(
        noise=0.2, seed=0, solver_time_limit_s=time_limit_s, min_replan_gap_fraction=0.1, max_replan_tasks=128
    )
    t0 = time.perf_counter()
    r = simulate(profile, cluster, "saturn-replan", cfg)
    return {
        "sim_wall_s": round(time.perf_counter() - t0, 1),
        "sim_replans": r.replans,
        "sim_moves": r.moves,
        "sim_solver_s": round(r.solver_time_s, 1),
        "sim_makespan_s": round(r.makespan_s),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", action="store_true", help="the 1000 tasks / 1024 GPUs targets (60 s limit)")
    ap.add_argument("--time-limit", type=float, default=10.0, help="solver time limit per point (10)")
    ap.add_argument("--gpus", default="64,256,1024,4096")
    ap.add_argument("--tasks", default="100,1000")
    ap.add_argument("--no-pop", action="store_true")
    ap.add_argument("--plot", metavar="FILE.png")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()
    rows = []
    if args.targets:
        row = measure(1000, 128, 60.0, pop=not args.no_pop)
        row.update(simulate_time(1000, 128, 0.5))
        rows.append(row)
    else:
        for g in (int(x) for x in args.gpus.split(",")):
            for n in (int(x) for x in args.tasks.split(",")):
                rows.append(measure(n, max(1, g // GPUS_PER_NODE), args.time_limit, pop=not args.no_pop))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    cols = list(rows[0])
    for r in rows:
        cols += [c for c in r if c not in cols]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        for n in sorted({r["tasks"] for r in rows}):
            rs = sorted((r for r in rows if r["tasks"] == n), key=lambda r: r["gpus"])
            ax[0].plot([r["gpus"] for r in rs], [r["first_s"] for r in rs], "o-", label=f"{n} tasks: first plan")
            ax[0].plot([r["gpus"] for r in rs], [r["setup_s"] for r in rs], "x--", label=f"{n} tasks: problem + bound")
            ax[1].plot([r["gpus"] for r in rs], [r["final_ratio"] for r in rs], "o-", label=f"{n} tasks: saturn")
            if "pop_ratio" in rs[0]:
                ax[1].plot(
                    [r["gpus"] for r in rs if "pop_ratio" in r],
                    [r["pop_ratio"] for r in rs if "pop_ratio" in r],
                    "s:",
                    label=f"{n} tasks: POP",
                )
        for a in ax:
            a.set_xscale("log", base=2)
            a.set_xlabel("GPUs (8 per node)")
            a.legend(fontsize=7)
        ax[0].set_yscale("log")
        ax[0].set_ylabel("seconds (2 cores)")
        ax[0].set_title("time to the first valid plan")
        ax[1].set_ylabel("makespan / lower bound")
        ax[1].set_title(f"plan quality after {args.time_limit:.0f} s")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"wrote {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
