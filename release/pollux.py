"""Profile tables built from the Pollux traces (measured step times of six real jobs).

The data lives in ``../shared/benchmarks/pollux`` (Pollux OSDI 2021 artifact,
Apache-2.0); its README says how a runtime follows from it:

- step time of app A at global batch B on placement P (GPUs per node) with g
  GPUs: local batch B / g; interpolate ``placements.csv`` at P over the local
  batch (log-linear); fall back to ``scalability.csv`` (nodes, replicas);
- steps: the ``iteration`` of the last epoch (Pollux's epoch budget) in the
  nearest ``validation-B.csv``;
- a local batch above the largest one measured does not fit (infeasible row).

The traces were measured on 4-GPU nodes. For placements they do not cover
(e.g. 8 GPUs on one node) the step time is modelled as in Pollux: compute
time at the local batch (from the 1-GPU placement) plus a synchronisation
time linear in the replica count, fitted separately for one node and for
several nodes on the measured rows. Rows built that way carry
``source=model`` in an extra column; measured ones ``source=trace``.

A sweep (``--sweep APPS``) is the other shape of workload, a hyper-parameter
search as Ray Tune runs one: one task per (app, batch size in the app's
validation traces) whose local batch fits one GPU, with rows on 1, 2, 4, ...
GPUs of one node (``single`` on 1 GPU, ``ddp`` on more), so every task can run
on any GPU count a Tune trial could be given.

Usage:
    python release/pollux.py --tasks 64 --nodes 4 --gpus-per-node 4 -o profile.csv
    python release/pollux.py --sweep cifar10,deepspeech2,ncf --gpus-per-node 4 -o sweep.csv
"""

from __future__ import annotations

import argparse
import csv
import math
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_ROOT = Path(os.environ.get("POLLUX_DIR", HERE.parent.parent / "shared" / "benchmarks" / "pollux"))
EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
APPS = tuple(EPOCHS)


