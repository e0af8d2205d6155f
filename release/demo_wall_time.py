"""Release check: `ray-saturn demo` end to end, timed (needs ray_saturn.profile and ray_saturn.run).

    PYTHONPATH=. python release/demo_wall_time.py [--runs 2]

The first run measures the profile; later runs read it from the profile store
(~/.cache/ray_saturn/demo-profile.parquet), so they show the cost without
profiling. Prints the wall time of each run and checks that every task
finished and that the run folder holds plan.json, events.jsonl, checkpoints
and gantt.png. Target: under 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ray_saturn.demo import run_demo
from ray_saturn.runtime.journal import EVENTS_FILE, GANTT_FILE, PLAN_FILE, TASKS_DIR


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    ok = True
    for i in range(args.runs):
        out = Path(tempfile.mkdtemp(prefix="rs-demo-"))
        result = run_demo(out, steps=args.steps, progress=False)
        run = result.run_dir
        files = {name: (run / name).exists() for name in (PLAN_FILE, EVENTS_FILE, GANTT_FILE, TASKS_DIR)}
        finished = all(t.state == "finished" for t in result.report.tasks)
        ok = ok and finished and all(files.values()) and result.wall_s < 180
        print(f"run {i + 1}: wall {result.wall_s:.0f}s, realised makespan {result.report.realised_makespan_s:.1f}s, "
              f"planned {result.report.planned_makespan_s:.1f}s, bound {result.report.lower_bound_s:.1f}s, "
              f"fifo-whole-node {result.report.baseline_makespan_s:.1f}s, all finished: {finished}, files: {files}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
