"""Release check: `ray-saturn demo` end to end, timed, against the demo's targets.

    PYTHONPATH=. python release/demo_wall_time.py [--runs 2] [--fresh-cache]

Each run is the command a new user types, ``ray-saturn demo --json
--no-progress --out DIR``, in a child process, timed from outside (Python
start-up, imports and Ray's start included). With ``--fresh-cache`` the
first run profiles from scratch (an empty profile store, trainer start-up
probes included); later runs read the store, as a user's second demo does.
For each run it prints the wall time, the planned
and realised makespans, re-plans per task, the strategies chosen, the line
explaining realised against planned, and whether the targets hold:
realised / planned <= 1.3, at most 2 re-plans per task, at least two
distinct strategies, every task finished, the run folder holds plan, events,
checkpoints and the Gantt chart, and a wall time under 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ray_saturn.runtime.journal import EVENTS_FILE, GANTT_FILE, PLAN_FILE, TASKS_DIR


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--fresh-cache", action="store_true", help="start from an empty profile store")
    parser.add_argument("--json", metavar="FILE", help="also write every run's demo JSON here")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.fresh_cache:
        env["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="rs-demo-cache-")
    cli = shutil.which("ray-saturn") or sys.exit("ray-saturn is not on PATH; pip install -e . first")
    ok = True
    out_json = []
    for i in range(args.runs):
        out = Path(tempfile.mkdtemp(prefix="rs-demo-"))
        t0 = time.monotonic()
        proc = subprocess.run([cli, "demo", "--json", "--no-progress", "--out", str(out)], env=env,
                              stdout=subprocess.PIPE, text=True)
        wall = time.monotonic() - t0
        if proc.returncode != 0 or not proc.stdout.strip():
            print(f"run {i + 1}: ray-saturn demo exited {proc.returncode} after {wall:.0f}s", flush=True)
            ok = False
            continue
        d = json.loads(proc.stdout.strip().splitlines()[-1])
        d["outside_wall_s"] = round(wall, 1)
        out_json.append(d)
        run = Path(d["run_dir"])
        files = {name: (run / name).exists() for name in (PLAN_FILE, EVENTS_FILE, GANTT_FILE, TASKS_DIR)}
        finished = all(t["state"] == "finished" for t in d["tasks"])
        ratio = d["realised_makespan_s"] / d["planned_makespan_s"]
        per_task = d["replans"] / len(d["tasks"])
        strategies = sorted({t["strategy"] for t in d["tasks"]})
        checks = {
            "realised/planned <= 1.3": ratio <= 1.3,
            "re-plans <= 2 per task": per_task <= 2,
            ">= 2 strategies": len(strategies) >= 2,
            "all finished": finished,
            "files": all(files.values()),
            "wall < 180 s": wall < 180,
        }
        ok = ok and all(checks.values())
        print(f"run {i + 1}: wall {wall:.0f}s ({d['wall_s']:.0f}s inside the demo); planned "
              f"{d['planned_makespan_s']:.1f}s, realised {d['realised_makespan_s']:.1f}s ({ratio:.3f}x), "
              f"bound {d['lower_bound_s']:.1f}s; baselines "
              + ", ".join(f"{k} {v:.1f}s" for k, v in d["baselines"].items())
              + f"; {d['replans']} re-plans ({per_task:.2f} per task), {d['moves']} moves; strategies "
              f"{', '.join(strategies)}")
        print(f"  {d['explanation']}")
        print(f"  {d['gpus']}")
        print("  " + ", ".join(f"{k}: {'ok' if v else 'NO'}" for k, v in checks.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out_json, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
