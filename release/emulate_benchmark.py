"""Emulation benchmark: the real runtime on 32 Pollux tasks, 4 nodes x 4 logical GPUs.

Runs ``ray_saturn.emulate`` (driver actor, placement groups, progress,
checkpoints, re-planning) on one local ``ray.cluster_utils.Cluster``,
time-scaled so the planned makespan takes about ``--wall`` seconds, and
reports:

1. no noise: realised / planned makespan (target <= 1.10) and the median
   launch latency (a segment's launch to its first step; for tasks the plan
   starts at 0 this is plan start to first step);
2. 30% noise on the true step times (seeded, the same draw in both runs):
   the realised makespan with event-driven re-planning (``saturn-replan``)
   against the static plan (``saturn-static``, work-conserving); target:
   re-planning is below.

Times are profile seconds (wall / time scale) unless marked wall.

Usage:
    PYTHONPATH=. python release/emulate_benchmark.py [--wall 120] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pollux  # noqa: E402

from ray_saturn import ClusterSpec  # noqa: E402
from ray_saturn.runtime.config import emulation_config  # noqa: E402
from ray_saturn.runtime.emulation import emulate, emulated_cluster  # noqa: E402
from ray_saturn.solver import solve  # noqa: E402


def case(profile, scale, policy, noise, seed, solver_s, nodes, gpn) -> dict:
    # One checkpoint per wall second, a restart cost of one wall second (until one is measured).
    cfg = replace(emulation_config(scale, policy=policy, seed=seed, solver_time_limit_s=solver_s), poll_wall_s=0.05)
    with tempfile.TemporaryDirectory(prefix="emulate-bench-") as d:
        t0 = time.time()
        out = emulate(
            profile,
            nodes,
            gpn,
            time_scale=scale,
            noise=noise,
            storage=Path(d) / "run",
            config=cfg,
            use_running_ray=True,
        )
        out["wall_s"] = round(time.time() - t0, 1)
    out["policy"] = policy
    out["noise"] = noise
    # Plan start to first step, for the tasks the plan starts at once (launched in the first 1%).
    first = [t["segments"][0] for t in out["tasks"] if t["segments"]]
    early = sorted(
        s["first_step_s"]
        for s in first
        if s["first_step_s"] is not None and s["start_s"] <= 0.01 * out["planned_makespan_s"]
    )
    out["plan_start_to_first_step_s"] = early[len(early) // 2] if early else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--wall", type=float, default=120.0, help="wall seconds for the planned makespan")
    ap.add_argument("--noise", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--solver-time-limit", type=float, default=1.0, help="wall seconds per re-plan")
    ap.add_argument("--only", choices=("nonoise", "noise"), help="run one half only")
    ap.add_argument("--json", metavar="FILE", help="also write every run's report here")
    args = ap.parse_args()

    profile, _ = pollux.build_profile(args.tasks, args.nodes, args.gpus_per_node)
    plan = solve(profile, ClusterSpec.uniform(args.nodes, args.gpus_per_node), "saturn", time_limit_s=10)
    scale = args.wall / plan.makespan_s
    print(
        f"{args.tasks} tasks on {args.nodes} x {args.gpus_per_node} GPUs: offline plan "
        f"{plan.makespan_s:.0f} s (lower bound {plan.lower_bound_s:.0f} s); time scale {scale:.6f} "
        f"(1 profile s = {1000 * scale:.2f} ms wall)",
        flush=True,
    )
    runs = []
    with emulated_cluster(args.nodes, args.gpus_per_node):
        todo = []
        if args.only in (None, "nonoise"):
            todo += [("saturn-static", 0.0), ("saturn-replan", 0.0)]
        if args.only in (None, "noise"):
            todo += [("saturn-replan", args.noise), ("saturn-static", args.noise)]
        for policy, noise in todo:
            out = case(profile, scale, policy, noise, args.seed, args.solver_time_limit, args.nodes, args.gpus_per_node)
            runs.append(out)
            ratio = out["realised_makespan_s"] / out["planned_makespan_s"]
            print(
                f"{policy:<14} noise {noise:.0%}: planned {out['planned_makespan_s']:.0f} s, "
                f"realised {out['realised_makespan_s']:.0f} s ({ratio:.3f}x), "
                f"{out['replans']} re-plans, {out['moves']} moves, median launch latency "
                f"{out['launch_latency_s']:.1f} s ({out['launch_latency_s'] * scale:.3f} s wall), "
                f"plan start to first step {out['plan_start_to_first_step_s']:.1f} s, "
                f"wall {out['wall_s']:.0f} s, {out['state']}",
                flush=True,
            )
    print()
    print(
        "| run | policy | noise | planned makespan (s) | realised (s) | realised / planned | re-plans | moves "
        "| median launch latency (s / wall s) | plan start to first step (s / wall s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(runs, 1):
        print(
            f"| {i} | {r['policy']} | {r['noise']:.0%} | {r['planned_makespan_s']:.0f} | "
            f"{r['realised_makespan_s']:.0f} | {r['realised_makespan_s'] / r['planned_makespan_s']:.3f} | "
            f"{r['replans']} | {r['moves']} | {r['launch_latency_s']:.1f} / "
            f"{r['launch_latency_s'] * scale:.3f} | {r['plan_start_to_first_step_s']:.1f} / "
            f"{r['plan_start_to_first_step_s'] * scale:.3f} |"
        )
    noisy = {r["policy"]: r["realised_makespan_s"] for r in runs if r["noise"] > 0}
    if len(noisy) == 2:
        gain = 1 - noisy["saturn-replan"] / noisy["saturn-static"]
        print(
            f"\nwith {args.noise:.0%} noise: re-planning {noisy['saturn-replan']:.0f} s vs static "
            f"{noisy['saturn-static']:.0f} s ({100 * gain:+.1f}% shorter with re-planning)"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"time_scale": scale, "offline_plan_s": plan.makespan_s, "runs": runs}, indent=1)
        )


if __name__ == "__main__":
    main()
