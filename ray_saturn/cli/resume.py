"""``ray-saturn resume RUN_DIR``: continue a run whose driver stopped.

Finished tasks are not run again; the others restart from their latest
checkpoint on a fresh plan. A training run started with ``ray-saturn run
WORKLOAD`` reloads its workload file; an emulated run starts a local
emulated cluster of the same shape unless Ray is already connected.
"""

from __future__ import annotations

import argparse
import json

from ray_saturn.runtime.api import resume


def add_parser(sub) -> None:
    p = sub.add_parser(
        "resume", help="continue a stopped run from its run folder", description=__doc__
    )
    p.add_argument("run_dir", help="the run folder (local path or URI)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = resume(args.run_dir)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        for t, r in result.tasks.items():
            print(
                f"{t:<24} {r.state:<9} {r.steps_done}/{r.total_steps}"
                + (f"  {r.reason}" if r.reason else "")
            )
        print(
            f"run {result.state}: makespan {result.realised_makespan_s:.0f} s, "
            f"{result.replans} re-plan(s), {result.moves} move(s)"
        )
    return 0 if result.state == "finished" and not result.failed_tasks else 1
