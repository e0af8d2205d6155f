"""``ray-saturn demo``: a real model-selection workload end to end on an embedded local Ray.

Profiles, plans, trains (with re-planning) and reports 4 tiny GPT models and
2 CNNs; on a machine without a GPU it uses logical GPUs on the CPU and says
so. Writes the run folder under --out.
"""

from __future__ import annotations

import argparse
import json
import tempfile


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="run a small model-selection workload end to end", description=__doc__)
    p.add_argument("--gpus", type=int, default=4, help="(logical) GPUs of the embedded Ray (4)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps per task (200)")
    p.add_argument("--out", metavar="DIR", help="output folder (default: a new temporary folder)")
    p.add_argument("--no-progress", action="store_true", help="no live progress bars")
    p.add_argument("--json", action="store_true", help="also print the report as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ray_saturn.demo import run_demo

    out = args.out or tempfile.mkdtemp(prefix="ray-saturn-demo-")
    result = run_demo(out, gpus=args.gpus, steps=args.steps, progress=not args.no_progress)
    if args.json:
        print(json.dumps({**result.report.to_dict(), "wall_s": round(result.wall_s, 1)}))
    failed = [t.task for t in result.report.tasks if t.state != "finished"]
    return 1 if failed else 0
