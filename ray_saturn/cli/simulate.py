"""``ray-saturn simulate PROFILE``: compare policies on a simulated clock (contract 3).

Every policy runs on the same simulated world: the same true step times
(``--noise``, seeded), arrivals (``--arrivals``) and node failures. With
``--json`` it prints ``{"policies": {name: {"makespan_s", "mean_completion_s",
"utilisation", "moves", "solver_time_s", ...}}}``; ``--plot FILE.png`` draws
GPU utilisation over time and a Gantt chart per policy.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from ray_saturn import defaults
from ray_saturn.cli.args import (
    add_arrival_options,
    add_profile_argument,
    chosen_objective,
    count,
    fraction,
    json_stream,
    output_file,
    profile_path,
    seconds,
    seed,
)
from ray_saturn.cli.plan import add_cluster_args, cluster_from_args
from ray_saturn.control import get_replan_policy, replan_policy_names
from ray_saturn.errors import SpecError
from ray_saturn.limits import MAX_NOISE
from ray_saturn.profile_table import ProfileTable
from ray_saturn.sim import (
    SimConfig,
    compare,
    oracle_completion_bound,
    oracle_lower_bound,
    parse_arrivals,
    parse_failures,
    random_failures,
)

DEFAULT_POLICIES = (
    "saturn-static",
    "saturn-replan",
    "saturn-periodic",
    "fifo-max-gpus",
    "fifo-whole-node",
    "fifo-min-gpus",
    "fifo-fastest",
    "optimus-greedy",
)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="compare policies on a simulated clock",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_profile_argument(p, verb="simulate")
    add_cluster_args(p)
    p.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help="comma-separated; any of: " + ", ".join(replan_policy_names()),
    )
    p.add_argument("--noise", type=fraction("--noise", high=MAX_NOISE), default=0.2,
                   help="relative spread of true step times (0.2)")
    p.add_argument("--seed", type=seed(), default=0,
                   help="seed of the true step times (--noise), poisson arrivals, random failures and the solver (0)")
    add_arrival_options(p)
    p.add_argument(
        "--restart-cost",
        type=seconds("--restart-cost", zero=True),
        default=defaults.RESTART_S,
        metavar="S",
        help=f"seconds a moved task spends restarting, besides the profile's start-up ({defaults.RESTART_S:g})",
    )
    p.add_argument(
        "--failures",
        default="",
        metavar="NODE@AT[:BACK],...",
        help="node failures (and recoveries), seconds",
    )
    p.add_argument(
        "--random-failures",
        type=count("--random-failures", low=0),
        default=0,
        metavar="K",
        help="K random node failures during the first plan's makespan",
    )
    p.add_argument(
        "--recovery",
        type=seconds("--recovery"),
        default=None,
        metavar="S",
        help="random failures come back after S seconds (default: never)",
    )
    p.add_argument(
        "--solver-time-limit",
        type=seconds("--solver-time-limit"),
        default=defaults.SIMULATE_SOLVER_TIME_LIMIT_S,
        metavar="S",
        help=f"time limit of each (re-)plan ({defaults.SIMULATE_SOLVER_TIME_LIMIT_S:g})",
    )
    p.add_argument(
        "--replan-gap",
        type=fraction("--replan-gap"),
        default=0.01,
        metavar="F",
        help="least time between re-plans, as a fraction of the longest plan's makespan so far (0.01)",
    )
    p.add_argument(
        "--replan-window",
        type=count("--replan-window"),
        default=None,
        metavar="N",
        help="re-plan at most N queued tasks at a time (rolling horizon); default: all, or 200 above 300 tasks",
    )
    p.add_argument("--deterministic", action="store_true", help="solver limits counted in work: same seed, same run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", type=output_file("--plot"), metavar="FILE.png", help="write utilisation and Gantt charts")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # The controller warns of what it sees on the simulated clock (a node lost, no node alive); per event that
    # is noise here, and what matters ends up in the results or the one-line error. -v shows them.
    control = logging.getLogger("ray_saturn.control")
    level = control.level
    if not getattr(args, "verbose", 0):
        control.setLevel(logging.ERROR)
    try:
        return _run(args)
    finally:
        control.setLevel(level)


def _run(args: argparse.Namespace) -> int:
    cluster = cluster_from_args(args)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        raise SpecError("--policies is empty; name at least one policy")
    twice = sorted({p for p in policies if policies.count(p) > 1})
    if twice:
        raise SpecError(f"--policies names {', '.join(twice)} more than once; name each policy once")
    for name in policies:
        get_replan_policy(name)
    if args.plot:
        from ray_saturn.sim.plot import check_plot_path

        check_plot_path(args.plot)  # before minutes of simulation, not after
    profile = ProfileTable.read(profile_path(args))
    arrivals = parse_arrivals(args.arrivals, profile, seed=args.seed)
    failures = parse_failures(args.failures, cluster) if args.failures else []
    objective = chosen_objective(args.objective, arrivals, profile)
    base = SimConfig(
        noise=args.noise,
        seed=args.seed,
        restart_s=args.restart_cost,
        arrivals=arrivals,
        solver_time_limit_s=args.solver_time_limit,
        min_replan_gap_fraction=args.replan_gap,
        deterministic=args.deterministic,
        max_replan_tasks=args.replan_window or (200 if len(profile.tasks) > 300 else None),
        objective=objective,
    )
    if args.recovery is not None and not args.random_failures:
        raise SpecError("--recovery S applies to --random-failures K only; give K, or write each failure's "
                        "return in --failures as NODE@AT:BACK")
    if args.random_failures:
        from ray_saturn.solver import solve

        horizon = solve(profile, cluster, "fifo-max-gpus").makespan_s
        failures += random_failures(
            cluster,
            args.random_failures,
            horizon_s=horizon,
            recovery_s=args.recovery,
            seed=args.seed,
        )
    cfg = SimConfig(**{**base.__dict__, "failures": tuple(failures)})
    results = compare(profile, cluster, policies, cfg)
    lb = oracle_lower_bound(profile, cluster, cfg)
    clb = oracle_completion_bound(profile, cluster, cfg)
    if args.json:
        print(
            json.dumps(
                {
                    "objective": objective,
                    "arrivals": "batch" if all(a <= 0 for a in arrivals.values()) else args.arrivals,
                    "lower_bound_s": round(lb, 3),
                    "completion_lower_bound_s": round(clb, 3),
                    "policies": {k: r.to_dict() for k, r in results.items()},
                }
            ),
            file=json_stream(),
        )
    else:
        print_table(results, lb)
        print(f"objective {objective}; mean completion time lower bound: {clb:.0f} s")
    if args.plot:  # after the results are out: a chart that cannot be written loses nothing else
        from ray_saturn.sim.plot import plot_results

        plot_results(results, args.plot, cluster=cluster)
    return 0


def strongest_baseline(results) -> str | None:
    """The name of the baseline (a policy not named ``saturn*``) with the shortest makespan, or None."""
    baselines = [name for name in results if not name.startswith("saturn")]
    return min(baselines, key=lambda name: (results[name].makespan_s, name), default=None)


def print_table(results, lower_bound_s: float, out=sys.stdout) -> None:
    best = strongest_baseline(results)
    ref = results[best] if best is not None else None
    print(
        f"{'policy':<18} {'makespan_s':>11} {'/best-bl':>8} {'/LB':>6} {'mean_JCT_s':>11} {'util':>5} "
        f"{'replans':>7} {'moves':>5} {'solver_s':>8}",
        file=out,
    )
    for name, r in results.items():
        vs = f"{r.makespan_s / ref.makespan_s:.3f}" if ref and ref.makespan_s else "-"
        vlb = f"{r.makespan_s / lower_bound_s:.3f}" if lower_bound_s > 0 else "-"
        print(
            f"{name:<18} {r.makespan_s:>11.0f} {vs:>8} {vlb:>6} {r.mean_completion_s:>11.0f} "
            f"{r.utilisation:>5.2f} {r.replans:>7} {r.moves:>5} {r.solver_time_s:>8.1f}",
            file=out,
        )
    if best is not None:
        print(f"/best-bl: makespan over the strongest baseline here, {best}", file=out)
    print(f"lower bound (true step times, arrivals): {lower_bound_s:.0f} s", file=out)
