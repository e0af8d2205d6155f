"""Policies compared on a simulated clock, on profiles built from the Pollux traces.

Two scenarios, each with job mixes taken in order from one Pollux workload
file (``shared/benchmarks/pollux/workloads/workload-K.csv``):

- ``batch``: model selection, every task arriving at 0;
- ``online``: the tasks arrive at their real arrival times from the workload.

Every policy runs on the same simulated world per seed (true step times
drawn with ``--noise``, seeded). For each policy the table gives the mean over
seeds of: makespan / the strongest baseline's (the baseline, a policy not
named ``saturn*``, with the shortest mean makespan in that scenario; named
under the table), makespan / the lower bound (true step times and arrivals:
no policy can beat it), mean completion time (finish - arrival) / that same
baseline's, GPU utilisation, re-plans, moves and the solver's wall time. The
last lines check the target: event-driven re-planning at least 5% better than
the static plan and no worse than periodic, with the per-seed ratio (mean,
standard error, seeds won), because single runs of two re-planning policies
differ by a percent or two either way.

Seeds can be run in chunks (``--first-seed``, ``--save``) and the table
printed from the saved runs (``--load``), so each command stays short; files
of other policies on the same seeds add their columns (same workload only).

Usage:
    python release/simulate_benchmark.py                        # defaults below
    python release/simulate_benchmark.py --tasks 64 --nodes 8 --gpus-per-node 4 --seeds 5
    python release/simulate_benchmark.py --scenarios batch --first-seed 0 --seeds 5 --save /tmp/a.json
    python release/simulate_benchmark.py --scenarios batch --first-seed 5 --seeds 5 --save /tmp/b.json
    python release/simulate_benchmark.py --load /tmp/a.json /tmp/b.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from pollux import build_profile  # noqa: E402

from ray_saturn import ClusterSpec, defaults  # noqa: E402
from ray_saturn.sim import SimConfig, compare, oracle_lower_bound  # noqa: E402

POLICIES = (
    "saturn-replan",
    "saturn-periodic",
    "saturn-static",
    "fifo-max-gpus",
    "fifo-whole-node",
    "fifo-min-gpus",
    "fifo-fastest",
    "optimus-greedy",
)


def run_scenario(args, scenario: str, save=None) -> dict[str, dict]:
    """Per seed (as a string key), per policy, the run's metrics, and the seed's lower bound.

    ``save(runs)`` is called after every seed, so a chunk cut short keeps the seeds it finished."""
    cluster = ClusterSpec.uniform(args.nodes, args.gpus_per_node)
    profile, arrivals = build_profile(args.tasks, args.nodes, args.gpus_per_node, workload=args.workload)
    if scenario == "batch":
        arrivals = dict.fromkeys(profile.tasks, 0.0)
    else:
        first = min(arrivals.values())
        arrivals = {t: a - first for t, a in arrivals.items()}
    runs: dict[str, dict] = {}
    count = args.seeds if scenario == "batch" else args.online_seeds
    for seed in range(args.first_seed, args.first_seed + count):
        cfg = SimConfig(
            noise=args.noise,
            seed=seed,
            restart_s=args.restart_cost,
            arrivals=arrivals,
            solver_time_limit_s=args.solver_time_limit,
            min_replan_gap_fraction=args.replan_gap,
            deterministic=True,
        )
        t0 = time.perf_counter()
        results = compare(profile, cluster, args.policies, cfg)
        lb = oracle_lower_bound(profile, cluster, cfg)
        runs[str(seed)] = {
            "lower_bound_s": lb,
            "policies": {
                name: {
                    "makespan_s": r.makespan_s,
                    "mean_completion_s": r.mean_completion_s,
                    "utilisation": r.utilisation,
                    "replans": r.replans,
                    "moves": r.moves,
                    "solver_s": r.solver_time_s,
                }
                for name, r in results.items()
            },
        }
        print(
            f"  {scenario} seed {seed}: "
            + ", ".join(f"{n} {r.makespan_s:.0f}" for n, r in results.items())
            + f" (LB {lb:.0f}; {time.perf_counter() - t0:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        if save is not None:
            save(runs)
    return runs


def strongest_baseline(runs: dict[str, dict]) -> str:
    """The baseline (a policy not named saturn*) with the shortest mean makespan over the seeds."""
    names = next(iter(runs.values()))["policies"]
    baselines = [n for n in names if not n.startswith("saturn")]
    if not baselines:
        raise SystemExit("no baseline among the policies: add one (e.g. fifo-whole-node)")
    return min(baselines, key=lambda n: (statistics.mean(r["policies"][n]["makespan_s"] for r in runs.values()), n))


def print_table(scenario: str, runs: dict[str, dict]) -> None:
    every = {n for r in runs.values() for n in r["policies"]}
    names = [p for p in POLICIES if p in every] + sorted(every - set(POLICIES))
    partial = sorted((s for s, r in runs.items() if set(r["policies"]) != every), key=int)
    if partial:  # every ratio is over the same seeds: only those that ran every policy
        print(f"\n(seeds {', '.join(partial)} left out of the {scenario} table: not every policy ran on them)")
        runs = {s: r for s, r in runs.items() if s not in partial}
        if not runs:
            raise SystemExit(f"no {scenario} seed ran every policy")
    best = strongest_baseline(runs)
    per = {n: {} for n in names}
    for run in runs.values():
        ref = run["policies"][best]
        for n in names:
            r = run["policies"][n]
            for key, value in (
                ("makespan_s", r["makespan_s"]),
                ("vs_best", r["makespan_s"] / ref["makespan_s"]),
                ("vs_lb", r["makespan_s"] / run["lower_bound_s"]),
                ("jct_vs_best", r["mean_completion_s"] / ref["mean_completion_s"]),
                ("utilisation", r["utilisation"]),
                ("replans", r["replans"]),
                ("moves", r["moves"]),
                ("solver_s", r["solver_s"]),
            ):
                per[n].setdefault(key, []).append(value)
    table = {n: {k: statistics.mean(v) for k, v in d.items()} for n, d in per.items()}
    seeds = ", ".join(sorted(runs, key=int))
    print(f"\n### {scenario} (seeds {seeds}; strongest baseline here: {best})\n")
    print(
        f"| policy | makespan / {best} | makespan / lower bound | mean JCT / {best} "
        "| utilisation | re-plans | moves | solver s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, m in table.items():
        print(
            f"| {name} | {m['vs_best']:.3f} | {m['vs_lb']:.3f} | {m['jct_vs_best']:.3f} | {m['utilisation']:.3f} "
            f"| {m['replans']:.1f} | {m['moves']:.1f} | {m['solver_s']:.1f} |"
        )
    if "saturn-replan" in table:
        print(
            f"\nsaturn-replan vs the strongest baseline ({best}): "
            f"{100 * (1 - table['saturn-replan']['makespan_s'] / table[best]['makespan_s']):.1f}% shorter mean makespan"
        )
    if {"saturn-replan", "saturn-static", "saturn-periodic"} <= set(table):
        rp, st, pe = (table[p]["makespan_s"] for p in ("saturn-replan", "saturn-static", "saturn-periodic"))
        gain = 1 - rp / st
        print(
            f"saturn-replan vs saturn-static: {100 * gain:.1f}% shorter makespan "
            f"(target >= 5%: {'met' if gain >= 0.05 else 'NOT met'}); vs saturn-periodic: "
            f"{100 * (rp / pe - 1):+.1f}% (target <= 0: {'met' if rp <= pe * (1 + 1e-9) else 'NOT met'})"
        )
        ratios = [r / p for r, p in zip(per["saturn-replan"]["makespan_s"], per["saturn-periodic"]["makespan_s"],
                                        strict=True)]
        se = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("nan")
        wins = sum(r <= 1 + 1e-9 for r in ratios)
        print(
            f"per seed, saturn-replan / saturn-periodic: mean {statistics.mean(ratios):.4f} "
            f"(standard error {se:.4f}), no worse on {wins} of {len(ratios)} seeds"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--workload", type=int, default=1, help="Pollux workload file 1..8 (1)")
    ap.add_argument("--seeds", type=int, default=10, help="seeds of the batch scenario (10)")
    ap.add_argument("--online-seeds", type=int, default=3, help="seeds of the online scenario (3)")
    ap.add_argument("--noise", type=float, default=0.2)
    ap.add_argument("--restart-cost", type=float, default=defaults.RESTART_S)
    ap.add_argument("--solver-time-limit", type=float, default=1.0)
    ap.add_argument("--replan-gap", type=float, default=0.01)
    ap.add_argument("--scenarios", default="batch,online")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--first-seed", type=int, default=0, help="the first seed of each scenario (0)")
    ap.add_argument("--save", metavar="FILE.json", help="also write the runs (per scenario, seed and policy)")
    ap.add_argument("--load", nargs="+", metavar="FILE.json", help="print the tables of saved runs, run nothing")
    args = ap.parse_args()
    if args.load:
        merged: dict[str, dict] = {}
        for path in args.load:
            saved = json.loads(Path(path).read_text())
            print(saved["header"])
            for scenario, runs in saved["scenarios"].items():
                for seed, run in runs.items():  # files of other policies on the same seed add columns
                    have = merged.setdefault(scenario, {}).setdefault(seed, {"policies": {}})
                    if "lower_bound_s" in have and abs(have["lower_bound_s"] - run["lower_bound_s"]) > 1e-6:
                        raise SystemExit(f"{path}: seed {seed} has another lower bound (another workload?)")
                    have["lower_bound_s"] = run["lower_bound_s"]
                    have["policies"].update(run["policies"])
        for scenario, runs in merged.items():
            print_table(scenario, runs)
        return
    args.policies = [p for p in args.policies.split(",") if p]
    header = (
        f"{args.tasks} tasks (Pollux workload {args.workload}) on {args.nodes} x {args.gpus_per_node} GPUs, "
        f"noise {args.noise}, restart {args.restart_cost:.0f} s, {args.seeds} batch / {args.online_seeds} online "
        f"seeds from {args.first_seed}, solver limit {args.solver_time_limit} s per plan"
    )
    print(header)
    out = {"header": header, "scenarios": {}}
    for scenario in args.scenarios.split(","):

        def save(runs: dict[str, dict], scenario: str = scenario) -> None:
            if args.save:
                out["scenarios"][scenario] = runs
                Path(args.save).write_text(json.dumps(out, indent=1))

        runs = run_scenario(args, scenario, save)
        out["scenarios"][scenario] = runs
        print_table(scenario, runs)


if __name__ == "__main__":
    main()
