"""The fast plan: allotment sweep + list scheduling + critical-task repair.

This is two-phase scheduling of moldable tasks (allot, then pack), the
classic approach of Turek, Wolf and Yu (SPAA 1992):

1. Allotments. Each candidate picks one option per task:
   - for each weight ``mu`` on a grid, the option minimising
     ``area + mu x duration`` (``mu = 0``: least GPU-seconds; large ``mu``:
     fastest), the Lagrangian trade-off between the LP's two constraints;
   - for each target ``T`` near the lower bound, the least-area option that
     finishes within ``T``;
   - the LP's fractional mix, rounded to its heaviest option.
2. Packing. Each allotment is list-scheduled under a few priority rules
   (longest first, largest area first, widest first).
3. Repair. While time remains, the task that ends last is moved to each of
   its other options (and the order re-derived); improvements are kept.

It is deterministic for a given seed and returns the best schedule found.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ray_saturn.solver.bounds import LowerBound
from ray_saturn.solver.listsched import list_schedule
from ray_saturn.solver.problem import Problem, Schedule

__all__ = ["HeuristicResult", "heuristic_schedule"]

_MUS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 1e12)
_TARGETS = (1.0, 1.02, 1.05, 1.1, 1.2, 1.35, 1.5)


@dataclass
class HeuristicResult:
    schedule: Schedule
    choice: list[int]
    order: list[int]
    evaluated: int


def _pinned(problem: Problem) -> list[int | None]:
    out: list[int | None] = []
    for opts in problem.options:
        p = [i for i, o in enumerate(opts) if o.pinned]
        out.append(p[0] if p else None)
    return out


def _allotments(problem: Problem, bound: LowerBound) -> list[list[int]]:
    pinned = _pinned(problem)
    seen: set[tuple[int, ...]] = set()
    out: list[list[int]] = []

    def add(choice: list[int]) -> None:
        key = tuple(choice)
        if key not in seen:
            seen.add(key)
            out.append(choice)

    def pick(t: int, key) -> int:
        if pinned[t] is not None:
            return pinned[t]  # type: ignore[return-value]
        opts = problem.options[t]
        return min(range(len(opts)), key=lambda i: key(opts[i]))

    n = problem.num_tasks
    if bound.lp_mix is not None:
        add([pick(t, lambda o, t=t: 0) if pinned[t] is not None else int(np.argmax(bound.lp_mix[t])) for t in range(n)])
    for target in _TARGETS:
        T = bound.value * target
        add([pick(t, lambda o, t=t: (o.duration_s + float(problem.release[t]) > T, o.area, o.duration_s)) for t in range(n)])
    for mu in _MUS:
        add([pick(t, lambda o: (o.area + mu * o.duration_s, o.duration_s)) for t in range(n)])
    return out


def _orders(problem: Problem, choice: list[int]) -> list[list[int]]:
    opts = [problem.options[t][c] for t, c in enumerate(choice)]
    idx = range(problem.num_tasks)
    rel = problem.release
    return [
        sorted(idx, key=lambda t: (rel[t], -opts[t].duration_s, t)),
        sorted(idx, key=lambda t: (rel[t], -opts[t].area, t)),
        sorted(idx, key=lambda t: (rel[t], -opts[t].per_node * opts[t].k, -opts[t].duration_s, t)),
    ]


def heuristic_schedule(
    problem: Problem,
    bound: LowerBound,
    *,
    time_limit_s: float = 1.0,
    seed: int = 0,
    on_schedule: Callable[[Schedule], None] | None = None,
) -> HeuristicResult:
    """Best schedule from the allotment sweep, then repair until ``time_limit_s``."""
    t0 = time.perf_counter()
    deadline = t0 + max(0.0, time_limit_s)
    rng = random.Random(seed)
    best: HeuristicResult | None = None
    evaluated = 0

    def consider(choice: list[int], order: list[int]) -> bool:
        nonlocal best, evaluated
        sched = list_schedule(problem, choice, order)
        evaluated += 1
        if best is None or sched.makespan < best.schedule.makespan - 1e-9:
            best = HeuristicResult(sched, list(choice), list(order), evaluated)
            if on_schedule:
                on_schedule(sched)
            return True
        return False

    for i, choice in enumerate(_allotments(problem, bound)):
        for order in _orders(problem, choice):
            consider(choice, order)
        # Always finish the first allotment; then respect the deadline.
        if i and time.perf_counter() > deadline:
            break
    assert best is not None
    pinned = _pinned(problem)
    # Repair the tail: move late tasks to other options.
    stale = 0
    while time.perf_counter() < deadline and stale < 3 * problem.num_tasks + 10:
        sched = best.schedule
        ends = [s + d for s, d in zip(sched.start, sched.durations)]
        late = sorted(range(problem.num_tasks), key=lambda t: -ends[t])[: max(1, min(8, problem.num_tasks))]
        t = late[rng.randrange(len(late))] if stale else late[0]
        improved = False
        if pinned[t] is None:
            for o in range(len(problem.options[t])):
                if o == best.choice[t]:
                    continue
                choice = list(best.choice)
                choice[t] = o
                for order in _orders(problem, choice):
                    improved |= consider(choice, order)
                if time.perf_counter() > deadline:
                    break
        # Also try moving a random other task to shrink the area in front of the tail.
        if not improved and problem.num_tasks > 1:
            u = rng.randrange(problem.num_tasks)
            if pinned[u] is None and len(problem.options[u]) > 1:
                choice = list(best.choice)
                choice[u] = rng.randrange(len(problem.options[u]))
                for order in _orders(problem, choice):
                    improved |= consider(choice, order)
        stale = 0 if improved else stale + 1
        if best.schedule.makespan <= bound.value * (1 + 1e-9):
            break
    best.evaluated = evaluated
    return best
