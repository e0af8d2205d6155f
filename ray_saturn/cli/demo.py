"""``ray-saturn demo``: a real model-selection workload end to end on an embedded local Ray.

Profiles, plans, trains (with re-planning, TorchTrainer segments) and reports
two wide GPT models that need sharding under the demo's memory budget and two
small CNNs; on a machine without a GPU it uses one logical GPU per CPU core
(at most 4) and says so. Writes the run folder under --out. With --json, the
one JSON object (planned and realised makespans, lower bound, baselines,
re-plans, moves, tasks) goes to stdout and everything else to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

from ray_saturn.cli.args import count, json_stream, output_folder, positive
from ray_saturn.limits import MAX_GPUS_PER_NODE


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="run a small model-selection workload end to end", description=__doc__)
    p.add_argument("--gpus", type=count("--gpus", high=MAX_GPUS_PER_NODE),
                   help="(logical) GPUs of the embedded Ray (default: up to 4, one per core)")
    p.add_argument("--scale", type=positive("--scale", "factor"), default=1.0,
                   help="multiply every task's steps (1)")
    p.add_argument("--out", type=output_folder("--out"), metavar="DIR",
                   help="output folder (default: a new temporary folder)")
    p.add_argument("--no-progress", action="store_true", help="no live progress bars")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object (the rest to stderr)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ray_saturn.demo import run_demo

    out = args.out or tempfile.mkdtemp(prefix="ray-saturn-demo-")
    console = Console(file=sys.stderr) if args.json else None
    result = run_demo(out, gpus=args.gpus, scale=args.scale, progress=not args.no_progress, console=console)
    if args.json:
        print(json.dumps(result.to_json()), file=json_stream())
    failed = [t.task for t in result.report.tasks if t.state != "finished"]
    return 1 if failed else 0
