"""``ray-saturn plan PROFILE``: solve a profile table into a plan (contract 2)."""

from __future__ import annotations

import argparse
import os
import sys

from ray_saturn import defaults
from ray_saturn.cli.args import (
    add_profile_argument,
    count,
    json_stream,
    output_file,
    profile_path,
    seconds,
    seed,
    write_text,
)
from ray_saturn.errors import SpecError
from ray_saturn.limits import MAX_GPUS_PER_NODE, MAX_NODES
from ray_saturn.plan import Plan
from ray_saturn.profile_table import ProfileTable
from ray_saturn.solver import get_policy, policy_names, solve
from ray_saturn.solver.objective import OBJECTIVES
from ray_saturn.spec import ClusterSpec


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """--nodes/--gpus-per-node or --cluster FILE: shared by plan, simulate and emulate."""
    p.add_argument("--nodes", type=count("--nodes", high=MAX_NODES), help="number of identical nodes")
    p.add_argument("--gpus-per-node", type=count("--gpus-per-node", high=MAX_GPUS_PER_NODE), help="GPUs on each node")
    p.add_argument(
        "--cluster", metavar="FILE", help='heterogeneous cluster JSON: {"nodes": [{"name": "a", "gpus": 8}, ...]}'
    )


def cluster_from_args(args: argparse.Namespace) -> ClusterSpec:
    if args.cluster:
        if args.nodes or args.gpus_per_node:
            raise SpecError("give either --cluster FILE or --nodes N --gpus-per-node G, not both")
        return ClusterSpec.from_json(args.cluster)
    if args.nodes is None or args.gpus_per_node is None:
        raise SpecError("give --nodes N and --gpus-per-node G (or --cluster FILE)")
    return ClusterSpec.uniform(args.nodes, args.gpus_per_node)


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="solve a profile table into a plan", description=__doc__)
    add_profile_argument(p, verb="plan")
    add_cluster_args(p)
    p.add_argument("--policy", default=defaults.PLAN_POLICY,
                   help=f"{defaults.PLAN_POLICY} (default) or a baseline: "
                   + ", ".join(n for n in policy_names() if n != defaults.PLAN_POLICY))
    p.add_argument("--time-limit", type=seconds("--time-limit"), default=defaults.PLAN_TIME_LIMIT_S, metavar="S",
                   help=f"solver time limit in seconds ({defaults.PLAN_TIME_LIMIT_S:g})")
    p.add_argument("--seed", type=seed(), default=0,
                   help="seed of the saturn search and the random baseline (0); the same seed with --deterministic "
                   "gives the same plan")
    p.add_argument("--deterministic", action="store_true",
                   help="count the saturn search in work, not seconds: the same plan for the same seed on any machine")
    p.add_argument("--objective", default="makespan", choices=OBJECTIVES,
                   help="what the saturn policy optimises: makespan (default), completion (mean completion "
                   "time; a profile 'weight' column weights it) or online (completion, makespan within 3%% of "
                   "the best)")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("-o", "--output", type=output_file("--output"), metavar="FILE",
                   help="also write the plan JSON to FILE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cluster = cluster_from_args(args)
    path = profile_path(args)
    if args.deterministic and args.policy != "saturn":
        raise SpecError("--deterministic applies to the saturn policy only (the baselines are deterministic)")
    get_policy(args.policy)  # an unknown name is refused before the profile is read
    if args.output:
        for flag, given in (("PROFILE", args.profile), ("--cluster", args.cluster)):
            if given and _same_file(args.output, given):
                raise SpecError(f"--output {args.output} is the {flag} file the plan is made from; writing the plan "
                                "there would overwrite it: give another file, e.g. plan.json")
    policy = get_policy("saturn", deterministic=True, objective=args.objective) if args.deterministic else args.policy
    profile = ProfileTable.read(path)
    plan = solve(profile, cluster, policy, time_limit_s=args.time_limit, seed=args.seed, objective=args.objective)
    if args.output:
        write_text(args.output, plan.to_json(indent=2), "--output")
    if args.json:
        print(plan.to_json(), file=json_stream())
    else:
        print_table(plan)
    return 0


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def _fmt_s(s: float) -> str:
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{int(h)}:{int(m):02d}:{sec:04.1f}" if h else f"{int(m)}:{sec:04.1f}"


def print_table(plan: Plan, out=None) -> None:
    out = out or sys.stdout
    rows = sorted(plan.assignments, key=lambda a: (a.start_s, a.task))
    w = max([4] + [len(a.task) for a in rows])
    print(f"{'task':<{w}}  {'strategy':<14} {'gpus':>4}  {'start':>10} {'end':>10}  nodes", file=out)
    for a in rows:
        print(f"{a.task:<{w}}  {a.strategy:<14} {a.gpus:>4}  {_fmt_s(a.start_s):>10} {_fmt_s(a.end_s):>10}  "
              f"{','.join(a.nodes)}", file=out)
    print(file=out)
    print(f"policy {plan.policy}: makespan {plan.makespan_s:.1f} s ({_fmt_s(plan.makespan_s)}), "
          f"lower bound {plan.lower_bound_s:.1f} s, gap {100 * plan.gap:.1f}% ({plan.status}), "
          f"solved in {plan.solve_time_s:.2f} s", file=out)
    if plan.mean_completion_s is not None:
        print(f"objective {plan.objective}: mean completion time {plan.mean_completion_s:.1f} s, "
              f"lower bound {plan.completion_lower_bound_s:.1f} s", file=out)
