"""Online scheduling on the Pollux workloads, next to the Pollux simulator's Tiresias and Optimus.

Each workload (``../shared/benchmarks/pollux/workloads/workload-K.csv``: 160
jobs arriving over 8 hours, each an app, a GPU count asked for and a fixed
global batch size) becomes a profile table plus arrival times. Step times and
step counts follow the Pollux simulator's own job model
(:mod:`pollux_model`), so a job runs as long here as it does there:

- one row per placement the profile contract can express (equal GPUs per
  node: 1-4 GPUs on one node, 3+3, and whole 4-GPU nodes up to 64 GPUs), for
  every GPU count up to the job's batch / smallest per-GPU batch (as the
  Pollux simulator's Optimus allows); a row the traces cannot interpolate is
  left out;
- ``steps``: the job's steps at its own batch size; ``step_time_s``: the
  row's runtime (which, as in Pollux, includes the statistical-efficiency
  change of the batch actually trained on that many GPUs) / steps;
- ``startup_s``: the 30 s the Pollux simulator charges when a job is first
  placed (a move pays the simulator's restart cost, also 30 s); in a profile
  contract without that column it is folded into the step time.

The cluster is the Pollux one: 16 nodes x 4 GPUs. The project's policies run
on ``ray_saturn.sim.simulate`` (no noise: the Pollux simulator has none
either), one workload and policy per command, each result cached as JSON
under ``--out``; ``--table`` prints the markdown table from the cache and the
recorded Pollux-simulator figures (``pollux_baselines.json``, to which
``--record-pollux DIR`` adds that simulator's printed output). Each result
also says where the GPU time went (:class:`Waste`: idle, set-up, and per app
the GPU time beyond the least GPU-seconds of the work), to the last arrival
and over the whole run: a makespan is the least work over the cluster plus
those parts, so the parts say what a policy must save to reach another's.

Usage:
    python release/online_benchmark.py --workload 6 --policy saturn-online
    python release/online_benchmark.py --table
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from pollux_model import DEFAULT_ROOT, GPUS_PER_NODE, RESTART_S, even_placements, load_app  # noqa: E402

NODES = 16
DEFAULT_OUT = HERE / "online-results"
BASELINES = HERE / "pollux_baselines.json"
#: POLICY[:OBJECTIVE] (the objective applies to the saturn policies).
POLICIES = ("saturn-replan:online", "saturn-replan:completion", "saturn-replan:makespan", "optimus-greedy")


def workload_jobs(k: int, root: Path = DEFAULT_ROOT) -> list[dict]:
    path = root / "workloads" / f"workload-{k}.csv"
    if not path.is_file():
        raise SystemExit(f"{path}: no such workload; give --workload 1..8 (POLLUX_DIR: the shared pollux folder)")
    with path.open() as f:
        return [
            {"name": r["name"], "time": float(r["time"]), "app": r["application"],
             "replicas": int(r["num_replicas"]), "batch": int(r["batch_size"])}
            for r in csv.DictReader(f)
        ]


def convert(k: int, root: Path = DEFAULT_ROOT, *, startup_column: bool | None = None) -> tuple[list[dict], dict]:
    """Profile rows and arrival times (task -> seconds) of workload ``k``."""
    if startup_column is None:
        from ray_saturn import profile_table

        startup_column = "startup_s" in getattr(profile_table, "COST_COLUMNS", ())
    rows: list[dict] = []
    arrivals: dict[str, float] = {}
    for job in workload_jobs(k, root):
        app = load_app(job["app"], root)
        batch = job["batch"]
        steps = max(1, round(app.steps(batch)))
        max_gpus = min(NODES * GPUS_PER_NODE, int(batch // app.min_local))
        n_rows = 0
        for placement in even_placements(max_gpus, GPUS_PER_NODE, NODES):
            runtime = app.runtime(batch, placement)
            if runtime is None:
                continue
            row = {"task": job["name"], "strategy": "ddp", "gpus": sum(placement), "nodes": len(placement),
                   "steps": steps, "feasible": True}
            if startup_column:
                row.update(step_time_s=runtime / steps, startup_s=RESTART_S)
            else:
                row.update(step_time_s=(runtime + RESTART_S) / steps)
            rows.append(row)
            n_rows += 1
        if not n_rows:
            raise SystemExit(f"{job['name']}: no placement of it can be interpolated from the traces")
        arrivals[job["name"]] = job["time"]
    return rows, arrivals


@dataclass(frozen=True)
class Waste:
    """Where a run's GPU time went, in seconds of the whole cluster (GPU-seconds / its GPUs).

    ``work_s``: the least GPU-seconds of the work done (each task's progress x its least
    GPU-seconds over its rows); ``idle_s``: GPUs held by no task; ``setup_s``: GPUs held during
    a segment's set-up (launch, restart); ``inefficiency_s``: per app, GPUs held while stepping
    beyond the work's least GPU-seconds (a wide row's lower efficiency, steps lost to a stop).
    Over a whole run they add up to its makespan; any schedule's makespan is the same sum, so
    against another policy the parts say where the difference is."""

    work_s: float
    idle_s: float
    setup_s: float
    inefficiency_s: dict[str, float]

    def to_dict(self) -> dict:
        return {"work_s": round(self.work_s, 1), "idle_s": round(self.idle_s, 1), "setup_s": round(self.setup_s, 1),
                "inefficiency_s": {a: round(v, 1) for a, v in sorted(self.inefficiency_s.items())}}


def waste(tasks, least_area: Mapping[str, float], total_steps: Mapping[str, int], app: Mapping[str, str],
          gpus: int, upto: float) -> Waste:
    """:class:`Waste` of simulated ``tasks`` (:class:`~ray_saturn.sim.TaskRecord`) from 0 to ``upto``;
    a segment's steps are spread evenly over its time after set-up (exact without noise)."""
    held = setup = work = 0.0
    ineff: dict[str, float] = {}
    for t in tasks:
        for s in t.segments:
            end = s.end_s if s.end_s is not None else upto
            a, b = s.start_s, min(end, upto)
            if b <= a:
                continue
            set_up = min(s.setup_s, b - a)
            stepping = b - a - set_up
            span = end - s.start_s - s.setup_s
            steps = (s.steps_end or s.steps_start) - s.steps_start
            done = steps * (stepping / span if span > 0 else 1.0)
            least = done / total_steps[t.task] * least_area[t.task]
            held += s.gpus * (b - a)
            setup += s.gpus * set_up
            work += least
            ineff[app[t.task]] = ineff.get(app[t.task], 0.0) + s.gpus * stepping - least
    return Waste(work / gpus, upto - held / gpus, setup / gpus, {a: v / gpus for a, v in ineff.items()})


