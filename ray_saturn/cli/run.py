"""``ray-saturn run WORKLOAD``: profile (or load a profile), plan, execute, report.

WORKLOAD is a Python file that defines the tasks: a module-level ``tasks``
list of ``ray_saturn.Task`` (or a ``tasks()`` function returning one). The
run joins the running Ray cluster (RAY_ADDRESS, ``ray job submit``) or
starts a local one.
"""

from __future__ import annotations

import argparse
import json
import os

from ray_saturn import defaults
from ray_saturn.cli.args import add_local_gpus_option, json_stream, local_cluster, seconds
from ray_saturn.solver.objective import OBJECTIVES
from ray_saturn.workload_file import load_workload

STORAGE_HELP = (
    "where the run lives: its folder and every checkpoint (a local path every node sees, "
    "or a URI such as s3://bucket/runs/x; see README 'Running on a multi-node cluster')"
)


def add_storage_option(p, *, required: bool, help: str = STORAGE_HELP) -> None:
    """``--storage`` (with ``--run-dir``, its deprecated old name, as an alias)."""
    p.add_argument("--storage", "--run-dir", dest="storage", required=required, metavar="STORAGE", help=help)


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="profile, plan and train a workload", description=__doc__)
    p.add_argument("workload", metavar="WORKLOAD", help="Python file defining `tasks`")
    add_storage_option(p, required=True)
    p.add_argument("--profile", metavar="FILE", help="use this profile instead of profiling")
    p.add_argument("--policy", default=defaults.POLICY, help=f"re-planning policy ({defaults.POLICY})")
    p.add_argument(
        "--checkpoint-interval",
        type=seconds("--checkpoint-interval"),
        default=defaults.CHECKPOINT_INTERVAL_S,
        metavar="S",
        help=f"seconds between checkpoints ({defaults.CHECKPOINT_INTERVAL_S:g})",
    )
    p.add_argument(
        "--solver-time-limit",
        type=seconds("--solver-time-limit"),
        default=defaults.SOLVER_TIME_LIMIT_S,
        metavar="S",
        help=f"wall seconds per solver call ({defaults.SOLVER_TIME_LIMIT_S:g})",
    )
    p.add_argument("--objective", default="makespan", choices=OBJECTIVES,
                   help="what plans optimise: makespan (default), completion (mean job completion time) "
                   "or online (completion time, makespan within 3%% of the best)")
    add_local_gpus_option(p, what="train")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ray_saturn.runtime.api import run as run_api
    from ray_saturn.runtime.config import DriverConfig, check_policy

    check_policy(args.policy)
    tasks = load_workload(args.workload)
    profile = None
    if args.profile:  # read and checked before Ray starts (--num-gpus) or is joined
        from ray_saturn.profile_table import ProfileTable
        from ray_saturn.runtime.api import check_profile

        profile = ProfileTable.read(args.profile)
        check_profile(profile, tasks)
    cfg = DriverConfig(
        policy=args.policy,
        checkpoint_interval_s=args.checkpoint_interval,
        solver_time_limit_s=args.solver_time_limit,
        objective=args.objective,
    )
    with local_cluster(args.num_gpus):
        result = run_api(
            tasks,
            storage=args.storage,
            profile=profile,
            config=cfg,
            workload=os.path.abspath(args.workload),
        )
    print_result(result, as_json=args.json)
    return 0 if result.state == "finished" and not result.failed_tasks else 1


def _as_dict(result, o) -> dict:
    """The result as the CLI reports it, by its :class:`~ray_saturn.runtime.records.RunOutcome` ``o``:
    ``failed_tasks`` counts the failed tasks, and a run whose every task failed says so."""
    out = result.to_dict()
    out["failed_tasks"] = len(o.failed)
    if o.every_task_failed:
        first = (result.tasks[o.failed[0]].reason or "no reason recorded").splitlines()[0][:200]
        out["state"] = o.state
        out["reason"] = f"every task failed ({len(o.failed)}); {o.failed[0]}: {first}"
    return out


def print_result(result, *, as_json: bool) -> None:
    """A finished (or resumed) run's outcome: one JSON object, or a line per task and a summary."""
    from ray_saturn.runtime.records import RunOutcome

    o = RunOutcome.of(result.state, {t: r.state for t, r in result.tasks.items()})
    out = _as_dict(result, o)
    if as_json:
        print(json.dumps(out), file=json_stream())
        return
    for t, r in result.tasks.items():
        print(f"{t:<24} {r.state:<9} {r.steps_done}/{r.total_steps}" + (f"  {r.reason}" if r.reason else ""))
    planned = f" (planned {result.planned_makespan_s:.0f} s)" if result.planned_makespan_s else ""
    print(
        f"run {o.headline}: makespan {result.realised_makespan_s:.0f} s{planned}, "
        f"{result.replans} re-plan(s), {result.moves} move(s)"
        + (f": {out['reason']}" if out["state"] != "finished" and out["reason"] else "")
    )
