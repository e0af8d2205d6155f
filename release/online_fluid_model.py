"""A fluid model of the online benchmark: what can simple allocation rules buy on the Pollux workloads?

This is an analysis aid, not a figure of the product: no planner, no
controller, no node placement. It replays a workload of
``online_benchmark.py`` (the same jobs, arrivals, and runtimes per GPU count
from the Pollux job model) on the cluster's 64 GPUs as one pool, to ask how
far any rule of three simple families gets towards issue 17's targets (mean
JCT <= 0.9 x the better of the Pollux simulator's Tiresias and Optimus, and
a makespan no later than its Optimus):

- at every arrival and every finish, the rule gives each job present a GPU
  count among those its rows have (0: it waits); a job runs at the rate of
  that count (1 / runtime), and every change of its count (its first start
  included) costs ``RESTART_S`` (the 30 s the Pollux simulator charges)
  before it progresses again;
- ``optimus``: every job its fewest GPUs in arrival order, then one step at
  a time the next larger count to the job whose remaining time falls the
  most per extra GPU (Optimus's marginal gain; the check that this model is
  close to the Pollux simulator's Optimus);
- ``share``: seats by D'Hondt in proportion to ``remaining least
  GPU-seconds ** -beta`` (short jobs more, every job some), each job's count
  capped at its counts of efficiency >= ``e_cap`` (least GPU-seconds /
  GPU-seconds at that count) and rounded down to one of its counts; GPUs
  left over by the marginal gain among counts of efficiency >= ``e_fill``
  (heSRPT in spirit: Berg, Vesilo and Harchol-Balter, SIGMETRICS 2020);
- ``weighted``: Optimus's marginal gain divided by ``remaining least
  GPU-seconds ** beta`` (``cap_h``: jobs above that many hours of the whole
  cluster count as that size), after every job's fewest GPUs in SRPT order.

Printed per workload and rule: mean JCT, makespan, each against the targets.

Usage:
    python release/online_fluid_model.py                    # workloads 1-6, every rule of the table
    python release/online_fluid_model.py --workload 4 --rule share:beta=1.5
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from pollux_model import GPUS_PER_NODE, RESTART_S  # noqa: E402

GPUS = 16 * GPUS_PER_NODE
BASELINES = HERE / "pollux_baselines.json"
#: The rules of the table in release/README.md ("Online scheduling ... a fluid model").
DEFAULT_RULES = ("optimus", "share:beta=1", "share:beta=1,cap_h=2", "weighted:beta=1", "weighted:beta=1.5,cap_h=1")


@dataclass(frozen=True)
class Job:
    name: str
    app: str
    arrival_s: float
    runtime_s: Mapping[int, float]  # GPU count -> seconds to run the whole job on that many GPUs

    @property
    def least_area(self) -> float:
        return min(g * d for g, d in self.runtime_s.items())

    def counts(self, efficiency: float = 0.0) -> list[int]:
        """Its GPU counts whose efficiency (least GPU-seconds / GPU-seconds) is at least ``efficiency``."""
        least = self.least_area
        return sorted(g for g, d in self.runtime_s.items() if least / (g * d) >= efficiency - 1e-12)


@dataclass(frozen=True)
class Result:
    mean_jct_s: float
    makespan_s: float
    changes: int
    utilisation: float
    jct_by_app_s: dict[str, float]


Rule = Callable[[Sequence[Job], Mapping[str, float], int], dict[str, int]]


def workload(k: int) -> list[Job]:
    """Workload ``k`` as ``online_benchmark.py`` converts it (startup_s is charged here as RESTART_S)."""
    from online_benchmark import convert, workload_jobs

    rows, arrivals = convert(k, startup_column=True)
    runtime: dict[str, dict[int, float]] = {}
    for r in rows:
        d = r["step_time_s"] * r["steps"]
        per = runtime.setdefault(r["task"], {})
        per[r["gpus"]] = min(d, per.get(r["gpus"], math.inf))
    app = {j["name"]: j["app"] for j in workload_jobs(k)}
    return [Job(n, app[n], arrivals[n], runtime[n]) for n in sorted(arrivals, key=lambda n: (arrivals[n], n))]


def simulate(jobs: Sequence[Job], rule: Rule, gpus: int = GPUS, restart_s: float = RESTART_S) -> Result:
    """Run ``jobs`` under ``rule`` (see the module docstring)."""
    if not jobs:
        raise ValueError("no jobs to simulate")
    for j in jobs:
        if not j.runtime_s or min(j.runtime_s) > gpus:
            raise ValueError(f"job {j.name}: no GPU count of it fits {gpus} GPUs")
    by_name = {j.name: j for j in jobs}
    pending = sorted(jobs, key=lambda j: (j.arrival_s, j.name))
    rem = {j.name: 1.0 for j in jobs}  # fraction of the job's work left
    alloc = {j.name: 0 for j in jobs}
    hold = {j.name: 0.0 for j in jobs}  # restart time left before it progresses
    finish: dict[str, float] = {}
    active: list[str] = []
    t, i, changes, busy = 0.0, 0, 0, 0.0
    while len(finish) < len(jobs):
        next_arrival = pending[i].arrival_s if i < len(pending) else math.inf
        next_finish = min((t + hold[n] + rem[n] * by_name[n].runtime_s[alloc[n]] for n in active if alloc[n]),
                          default=math.inf)
        t_next = min(next_arrival, next_finish)
        if math.isinf(t_next):
            raise RuntimeError(f"the rule left every job waiting at {t:.0f} s")
        dt = t_next - t
        for n in active:
            if alloc[n]:
                busy += alloc[n] * dt
                h = min(hold[n], dt)
                hold[n] -= h
                rem[n] -= (dt - h) / by_name[n].runtime_s[alloc[n]]
        t = t_next
        for n in [n for n in active if rem[n] <= 1e-9]:
            finish[n] = t
            active.remove(n)
            alloc[n] = 0
        while i < len(pending) and pending[i].arrival_s <= t + 1e-9:
            active.append(pending[i].name)
            i += 1
        if not active:
            continue
        new = rule([by_name[n] for n in active], rem, gpus)
        if sum(new.values()) > gpus:
            raise RuntimeError(f"the rule gave {sum(new.values())} GPUs of {gpus}")
        for n in active:
            g = new.get(n, 0)
            if g and g not in by_name[n].runtime_s:
                raise RuntimeError(f"the rule gave {n} {g} GPUs, which it has no row for")
            if g != alloc[n]:
                if g:
                    hold[n] = restart_s
                changes += 1
                alloc[n] = g
    jct = {j.name: finish[j.name] - j.arrival_s for j in jobs}
    apps: dict[str, list[float]] = {}
    for j in jobs:
        apps.setdefault(j.app, []).append(jct[j.name])
    makespan = max(finish.values())
    return Result(sum(jct.values()) / len(jct), makespan, changes, busy / (gpus * makespan),
                  {a: sum(v) / len(v) for a, v in sorted(apps.items())})


# ----------------------------------------------------------------------------------- rules
def _fill(jobs: Sequence[Job], rem: Mapping[str, float], new: dict[str, int], free: int,
          counts: Callable[[Job], list[int]], weight: Callable[[Job], float]) -> None:
    """GPUs left over, one step at a time to the job whose remaining time falls most per extra GPU
    (divided by ``weight``), among the larger counts ``counts`` gives it."""
    while free > 0:
        best = None
        for j in jobs:
            g = new.get(j.name, 0)
            if not g:
                continue
            step = next((c for c in counts(j) if c > g), None)
            if step is None or step - g > free:
                continue
            gain = rem[j.name] * (j.runtime_s[g] - j.runtime_s[step]) / (step - g) / weight(j)
            if best is None or gain > best[0]:
                best = (gain, j.name, step)
        if best is None or best[0] <= 0:
            return
        _, n, step = best
        free -= step - new[n]
        new[n] = step


def _fewest_first(jobs: Sequence[Job], gpus: int) -> tuple[dict[str, int], int]:
    new, free = {}, gpus
    for j in jobs:
        g = min(j.runtime_s)
        if g <= free:
            new[j.name], free = g, free - g
    return new, free


def optimus() -> Rule:
    def rule(jobs, rem, gpus):
        new, free = _fewest_first(sorted(jobs, key=lambda j: (j.arrival_s, j.name)), gpus)
        _fill(jobs, rem, new, free, lambda j: j.counts(), lambda j: 1.0)
        return new

    return rule


def _size(j: Job, rem: Mapping[str, float], gpus: int, cap_h: float | None) -> float:
    size = rem[j.name] * j.least_area
    return size if cap_h is None else min(size, gpus * cap_h * 3600.0)


def share(beta: float = 1.0, e_cap: float = 0.8, e_fill: float = 0.8, cap_h: float | None = None) -> Rule:
    def rule(jobs, rem, gpus):
        size = {j.name: _size(j, rem, gpus, cap_h) for j in jobs}
        cap = {j.name: max(j.counts(e_cap)) for j in jobs}
        seats = dict.fromkeys(size, 0)
        heap = [(-(size[n] ** -beta), n) for n in size]
        heapq.heapify(heap)
        left = gpus
        while left and heap:
            _, n = heapq.heappop(heap)
            if seats[n] >= cap[n]:
                continue
            seats[n] += 1
            left -= 1
            heapq.heappush(heap, (-(size[n] ** -beta) / (seats[n] + 1), n))
        new, free = {}, gpus
        for j in sorted(jobs, key=lambda j: (size[j.name], j.arrival_s, j.name)):
            fits = [c for c in j.counts() if c <= min(seats[j.name], free)]
            if fits:
                new[j.name] = max(fits)
                free -= new[j.name]
        _fill(jobs, rem, new, free, lambda j: j.counts(e_fill), lambda j: size[j.name] ** beta)
        return new

    return rule


def weighted(beta: float = 1.0, cap_h: float | None = None) -> Rule:
    def rule(jobs, rem, gpus):
        size = {j.name: _size(j, rem, gpus, cap_h) for j in jobs}
        new, free = _fewest_first(sorted(jobs, key=lambda j: (size[j.name], j.arrival_s, j.name)), gpus)
        _fill(jobs, rem, new, free, lambda j: j.counts(), lambda j: size[j.name] ** beta)
        return new

    return rule


RULES: dict[str, Callable[..., Rule]] = {"optimus": optimus, "share": share, "weighted": weighted}


def parse_rule(spec: str) -> Rule:
    """``NAME[:key=value,...]``, e.g. ``share:beta=1.5,cap_h=2``; a one-line error otherwise."""
    name, _, params = spec.partition(":")
    if name not in RULES:
        raise SystemExit(f"unknown rule {name!r}; choose one of: {', '.join(RULES)}")
    kw: dict[str, float] = {}
    for part in filter(None, params.split(",")):
        key, eq, value = part.partition("=")
        try:
            kw[key.strip()] = float(value)
        except ValueError:
            raise SystemExit(f"rule {spec!r}: {part!r} is not key=number") from None
        if not eq:
            raise SystemExit(f"rule {spec!r}: {part!r} is not key=number")
    try:
        return RULES[name](**kw)
    except TypeError as exc:
        raise SystemExit(f"rule {spec!r}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=int, action="append", help="1..8 (repeatable; default 1-6)")
    ap.add_argument("--rule", action="append", help=f"repeatable; default: {' '.join(DEFAULT_RULES)}")
    args = ap.parse_args(argv)
    base = json.loads(BASELINES.read_text())["results"] if BASELINES.is_file() else {}
    rules = [(spec, parse_rule(spec)) for spec in args.rule or DEFAULT_RULES]
    print("| workload | rule | mean JCT (s) | x better Pollux baseline | makespan (s) | x Pollux Optimus | both met |")
    print("|---|---|---|---|---|---|---|")
    for k in args.workload or range(1, 7):
        jobs = workload(k)
        b = base.get(str(k), {})
        best = min((b[p]["mean_jct_s"] for p in ("tiresias", "optimus") if p in b), default=None)
        opt = b.get("optimus", {}).get("makespan_s")
        for spec, rule in rules:
            r = simulate(jobs, rule)
            jr = f"{r.mean_jct_s / best:.2f}" if best else "-"
            mr = f"{r.makespan_s / opt:.3f}" if opt else "-"
            met = "yes" if best and opt and r.mean_jct_s <= 0.9 * best and r.makespan_s <= opt else "no"
            print(f"| {k} | `{spec}` | {r.mean_jct_s:,.0f} | {jr} | {r.makespan_s:,.0f} | {mr} | {met} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