def simulate_one(k: int, policy: str, *, solver_time_limit_s: float, root: Path = DEFAULT_ROOT) -> dict:
    from ray_saturn import ClusterSpec, ProfileTable
    from ray_saturn.sim import SimConfig, simulate

    rows, arrivals = convert(k, root)
    profile = ProfileTable.from_rows(rows, source=f"pollux-workload-{k}")
    cluster = ClusterSpec.uniform(NODES, GPUS_PER_NODE)
    name, _, objective = policy.partition(":")
    # With a startup_s column every launch, a move's included, pays it: the restart itself adds nothing.
    restart = 0.0 if "startup_s" in rows[0] else RESTART_S
    cfg = SimConfig(noise=0.0, seed=0, restart_s=restart, arrivals=arrivals,
                    solver_time_limit_s=solver_time_limit_s, deterministic=True,
                    objective=objective or "makespan")
    t0 = time.perf_counter()
    r = simulate(profile, cluster, name, cfg)
    jcts = [t.finish_s - t.arrival_s for t in r.tasks]
    app_of = {j["name"]: j["app"] for j in workload_jobs(k, root)}
    by_app: dict[str, list[float]] = {}
    for t in r.tasks:
        by_app.setdefault(app_of[t.task], []).append(t.finish_s - t.arrival_s)
    least: dict[str, float] = {}
    steps: dict[str, int] = {}
    for row in rows:
        task = row["task"]
        least[task] = min(least.get(task, float("inf")), row["gpus"] * row["steps"] * row["step_time_s"])
        steps[task] = row["steps"]
    gpus = NODES * GPUS_PER_NODE
    last = max(arrivals.values())
    return {
        "workload": k,
        "policy": policy,
        "mean_jct_s": round(sum(jcts) / len(jcts), 1),
        "makespan_s": round(r.makespan_s, 1),
        "moves": r.moves,
        "replans": r.replans,
        "solver_time_s": round(r.solver_time_s, 1),
        "wall_s": round(time.perf_counter() - t0, 1),
        "utilisation": round(r.utilisation, 4),
        "mean_jct_by_app_s": {a: round(sum(v) / len(v), 1) for a, v in sorted(by_app.items())},
        # Where the GPU time went, to the last arrival and over the whole run (see Waste).
        "waste_to_last_arrival": waste(r.tasks, least, steps, app_of, gpus, last).to_dict(),
        "waste": waste(r.tasks, least, steps, app_of, gpus, r.makespan_s).to_dict(),
        "command": f"python release/online_benchmark.py --workload {k} --policy {policy}",
    }


