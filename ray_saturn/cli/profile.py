"""``ray-saturn profile WORKLOAD.py``: measure tasks on Ray and write a profile table (contract 1).

WORKLOAD.py is a Python file defining ``tasks`` (the same file ``ray-saturn run`` takes): a list of ray_saturn.Task, or
a function returning one. Connects to a running Ray cluster (``--address``,
default: the one in RAY_ADDRESS or a local one) or, with ``--num-gpus N``,
starts a local Ray of N GPUs (without CUDA, N logical GPUs capped at the
CPU cores, as ``ray-saturn run --num-gpus`` starts them: profiling measures
under the concurrency the run has; dashboard off).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from ray_saturn import defaults
from ray_saturn.cli.args import add_local_gpus_option, count, json_stream, local_cluster, output_file, positive, seconds
from ray_saturn.cli.plan import add_cluster_args, cluster_from_args
from ray_saturn.errors import SpecError
from ray_saturn.workload_file import load_workload

log = logging.getLogger(__name__)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "profile", help="measure tasks on Ray into a profile table", description=__doc__
    )
    p.add_argument(
        "tasks", metavar="WORKLOAD", help="Python file defining `tasks` (a list of Task or a function returning one)"
    )
    p.add_argument(
        "-o",
        "--output",
        type=output_file("-o/--output"),
        required=True,
        metavar="FILE",
        help="profile table to write (.parquet or .csv)",
    )
    add_cluster_args(p)
    p.add_argument("--address", help="Ray head to join, host:port (default: RAY_ADDRESS, a running cluster, "
                   "or a new local Ray)")
    add_local_gpus_option(p, what="measure")
    p.add_argument(
        "--strategies", help="comma-separated strategies to try (default: all registered)"
    )
    p.add_argument(
        "--store", metavar="FILE", help="Parquet profile store (cache) to read and extend"
    )
    p.add_argument("--warmup", type=count("--warmup", low=0), default=defaults.PROFILE_WARMUP_STEPS,
                   help=f"untimed steps per knob setting ({defaults.PROFILE_WARMUP_STEPS})")
    p.add_argument("--steps", type=count("--steps"), default=defaults.PROFILE_TIMED_STEPS,
                   help=f"timed steps per knob setting; the median counts ({defaults.PROFILE_TIMED_STEPS})")
    p.add_argument("--min-measure", type=seconds("--min-measure", zero=True), default=defaults.PROFILE_MIN_MEASURE_S,
                   metavar="S", help="time more steps per knob setting until they take S s "
                   f"({defaults.PROFILE_MIN_MEASURE_S:g})")
    p.add_argument("--trial-timeout", type=seconds("--trial-timeout"), default=defaults.PROFILE_TRIAL_TIMEOUT_S,
                   metavar="S", help=f"kill a trial after S s ({defaults.PROFILE_TRIAL_TIMEOUT_S:g})")
    p.add_argument(
        "--memory-limit-gb", type=positive("--memory-limit-gb", "GB"), help="infeasible above this peak memory per GPU"
    )
    p.add_argument(
        "--no-segment-costs",
        action="store_true",
        help="leave out start-up and checkpoint costs (no trainer start-up probe; plans without start-up)",
    )
    p.add_argument(
        "--shares",
        type=_shares,
        default=(),
        metavar="K,...",
        help="also measure each task on a share 1/K of one device, K copies at once on one GPU "
        "(K in 2, 4, 8; e.g. 2,4); rows of gpus=1/K where K copies fit the device's memory (default: none)",
    )
    p.add_argument("--json", action="store_true", help="print the cost report as one JSON object")
    p.set_defaults(func=run)


def _shares(text: str) -> tuple[int, ...]:
    from ray_saturn.profiler.shares import check_shares

    try:
        out = check_shares(text)
    except SpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not out:
        raise argparse.ArgumentTypeError(f"{text!r} names no share; give k's of the shares 1/k, e.g. 2,4")
    return out


def check_ray_address(address: str, timeout_s: float = 5.0) -> None:
    """A Ray address to join must answer at its host:port within ``timeout_s``; else a one-line error.

    Example:
        >>> check_ray_address("auto")  # Ray's own look-up: nothing to check
    """
    import socket
    import threading

    if address in ("auto", "local"):
        return
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SpecError(f"--address {address!r}: give the Ray head's host:port (e.g. 127.0.0.1:6379), or leave "
                        "--address out to join RAY_ADDRESS or start a local Ray")
    failure: list[str] = ["no answer"]

    def probe() -> None:  # in a thread: a name look-up is not bounded by the socket's timeout
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
            failure.clear()
        except OSError as exc:
            failure[0] = exc.strerror or str(exc)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s + 1)
    if failure:
        raise SpecError(f"--address {address}: no Ray cluster answers there within {timeout_s:g} s ({failure[0]}); "
                        "start one with `ray start --head` and give its address, or leave --address out")


def _gpus_text(gpus: int | float) -> str:
    return f"1/{round(1 / gpus)} of a GPU" if gpus < 1 else f"{gpus} GPU(s)"


def run(args: argparse.Namespace) -> int:
    from ray_saturn.profiler import Profiler
    from ray_saturn.runtime.local import joined_or_private_ray

    # Everything is checked before Ray starts: the flags (by their types), the output's format, the
    # tasks, the cluster (unless it is Ray's own), the strategies and the store.
    if Path(args.output).suffix.lower() not in (".csv", ".parquet"):
        raise SpecError(f"-o {args.output}: a profile table is written as .csv or .parquet; give one of those")
    tasks = load_workload(args.tasks)
    given = args.cluster or args.nodes or args.gpus_per_node
    strategies = [s.strip() for s in args.strategies.split(",")] if args.strategies else None
    profiler = Profiler(
        cluster_from_args(args) if given else None,  # None: the connected Ray cluster's
        strategies=strategies,
        store=args.store,
        warmup=args.warmup,
        steps=args.steps,
        min_measure_s=args.min_measure,
        trial_timeout_s=args.trial_timeout,
        memory_limit_gb=args.memory_limit_gb,
        segment_costs=not args.no_segment_costs,
        shares=args.shares,
    )
    if args.num_gpus is not None and args.address:
        raise SpecError("--num-gpus starts a local Ray and --address joins one; give one of them")
    if args.address:
        check_ray_address(args.address)  # ray.init would retry an address where no Ray answers for minutes
    # No --address: RAY_ADDRESS or a running cluster is joined, else a private local Ray starts (as run does).
    with local_cluster(args.num_gpus), joined_or_private_ray(args.address, include_dashboard=False):
        result = profiler.run(tasks)
    result.table.write(args.output)
    if args.json:
        print(
            json.dumps(
                {
                    "output": args.output,
                    "rows": len(result.table),
                    "trials_run": result.trials_run,
                    "trials_cached": result.trials_cached,
                    "shares_run": result.shares_run,
                    "shares_cached": result.shares_cached,
                    "profile_gpu_s": result.cost_gpu_s,
                    "workload_gpu_s": result.workload_gpu_s,
                    "cost_ratio": result.cost_ratio,
                    "infeasible": [
                        {"task": t, "strategy": s, "gpus": g, "reason": r}
                        for t, s, g, r in result.infeasible
                    ],
                }
            ),
            file=json_stream(),
        )
    else:
        print(result.summary())
        for t, s, g, r in result.infeasible:
            print(f"infeasible: {t} {s} on {_gpus_text(g)}: {r}")
        print(f"wrote {args.output}")
    return 0
