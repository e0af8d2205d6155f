"""``ray-saturn resume STORAGE``: continue a run whose driver stopped.

Finished tasks are not run again; the others restart from their latest
checkpoint on a fresh plan. A run that already finished prints its result
and starts nothing. A training run started with ``ray-saturn run
WORKLOAD`` reloads its workload file, but only while the file's SHA-256 is
the one recorded when the run started (anyone who can write the run folder
can change the path it records): pass --workload FILE to run a file you
have checked. An emulated run starts a local emulated cluster of the same
shape unless Ray is already connected; it has no workload file, so
--workload is refused there.

A run folder in use by a live run is refused; the lock of a dead one is
taken over (and says whose it was). A missing or damaged state.json falls
back to its backup, else is rebuilt from events.jsonl.
"""

from __future__ import annotations

import argparse

from ray_saturn.cli.args import add_local_gpus_option, local_cluster
from ray_saturn.cli.run import print_result
from ray_saturn.runtime.api import resume


def add_parser(sub) -> None:
    p = sub.add_parser(
        "resume", help="continue a stopped run from its run folder", description=__doc__
    )
    p.add_argument("storage", metavar="STORAGE", help="the run's storage, as given to run: a local path or a URI")
    p.add_argument(
        "--workload",
        metavar="FILE",
        help="the workload file to run (default: the one the run started with, if unchanged)",
    )
    add_local_gpus_option(p, what="continue")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with local_cluster(args.num_gpus):
        result = resume(args.storage, workload=args.workload)
    print_result(result, as_json=args.json)
    return 0 if result.state == "finished" and not result.failed_tasks else 1