def record_pollux(run_dir: Path, root: Path = DEFAULT_ROOT) -> dict:
    """Pollux-simulator figures from its printed output: ``run_dir/POLICY-workload-K.txt`` holds the
    last lines of ``python simulator.py --policy POLICY workloads/workload-K.csv`` (the completed jobs'
    JCTs, then the average). Makespan = the latest arrival + JCT."""
    out: dict = {"source": "petuum/adaptdl osdi21-artifact simulator/ (commit c793c70)",
                 "command": "python simulator.py --policy {policy} workloads/workload-{k}.csv "
                            "(16 nodes x 4 GPUs, 60 s interval, 30 s restart: its defaults)",
                 "results": {}}
    for f in sorted(run_dir.glob("*-workload-*.txt")):
        policy, _, k = f.stem.partition("-workload-")
        lines = f.read_text().splitlines()
        jcts = next(ast.literal_eval(x) for x in reversed(lines) if x.startswith("{"))
        arrival = {j["name"]: j["time"] for j in workload_jobs(int(k), root)}
        if set(jcts) != set(arrival):
            raise SystemExit(f"{f}: {len(jcts)} of {len(arrival)} jobs completed; the run did not finish")
        out["results"].setdefault(k, {})[policy] = {
            "mean_jct_s": round(sum(jcts.values()) / len(jcts), 1),
            "makespan_s": round(max(arrival[j] + v for j, v in jcts.items()), 1),
        }
    return out


def merged_baselines(recorded: dict, path: Path = BASELINES) -> dict:
    """``recorded`` (from :func:`record_pollux`) over the figures already in ``path``: a run directory
    with only some workloads or policies replaces those and keeps the rest."""
    if not path.is_file():
        return recorded
    old = json.loads(path.read_text())
    results = {k: dict(v) for k, v in old.get("results", {}).items()}
    for k, by_policy in recorded["results"].items():
        results.setdefault(k, {}).update(by_policy)
    return {**recorded, "results": {k: dict(sorted(results[k].items())) for k in sorted(results, key=int)}}


def table(out_dir: Path) -> str:
    base = json.loads(BASELINES.read_text())["results"] if BASELINES.is_file() else {}
    res: dict[str, dict[str, dict]] = {}
    for f in sorted(out_dir.glob("workload-*.json")):
        d = json.loads(f.read_text())
        res.setdefault(str(d["workload"]), {})[d["policy"]] = d
    lines = ["| workload | system / policy | mean JCT (s) | makespan (s) | moves | target |",
             "|---|---|---|---|---|---|"]
    for k in sorted(set(res) | set(base), key=int):
        b = base.get(k, {})
        for name in ("tiresias", "optimus"):
            if name in b:
                lines.append(f"| {k} | Pollux sim, {name.capitalize()} | {b[name]['mean_jct_s']:,.0f} | "
                             f"{b[name]['makespan_s']:,.0f} | | |")
        best_jct = min((b[n]["mean_jct_s"] for n in ("tiresias", "optimus") if n in b), default=None)
        opt_mk = b.get("optimus", {}).get("makespan_s")
        for p, d in res.get(k, {}).items():
            verdict = ""
            if p == "saturn-replan:online" and best_jct is not None and opt_mk is not None:
                ok = d["mean_jct_s"] <= 0.9 * best_jct and d["makespan_s"] <= opt_mk
                verdict = (f"JCT {d['mean_jct_s'] / best_jct:.2f} x best, makespan "
                           f"{d['makespan_s'] / opt_mk:.3f} x Optimus: {'met' if ok else 'NOT met'}")
            lines.append(f"| {k} | `{p}` | {d['mean_jct_s']:,.0f} | {d['makespan_s']:,.0f} | "
                         f"{d['moves']} | {verdict} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=int, action="append", help="1..8 (repeat for several)")
    ap.add_argument("--policy", action="append", help=f"repeatable; default: {', '.join(POLICIES)}")
    ap.add_argument("--solver-time-limit", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--force", action="store_true", help="re-run cached results")
    ap.add_argument("--table", action="store_true", help="print the table from the cached results")
    ap.add_argument("--record-pollux", type=Path, metavar="DIR",
                    help="record the Pollux simulator's saved output in pollux_baselines.json (the figures "
                    "recorded before for other workloads or policies are kept)")
    args = ap.parse_args()
    if args.record_pollux:
        BASELINES.write_text(json.dumps(merged_baselines(record_pollux(args.record_pollux)), indent=1) + "\n")
        print(f"wrote {BASELINES}")
        return 0
    if args.table:
        print(table(args.out))
        return 0
    if not args.workload:
        ap.error("give --workload K (or --table)")
    logging.basicConfig(level=logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    for k in args.workload:
        for p in args.policy or POLICIES:
            path = args.out / f"workload-{k}-{p.replace(':', '-')}.json"
            if path.is_file() and not args.force:
                print(f"cached: {path}")
                continue
            d = simulate_one(k, p, solver_time_limit_s=args.solver_time_limit)
            path.write_text(json.dumps(d, indent=1) + "\n")
            print(json.dumps(d))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