def _read(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@dataclass
class AppTrace:
    app: str
    placements: dict[str, list[tuple[float, float, float]]]  # placement -> [(local_bsz, step, sync)]
    scalability: dict[tuple[int, int], list[tuple[float, float, float]]]
    validation: dict[int, list[int]]  # global batch -> cumulative iterations per epoch
    max_local_bsz: float
    sync_fit: dict[bool, tuple[float, float]]  # multi-node? -> (alpha, beta) of sync = a + b (r - 2)

    def steps(self, batch: int) -> int:
        nearest = min(self.validation, key=lambda b: (abs(math.log(b / batch)), b))
        its = self.validation[nearest]
        epochs = EPOCHS[self.app]
        return max(1, its[min(epochs, len(its)) - 1])

    def step_time(self, batch: int, per_node: int, nodes: int) -> tuple[float, str] | None:
        g = per_node * nodes
        local = batch / g
        if local > self.max_local_bsz * (1 + 1e-9):
            return None
        placement = str(per_node) * nodes
        if placement in self.placements:
            return _interp(self.placements[placement], local)[0], "trace"
        key = (nodes, g)
        if key in self.scalability:
            return _interp(self.scalability[key], local)[0], "trace"
        compute = _interp(self.placements["1"], local)
        compute_t = compute[0] - compute[1]
        if g == 1:
            return compute[0], "trace"
        a, b = self.sync_fit[nodes > 1]
        return compute_t + max(0.0, a + b * (g - 2)), "model"


def _interp(rows: list[tuple[float, float, float]], local: float) -> tuple[float, float]:
    xs = np.log([r[0] for r in rows])
    x = math.log(max(local, rows[0][0]))
    step = float(np.interp(x, xs, [r[1] for r in rows]))
    sync = float(np.interp(x, xs, [r[2] for r in rows]))
    return step, sync


def _group(rows, key) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(key(r), []).append((float(r["local_bsz"]), float(r["step_time"]), float(r["sync_time"])))
    for v in out.values():
        v.sort()
    return out


@cache
def load_app(app: str, root: Path = DEFAULT_ROOT) -> AppTrace:
    d = root / "traces" / app
    if not d.is_dir():
        raise SystemExit(f"{d}: Pollux traces not found; set POLLUX_DIR to the shared/benchmarks/pollux folder")
    placements = _group(_read(d / "placements.csv"), lambda r: r["placement"])
    scal = _group(_read(d / "scalability.csv"), lambda r: (int(r["num_nodes"]), int(r["num_replicas"])))
    validation = {}
    for f in d.glob("validation-*.csv"):
        validation[int(f.stem.split("-")[1])] = [int(float(r["iteration"])) for r in _read(f)]
    max_local = max(r[0] for rows in placements.values() for r in rows)
    # Fit sync = a + b (replicas - 2) on the measured rows, single-node and multi-node apart.
    fits = {}
    for multi in (False, True):
        xs, ys = [], []
        for p, rows in placements.items():
            r = sum(int(c) for c in p)
            if r < 2 or (len(p) > 1) != multi or len(set(p)) != 1:
                continue
            for _, _, sync in rows:
                xs.append(r - 2)
                ys.append(sync)
        if multi:
            for (_n, r), rows in scal.items():
                for _, _, sync in rows:
                    xs.append(r - 2)
                    ys.append(sync)
        if len(set(xs)) >= 2:
            b, a = np.polyfit(xs, ys, 1)
        else:
            a, b = (float(np.mean(ys)) if ys else 0.0), 0.0
        fits[multi] = (float(a), float(max(b, 0.0)))
    return AppTrace(app, placements, scal, validation, max_local, fits)


def workload_jobs(root: Path = DEFAULT_ROOT) -> list[tuple[str, int, float]]:
    """(app, batch size, arrival time) of every job in workloads/, in file order."""
    jobs = []
    for f in sorted((root / "workloads").glob("workload-*.csv"), key=lambda p: int(p.stem.split("-")[1])):
        for r in _read(f):
            jobs.append((r["application"], int(r["batch_size"]), float(r["time"])))
    return jobs


def gpu_counts(total: int, cap: int = 64) -> list[int]:
    out = []
    g = 1
    while g <= min(total, cap):
        out.append(g)
        g *= 2
    return out


def build_rows(
    num_tasks: int,
    num_nodes: int,
    gpus_per_node: int,
    *,
    workload: int | None = None,
    root: Path = DEFAULT_ROOT,
) -> tuple[list[dict], dict[str, float]]:
    """Profile rows for ``num_tasks`` jobs drawn in order from the Pollux workloads.

    Returns (rows, arrival time per task). ``workload`` picks one file
    (1..8); by default the files are concatenated.
    """
    jobs = workload_jobs(root)
    if workload is not None:
        jobs = _read_workload(root, workload)
    rows: list[dict] = []
    arrivals: dict[str, float] = {}
    total = num_nodes * gpus_per_node
    j = 0
    while len(arrivals) < num_tasks:
        if j >= 10 * len(jobs) + num_tasks:
            raise SystemExit("no Pollux job fits this cluster")
        app, batch, arrival = jobs[j % len(jobs)]
        j += 1
        trace = load_app(app, root)
        if trace.step_time(batch, min(gpus_per_node, 64), max(1, min(num_nodes, 64 // gpus_per_node))) is None:
            continue  # needs more GPUs than the cluster has (a larger local batch would not fit)
        name = f"{app}-{len(arrivals)}"
        arrivals[name] = arrival
        steps = trace.steps(batch)
        for g in gpu_counts(total):
            splits = [k for k in range(1, num_nodes + 1) if g % k == 0 and g // k <= gpus_per_node]
            if not splits:
                continue
            # The packed placement (fewest nodes) and one spread over twice as many nodes.
            for k in [splits[0]] + [k for k in splits if k == 2 * splits[0]]:
                st = trace.step_time(batch, g // k, k)
                row = {"task": name, "strategy": "ddp", "gpus": g, "nodes": k, "steps": steps}
                if st is None:
                    row.update(step_time_s=None, feasible=False, source="oom")
                else:
                    row.update(step_time_s=round(st[0], 6), feasible=True, source=st[1])
                rows.append(row)
    return rows, arrivals


def build_sweep_rows(apps: list[str], gpus_per_node: int, *, root: Path = DEFAULT_ROOT) -> list[dict]:
    """Rows of a sweep (see the module docstring): ``<app>-b<batch>`` per batch size that fits one GPU."""
    rows: list[dict] = []
    for app in apps:
        if app not in EPOCHS:
            raise SystemExit(f"unknown app {app!r}; choose from {', '.join(APPS)}")
        trace = load_app(app, root)
        for batch in sorted(trace.validation):
            if trace.step_time(batch, 1, 1) is None:
                continue  # does not fit one GPU
            steps = trace.steps(batch)
            for g in gpu_counts(gpus_per_node):
                st = trace.step_time(batch, g, 1)
                row = {
                    "task": f"{app}-b{batch}",
                    "strategy": "single" if g == 1 else "ddp",
                    "gpus": g,
                    "nodes": 1,
                    "steps": steps,
                }
                if st is None:
                    row.update(step_time_s=None, feasible=False, source="oom")
                else:
                    row.update(step_time_s=round(st[0], 6), feasible=True, source=st[1])
                rows.append(row)
    if not rows:
        raise SystemExit(f"no batch size of {', '.join(apps)} fits one GPU")
    return rows


def _read_workload(root: Path, k: int) -> list[tuple[str, int, float]]:
    rows = _read(root / "workloads" / f"workload-{k}.csv")
    return [(r["application"], int(r["batch_size"]), float(r["time"])) for r in rows]


def build_profile(num_tasks: int, num_nodes: int, gpus_per_node: int, **kw):
    """A validated :class:`ray_saturn.ProfileTable` (and the arrival times)."""
    from ray_saturn import ProfileTable

    rows, arrivals = build_rows(num_tasks, num_nodes, gpus_per_node, **kw)
    return ProfileTable.from_rows(rows, source=f"pollux-{num_tasks}"), arrivals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--workload", type=int, default=None)
    ap.add_argument(
        "--sweep",
        default=None,
        metavar="APPS",
        help="comma-separated apps: a hyper-parameter sweep on one node (ignores --tasks, --nodes)",
    )
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    if args.sweep:
        from ray_saturn import ProfileTable

        table = ProfileTable.from_rows(
            build_sweep_rows(args.sweep.split(","), args.gpus_per_node), source=f"pollux-sweep-{args.sweep}"
        )
    else:
        table, _ = build_profile(args.tasks, args.nodes, args.gpus_per_node, workload=args.workload)
    table.write(args.output)
    print(f"wrote {args.output}: {table}")


if __name__ == "__main__":
    main()
