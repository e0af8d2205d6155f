"""A lower bound on the mean JCT that any schedule reaches within a makespan, on the Pollux workloads.

An analysis aid for issue 17, not a figure of the product. Issue 17 asks the
online policy for a mean JCT <= 0.9 x the better of the Pollux simulator's
Tiresias and Optimus *and* a makespan <= its Optimus's. This script asks
whether any schedule at all, online or not, can do both: it solves a
time-indexed linear relaxation of the workload of ``online_benchmark.py``
(the same jobs, arrivals and runtimes per GPU count) on the cluster's 64 GPUs
as one pool, with every job's work done by a deadline ``M``, and minimises the
sum of a valid lower bound on each job's completion time.

Why it is a relaxation of every schedule the product (or anyone) can run:
- time is cut into slots; ``x[j, g, t]`` is the fraction of slot ``t`` in
  which job ``j`` runs on ``g`` GPUs. Any real schedule, averaged over each
  slot, satisfies: its GPUs in use average to at most 64 per slot, a job
  runs at most the whole slot (on one count at a time), no job progresses
  before its arrival plus the 30 s set-up every start costs, and each job's
  progress adds up to its whole work (rate 1 / runtime on ``g`` GPUs);
- node packing, restarts after the first start, the GPUs held in set-up and
  the 60 s scheduling interval are all left out: they only add time;
- only each job's GPU counts on the upper concave hull of (GPUs, rate) are
  variables: a count under the hull is a mix of two on it in this model;
- completion: a job whose progress is spread over time with mean ``mu``, at
  a rate never above ``R`` (its fastest count), ends no earlier than
  ``mu + 1 / (2 R)``; ``mu`` is at least the progress-weighted mean of each
  slot's first instant the job may progress in. So ``C_j >= sum_t f_jt s_jt
  + p_j / 2`` with ``p_j`` its fastest runtime, and ``C_j >= r_j + 30 + p_j``.

If the least mean of ``C_j - r_j`` with every job done by ``M`` = Optimus's
makespan is above 0.9 x the better baseline's mean JCT, no schedule meets both
targets of issue 17 on that workload. If it is below, the bound says nothing
about reachability: it is a relaxation, and it knows every arrival in advance.

Usage:
    python release/online_lp_bound.py                      # workloads 1-6
    python release/online_lp_bound.py --workload 4 --slot-s 60
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from online_fluid_model import BASELINES, GPUS, Job, workload  # noqa: E402
from pollux_model import RESTART_S  # noqa: E402


@dataclass(frozen=True)
class Bound:
    deadline_s: float
    mean_jct_lb_s: float | None  # None: no schedule finishes every job by the deadline (in the relaxation)
    status: str
    variables: int
    solve_s: float
    #: per job, (slot start, slot end, mean GPUs in use, fraction of the job's work done in the slot), non-zero slots
    schedule: dict[str, list[tuple[float, float, float, float]]] | None = None


def hull(job: Job) -> list[tuple[int, float]]:
    """(GPUs, rate) on the upper concave hull through (0, 0): the only counts a relaxation needs."""
    pts = sorted((g, 1.0 / d) for g, d in job.runtime_s.items())
    # keep the best rate per count, then only counts faster than every smaller one
    out: list[tuple[int, float]] = []
    for g, r in pts:
        if out and r <= out[-1][1]:
            continue
        out.append((g, r))
    h: list[tuple[float, float]] = [(0, 0.0)]
    for p in out:
        while len(h) >= 2:
            (g1, r1), (g2, r2) = h[-2], h[-1]
            # drop h[-1] when it lies on or under the chord from h[-2] to p
            if (r2 - r1) * (p[0] - g1) <= (p[1] - r1) * (g2 - g1):
                h.pop()
            else:
                break
        h.append(p)
    return [(int(g), r) for g, r in h[1:]]


def slots(horizon_s: float, fine_s: float, fine_until_s: float, coarse_s: float) -> list[tuple[float, float]]:
    """[start, end) slots of ``fine_s`` up to ``fine_until_s``, then of ``coarse_s``, to ``horizon_s``."""
    out, t = [], 0.0
    while t < horizon_s - 1e-9:
        step = fine_s if t < fine_until_s - 1e-9 else coarse_s
        end = min(horizon_s, t + step)
        out.append((t, end))
        t = end
    return out


def bound(jobs: Sequence[Job], deadline_s: float, *, gpus: int = GPUS, fine_s: float = 60.0,
          coarse_s: float = 300.0, setup_s: float = RESTART_S, feasibility_only: bool = False) -> Bound:
    """Least sum of completion-time bounds with every job done by ``deadline_s`` (see the module docstring)."""
    last_arrival = max(j.arrival_s for j in jobs)
    grid = slots(deadline_s, fine_s, last_arrival + 4 * 3600.0, coarse_s)
    n = len(jobs)
    # variables: C_j (0..n-1), then x[j, g, t] for each job's hull counts and the slots it may run in
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    b_ub: list[float] = []
    var_ub: list[float] = []
    eq_rows: list[int] = []
    eq_cols: list[int] = []
    eq_vals: list[float] = []
    index: list[tuple[int, int, int, float]] = []  # x variable -> (job, slot, gpus, work per unit)
    on_slot: list[list[tuple[int, float]]] = [[] for _ in grid]  # slot -> (x variable, gpus)
    on_job: list[list[tuple[int, float]]] = []  # job -> (x variable, its work x the slot's first instant)
    c_lb: list[float] = []
    fastest: list[float] = []
    nvar, r = n, 0
    for ji, j in enumerate(jobs):
        pts = hull(j)
        fastest.append(1.0 / max(rate for _, rate in pts))
        c_lb.append(j.arrival_s + setup_s + fastest[-1])
        ready = j.arrival_s + setup_s
        on_job.append([])
        for ti, (a, e) in enumerate(grid):
            start = max(a, ready)
            if start >= e - 1e-9:
                continue
            avail = (e - start) / (e - a)
            dur = e - a
            for g, rate in pts:  # sum over the counts <= the part of the slot after its set-up
                rows.append(r)
                cols.append(nvar)
                vals.append(1.0)
                var_ub.append(avail)
                on_slot[ti].append((nvar, float(g)))
                eq_rows.append(ji)
                eq_cols.append(nvar)
                eq_vals.append(dur * rate)
                on_job[ji].append((nvar, start * dur * rate))
                index.append((ji, ti, g, dur * rate))
                nvar += 1
            b_ub.append(avail)
            r += 1
    for entries in on_slot:  # GPUs in use <= the cluster's, on average over each slot
        if not entries:
            continue
        for v, g in entries:
            rows.append(r)
            cols.append(v)
            vals.append(g)
        b_ub.append(float(gpus))
        r += 1
    for ji, entries in enumerate(on_job):  # sum_t f_jt s_jt - C_j <= -p_j / 2
        for v, coef in entries:
            rows.append(r)
            cols.append(v)
            vals.append(coef)
        rows.append(r)
        cols.append(ji)
        vals.append(-1.0)
        b_ub.append(-fastest[ji] / 2.0)
        r += 1
    a_ub = coo_matrix((vals, (rows, cols)), shape=(r, nvar)).tocsr()
    a_eq = coo_matrix((eq_vals, (eq_rows, eq_cols)), shape=(n, nvar)).tocsr()
    bounds = [(c_lb[i], None) for i in range(n)] + [(0.0, u) for u in var_ub]
    cost = [0.0 if feasibility_only else 1.0] * n + [0.0] * (nvar - n)
    t0 = time.perf_counter()
    res = linprog(np.array(cost), A_ub=a_ub, b_ub=np.array(b_ub), A_eq=a_eq, b_eq=np.ones(n), bounds=bounds,
                  method="highs")
    solve_s = time.perf_counter() - t0
    if res.status == 2:
        return Bound(deadline_s, None, "infeasible", nvar, solve_s)
    if res.status != 0:
        raise RuntimeError(f"the LP did not solve: {res.message}")
    if feasibility_only:
        return Bound(deadline_s, None, "feasible", nvar, solve_s)
    mean = (res.fun - sum(j.arrival_s for j in jobs)) / n
    use: dict[tuple[int, int], list[float]] = {}
    for (ji, ti, g, work), x in zip(index, res.x[n:], strict=True):
        if x > 1e-7:
            acc = use.setdefault((ji, ti), [0.0, 0.0])
            acc[0] += g * x
            acc[1] += work * x
    schedule: dict[str, list[tuple[float, float, float, float]]] = {j.name: [] for j in jobs}
    for (ji, ti), (g, w) in sorted(use.items()):
        schedule[jobs[ji].name].append((grid[ti][0], grid[ti][1], g, w))
    return Bound(deadline_s, mean, "optimal", nvar, solve_s, schedule)


def least_makespan(jobs: Sequence[Job], lo_s: float, hi_s: float, *, tolerance: float = 0.0025,
                   **kw) -> tuple[float, float]:
    """(infeasible, feasible) deadlines around the least makespan of the relaxation, by bisection
    between ``lo_s`` and ``hi_s`` to ``tolerance`` of ``hi_s``: a lower bound on any schedule's makespan."""
    if bound(jobs, hi_s, feasibility_only=True, **kw).status == "infeasible":
        raise ValueError(f"no schedule ends every job by {hi_s:.0f} s, even in the relaxation")
    while hi_s - lo_s > tolerance * hi_s:
        mid = (lo_s + hi_s) / 2
        if bound(jobs, mid, feasibility_only=True, **kw).status == "infeasible":
            lo_s = mid
        else:
            hi_s = mid
    return lo_s, hi_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=int, action="append", help="1..8 (repeatable; default 1-6)")
    ap.add_argument("--slot-s", type=float, default=60.0, help="slot length up to 4 h after the last arrival")
    ap.add_argument("--coarse-slot-s", type=float, default=300.0, help="slot length after that")
    ap.add_argument("--deadline-scale", type=float, action="append",
                    help="deadlines as multiples of Optimus's makespan (repeatable; default 1.0)")
    ap.add_argument("--least-makespan", action="store_true",
                    help="instead: the relaxation's least makespan (a lower bound for any schedule), by bisection")
    ap.add_argument("--dump", type=Path, help="write each solution's per-job schedule as JSON here")
    args = ap.parse_args(argv)
    dumps = {}
    base = json.loads(BASELINES.read_text())["results"]
    if args.least_makespan:
        print("| workload | least makespan of the relaxation (s) | x Optimus's makespan | solve (s) |")
        print("|---|---|---|---|")
        for k in args.workload or range(1, 7):
            opt = base[str(k)]["optimus"]["makespan_s"]
            t0 = time.perf_counter()
            lo, _hi = least_makespan(workload(k), 0.7 * opt, opt, fine_s=args.slot_s, coarse_s=args.coarse_slot_s)
            print(f"| {k} | >= {lo:,.0f} | >= {lo / opt:.3f} | {time.perf_counter() - t0:.0f} |", flush=True)
        return 0
    print("| workload | deadline (x Optimus's makespan) | mean JCT lower bound (s) | x better Pollux baseline "
          "| target (0.9 x) reachable by the bound | LP variables | solve (s) |")
    print("|---|---|---|---|---|---|---|")
    for k in args.workload or range(1, 7):
        jobs = workload(k)
        b = base[str(k)]
        best = min(b[p]["mean_jct_s"] for p in ("tiresias", "optimus"))
        for scale in args.deadline_scale or [1.0]:
            res = bound(jobs, scale * b["optimus"]["makespan_s"], fine_s=args.slot_s, coarse_s=args.coarse_slot_s)
            if args.dump and res.schedule is not None:
                dumps[f"{k}:{scale}"] = {"apps": {j.name: j.app for j in jobs},
                                         "arrivals": {j.name: j.arrival_s for j in jobs}, "schedule": res.schedule}
                args.dump.write_text(json.dumps(dumps))
            if res.mean_jct_lb_s is None:
                print(f"| {k} | {scale:.3f} | infeasible | - | no | {res.variables:,} | {res.solve_s:.1f} |",
                      flush=True)
                continue
            ok = "not excluded" if res.mean_jct_lb_s <= 0.9 * best else "**no**"
            print(f"| {k} | {scale:.3f} | {res.mean_jct_lb_s:,.0f} | {res.mean_jct_lb_s / best:.3f} | {ok} "
                  f"| {res.variables:,} | {res.solve_s:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
