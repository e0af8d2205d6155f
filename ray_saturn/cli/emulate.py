"""``ray-saturn emulate PROFILE``: the real runtime on emulated tasks (contract 3).

Starts a local multi-node Ray cluster with logical GPUs, plans the profile
and executes it with the driver actor, placement groups, progress reports,
checkpoints and re-planning; each task's step sleeps step_time_s x
--time-scale (x a seeded noise factor). Shares of one GPU (gpus = 1/k) run
as fractional-GPU bundles on one logical GPU; --gpu-types gives each node a
GPU type for profiles with a gpu_type column; --cluster FILE gives nodes of
different sizes and types (named as in the file). With --json, times are profile
seconds (wall / time scale).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from ray_saturn import defaults
from ray_saturn.cli.args import (
    add_arrival_options,
    add_profile_argument,
    chosen_objective,
    count,
    fraction,
    json_stream,
    profile_path,
    seconds,
    seed,
)
from ray_saturn.cli.run import add_storage_option
from ray_saturn.limits import MAX_GPUS_PER_NODE, MAX_NOISE, parse_float
from ray_saturn.profile_table import ProfileTable
from ray_saturn.runtime.emulation import emulate
from ray_saturn.sim.workload import parse_arrivals
from ray_saturn.spec import ClusterSpec

#: An emulated node is a raylet on this machine: more than this many is more than a laptop holds.
MAX_EMULATED_NODES = 32
#: Wall seconds per profile second: beyond this a run of minutes of profile time takes days.
MAX_TIME_SCALE = 1000.0


def time_scale(text: str) -> float:
    """--time-scale: a finite factor > 0 (wall seconds per profile second), at most MAX_TIME_SCALE."""
    try:
        value = parse_float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value <= MAX_TIME_SCALE):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a finite factor > 0 and <= {MAX_TIME_SCALE:g} (wall seconds per profile second, "
            "e.g. 0.001)"
        )
    return value


def gpu_types(text: str) -> list[str | None]:
    """--gpu-types: comma-separated GPU type names, one per node; an empty entry is an untyped node."""
    from ray_saturn.errors import SaturnError
    from ray_saturn.spec import check_gpu_type

    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is empty; give one GPU type per emulated node, e.g. fast,fast,slow, or leave the flag out"
        )
    try:
        return [check_gpu_type(t, f"entry {i + 1}") for i, t in enumerate(text.split(","))]
    except SaturnError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub) -> None:
    p = sub.add_parser(
        "emulate", help="run the runtime on emulated tasks on a local cluster", description=__doc__
    )
    add_profile_argument(p, verb="emulate")
    p.add_argument("--nodes", type=count("--nodes", high=MAX_EMULATED_NODES),
                   help=f"emulated nodes (one raylet each on this machine; at most {MAX_EMULATED_NODES})")
    p.add_argument("--gpus-per-node", type=count("--gpus-per-node", high=MAX_GPUS_PER_NODE),
                   help="logical GPUs per node")
    p.add_argument("--cluster", metavar="FILE",
                   help='instead of --nodes/--gpus-per-node/--gpu-types: a cluster JSON file as plan takes it, '
                   '{"nodes": [{"name": "a", "gpus": 4, "gpu_type": "fast"}, ...]}; each node is emulated with its '
                   "GPUs and type, and called by its name")
    p.add_argument(
        "--time-scale",
        type=time_scale,
        required=True,
        metavar="X",
        help="wall seconds per profile second (e.g. 0.001: 1000 s of profile in 1 s)",
    )
    p.add_argument(
        "--noise",
        type=fraction("--noise", high=MAX_NOISE),
        default=0.0,
        metavar="F",
        help="relative noise on true step times (0.3: 30%%), seeded",
    )
    p.add_argument("--seed", type=seed(), default=0,
                   help="seed of the step-time noise, poisson arrivals and the solver (0)")
    p.add_argument(
        "--policy",
        default=defaults.POLICY,
        help=f"re-planning policy: {defaults.POLICY} (default), saturn-static, saturn-periodic, "
        "or a baseline planner",
    )
    p.add_argument(
        "--solver-time-limit",
        type=seconds("--solver-time-limit"),
        default=defaults.EMULATE_SOLVER_TIME_LIMIT_S,
        metavar="S",
        help=f"wall seconds per solver call ({defaults.EMULATE_SOLVER_TIME_LIMIT_S:g})",
    )
    p.add_argument(
        "--gpu-types",
        type=gpu_types,
        default=None,
        metavar="T,T,...",
        help="one GPU type per emulated node (Ray's accelerator_type resource), e.g. fast,fast,slow,slow; "
        "rows of a profile's gpu_type column run only on nodes of their type; an empty entry (fast,,slow) "
        "leaves its node untyped: it runs only rows with an empty gpu_type",
    )
    add_arrival_options(p)
    add_storage_option(p, required=False, help="the run's folder, local path or URI (default: a new temporary folder)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Everything is checked before the local cluster starts: flags (by their types), the policy,
    # the profile and that every task fits the emulated cluster.
    from ray_saturn.errors import SpecError
    from ray_saturn.runtime.config import check_policy, emulation_config
    from ray_saturn.runtime.emulation import checked_emulated_spec
    from ray_saturn.solver import build_problem

    spec = None
    if args.cluster:
        if args.nodes is not None or args.gpus_per_node is not None or args.gpu_types is not None:
            raise SpecError("give either --cluster FILE or --nodes N --gpus-per-node G (and --gpu-types), not both")
        spec = checked_emulated_spec(ClusterSpec.from_json(args.cluster))
    elif args.nodes is None or args.gpus_per_node is None:
        raise SpecError("give --nodes N and --gpus-per-node G (or --cluster FILE)")
    check_policy(args.policy)
    cfg = emulation_config(
        args.time_scale, policy=args.policy, seed=args.seed, solver_time_limit_s=args.solver_time_limit
    )
    profile = ProfileTable.read(profile_path(args))
    profile.check_feasible()
    arrivals = parse_arrivals(args.arrivals, profile, seed=args.seed)
    batch = all(a <= 0 for a in arrivals.values())
    cfg = replace(cfg, objective=chosen_objective(args.objective, arrivals, profile))
    from ray_saturn.runtime.emulation import check_emulated_types
    from ray_saturn.spec import NodeSpec

    if spec is None:
        types = check_emulated_types(args.nodes, args.gpu_types)
        # The emulated nodes as the driver will see them (names aside): every task must fit one of its types.
        build_problem(profile, ClusterSpec(tuple(NodeSpec(f"node-{i}", args.gpus_per_node, gpu_type=t)
                                                 for i, t in enumerate(types))))
    else:
        build_problem(profile, spec)
    out = emulate(
        profile,
        args.nodes,
        args.gpus_per_node,
        cluster=spec,
        time_scale=args.time_scale,
        noise=args.noise,
        storage=args.storage,
        config=cfg,
        gpu_types=args.gpu_types,
        arrivals=None if batch else arrivals,
    )
    if args.json:
        print(json.dumps(out), file=json_stream())
        return 0 if out["state"] == "finished" else 1
    print(f"run folder: {out['run_dir']}")
    for t in out["tasks"]:
        segs = "; ".join(
            f"{s['strategy']}x{s['gpus']} on {','.join(s['nodes'])}"
            + "".join(f" [{n} GPU {','.join(str(d) for d, _ in v)}]" for n, v in (s.get("devices") or {}).items())
            + " "
            f"{s['start_s']:.0f}-{s['end_s'] if s['end_s'] is None else round(s['end_s'])}"
            for s in t["segments"]
        )
        print(f"{t['task']:<20} {t['state']:<9} {t['steps_done']:>8}/{t['total_steps']:<8} {segs}")
    planned = out["planned_makespan_s"]
    ratio = f" ({out['realised_makespan_s'] / planned:.3f}x)" if planned else ""
    print(
        f"planned makespan {'-' if planned is None else f'{planned:.0f} s'}, "
        f"realised {out['realised_makespan_s']:.0f} s{ratio}, {out['replans']} re-plan(s), "
        f"{out['moves']} move(s), median launch latency {out['launch_latency_s']} s, "
        f"wall {out['wall_s']:.0f} s"
    )
    if out["state"] != "finished":
        print(f"run {out['state']}: {out.get('reason') or 'see the tasks above'}")
    return 0 if out["state"] == "finished" else 1
