"""``ray-saturn profile TASKS.py``: measure tasks on Ray and write a profile table (contract 1).

TASKS.py is a Python file defining ``tasks``: a list of ray_saturn.Task, or
a function returning one. Connects to a running Ray cluster (``--address``,
default: the one in RAY_ADDRESS or a local one) or, with ``--num-gpus N``,
starts a local Ray with N logical GPUs (dashboard off).
"""

from __future__ import annotations

import argparse
import json
import logging
import runpy
from pathlib import Path

from ray_saturn.cli.plan import add_cluster_args, cluster_from_args
from ray_saturn.errors import SpecError
from ray_saturn.spec import ClusterSpec, Task

log = logging.getLogger(__name__)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "profile", help="measure tasks on Ray into a profile table", description=__doc__
    )
    p.add_argument(
        "tasks", help="Python file defining `tasks` (a list of Task or a function returning one)"
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="profile table to write (.parquet or .csv)",
    )
    add_cluster_args(p)
    p.add_argument("--address", help="Ray address to connect to (default: auto)")
    p.add_argument(
        "--num-gpus", type=int, metavar="N", help="start a local Ray with N logical GPUs"
    )
    p.add_argument(
        "--strategies", help="comma-separated strategies to try (default: all registered)"
    )
    p.add_argument(
        "--store", metavar="FILE", help="Parquet profile store (cache) to read and extend"
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per knob setting (2)")
    p.add_argument(
        "--steps", type=int, default=5, help="timed steps per knob setting; the median counts (5)"
    )
    p.add_argument(
        "--trial-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="kill a trial after S s (600)",
    )
    p.add_argument(
        "--memory-limit-gb", type=float, help="infeasible above this peak memory per GPU"
    )
    p.add_argument(
        "--no-segment-costs",
        action="store_true",
        help="leave out start-up and checkpoint costs (no trainer start-up probe; plans without start-up)",
    )
    p.add_argument("--json", action="store_true", help="print the cost report as one JSON object")
    p.set_defaults(func=run)


def load_tasks(path: str) -> list[Task]:
    """The tasks a TASKS.py file defines."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{path}: no such tasks file")
    namespace = runpy.run_path(str(p), run_name="ray_saturn_tasks")
    tasks = namespace.get("tasks")
    if callable(tasks):
        tasks = tasks()
    if not isinstance(tasks, (list, tuple)) or not all(isinstance(t, Task) for t in tasks):
        raise SpecError(
            f"{path}: define `tasks` as a list of ray_saturn.Task (or a function returning one)"
        )
    return list(tasks)


def run(args: argparse.Namespace) -> int:
    import ray

    from ray_saturn.profiler import Profiler

    tasks = load_tasks(args.tasks)
    started = False
    if not ray.is_initialized():
        if args.num_gpus is not None:
            ray.init(address="local", num_gpus=args.num_gpus, include_dashboard=False)
        else:
            ray.init(address=args.address or "auto", include_dashboard=False)
        started = True
    try:
        cluster = (
            cluster_from_args(args) if (args.cluster or args.nodes) else ClusterSpec.from_ray()
        )
        strategies = [s.strip() for s in args.strategies.split(",")] if args.strategies else None
        result = Profiler(
            cluster,
            strategies=strategies,
            store=args.store,
            warmup=args.warmup,
            steps=args.steps,
            trial_timeout_s=args.trial_timeout,
            memory_limit_gb=args.memory_limit_gb,
            segment_costs=not args.no_segment_costs,
        ).run(tasks)
    finally:
        if started:
            ray.shutdown()
    result.table.write(args.output)
    if args.json:
        print(
            json.dumps(
                {
                    "output": args.output,
                    "rows": len(result.table),
                    "trials_run": result.trials_run,
                    "trials_cached": result.trials_cached,
                    "profile_gpu_s": result.cost_gpu_s,
                    "workload_gpu_s": result.workload_gpu_s,
                    "cost_ratio": result.cost_ratio,
                    "infeasible": [
                        {"task": t, "strategy": s, "gpus": g, "reason": r}
                        for t, s, g, r in result.infeasible
                    ],
                }
            )
        )
    else:
        print(result.summary())
        for t, s, g, r in result.infeasible:
            print(f"infeasible: {t} {s} on {g} GPU(s): {r}")
        print(f"wrote {args.output}")
    return 0
