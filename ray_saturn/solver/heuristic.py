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
3. Improvement. While time remains, a local search over (option per task,
   priority order) decoded by serial schedule generation
   (:func:`~ray_saturn.solver.listsched.serial_schedule`): moves re-prioritise
   or re-allot tasks that end late, accepted by simulated annealing on
   (makespan, sum of squared ends); when no task has a release time or a
   pinned start, forward-backward improvement (Valls et al., EJOR 2005:
   "justification") re-packs the best schedule from both ends.

It is deterministic for a given seed and time budget, and returns the best
schedule found.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ray_saturn.solver.bounds import LowerBound
from ray_saturn.solver.listsched import list_schedule, serial_schedule
from ray_saturn.solver.problem import Problem, Schedule

__all__ = ["HeuristicResult", "heuristic_schedule"]

_MUS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 1e12)
_TARGETS = (1.0, 1.02, 1.05, 1.1, 1.2, 1.35, 1.5)
#: Decodings without improvement after which a local search gives up.
STALL = 4000


@dataclass
class HeuristicResult:
    schedule: Schedule
    choice: list[int]
    order: list[int]
    evaluated: int


def _pinned(problem: Problem) -> list[int | None]:
    return [problem.pinned_option(t) for t in range(problem.num_tasks)]


def _allotments(problem: Problem, bound: LowerBound) -> list[list[int]]:
    pinned = _pinned(problem)
    seen: set[tuple[int, ...]] = set()
    out: list[list[int]] = []

    def add(choice: list[int]) -> None:
        key = tuple(choice)
        if key not in seen:
            seen.add(key)
            out.append(choice)

    if bound.lp_mix is not None:
        add([p if p is not None else int(np.argmax(bound.lp_mix[t])) for t, p in enumerate(pinned)])
    for target in _TARGETS:
        T = bound.value * target
        add(problem.choose(lambda t, o, T=T: (o.duration_s + float(problem.release[t]) > T, o.area, o.duration_s)))
    for mu in _MUS:
        add(problem.choose(lambda t, o, mu=mu: (o.area + mu * o.duration_s, o.duration_s)))
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
    max_evaluations: int | None = None,
    candidates: Sequence[Schedule] = (),
    gap: float = 0.0,
) -> HeuristicResult:
    """Best schedule from the allotment sweep, then local search until ``time_limit_s``, or until
    a schedule is within ``gap`` (a fraction) of the lower bound.

    The local search also stops after ``max_evaluations`` decodings (when
    given: then the result depends only on the seed, not on the machine's
    speed) or after :data:`STALL` decodings without improvement. ``candidates``
    (e.g. the baselines' schedules) are kept if they beat everything found, so
    the result is never worse than any of them.
    """
    t0 = time.perf_counter()
    deadline = t0 + max(0.0, time_limit_s)
    target = bound.value * (1 + max(gap, 1e-9))
    rng = random.Random(seed)
    best: HeuristicResult | None = None
    evaluated = 0

    last_serial: list[Schedule] = []

    def consider(choice: list[int], order: list[int]) -> bool:
        nonlocal best, evaluated
        sched = list_schedule(problem, choice, order)
        evaluated += 1
        serial = serial_schedule(problem, choice, order)
        last_serial[:] = [serial]
        evaluated += 1
        if serial.makespan < sched.makespan:
            sched = serial
        if best is None or sched.makespan < best.schedule.makespan - 1e-9:
            best = HeuristicResult(sched, list(choice), list(order), evaluated)
            if on_schedule:
                on_schedule(sched)
            return True
        return False

    for cand in candidates:
        if best is None or cand.makespan < best.schedule.makespan - 1e-9:
            order = sorted(range(problem.num_tasks), key=lambda t: (cand.start[t], t))
            best = HeuristicResult(cand, list(cand.option), order, 0)
            if on_schedule:
                on_schedule(cand)
    lp_start: HeuristicResult | None = None
    for i, choice in enumerate(_allotments(problem, bound)):
        if gap > 0 and best is not None and best.schedule.makespan <= target:
            break  # good enough: the caller asked for no more than ``gap`` over the bound
        for order in _orders(problem, choice):
            consider(choice, order)
            if i == 0 and bound.lp_mix is not None:
                sched = last_serial[0]  # the serial decoding consider() just made
                if lp_start is None or sched.makespan < lp_start.schedule.makespan:
                    lp_start = HeuristicResult(sched, list(choice), list(order), 0)
        # Always finish the first allotment; then respect the deadline (in deterministic mode, the
        # evaluation budget: the wall clock must not decide what is tried).
        if i and (evaluated >= max_evaluations if max_evaluations is not None else time.perf_counter() > deadline):
            break
    assert best is not None
    # Local search from two starts: the least-area allotment the LP suggests
    # (its tail is usually a few re-allotments away from the bound) and the
    # best schedule of the sweep. Each gets half of the remaining time.
    starts = [s for s in (lp_start, best) if s is not None]
    for i, start in enumerate(starts):
        now = time.perf_counter()
        if (max_evaluations is None and now >= deadline) or best.schedule.makespan <= target:
            break
        # With an evaluation budget the deadline is only a safety net, shared rather than sliced.
        slice_end = deadline if max_evaluations is not None else now + (deadline - now) / (len(starts) - i)
        budget = None if max_evaluations is None else max(1, (max_evaluations - evaluated) // (len(starts) - i))
        found = _local_search(problem, target, start, slice_end, rng, None, budget)
        evaluated += found.evaluated
        if found.schedule.makespan < best.schedule.makespan - 1e-9:
            best = found
            if on_schedule:
                on_schedule(best.schedule)
    best.evaluated = evaluated
    return best


def _key(s: Schedule) -> tuple[float, float]:
    ends = [a + d for a, d in zip(s.start, s.durations, strict=False)]
    m = max(ends)
    return (round(m, 9), sum((e / m) ** 2 for e in ends))


def _justify(problem: Problem, sched: Schedule) -> Schedule:
    """Forward-backward improvement: right-justify in reverse end order, then left-justify.

    Only valid without release times, blocked nodes and pinned tasks (the
    mirrored problem must be the same problem).
    """
    n = problem.num_tasks
    ends = [a + d for a, d in zip(sched.start, sched.durations, strict=False)]
    back_order = sorted(range(n), key=lambda t: (-ends[t], t))
    mirrored = serial_schedule(problem, sched.option, back_order)
    m = mirrored.makespan
    starts_fwd = [m - (mirrored.start[t] + mirrored.durations[t]) for t in range(n)]
    fwd_order = sorted(range(n), key=lambda t: (starts_fwd[t], t))
    return serial_schedule(problem, sched.option, fwd_order), fwd_order  # type: ignore[return-value]


def _local_search(problem, target, start: HeuristicResult, deadline, rng, on_schedule, budget=None) -> HeuristicResult:
    """Simulated annealing over (allotment, order) from ``start`` until ``deadline``, ``budget``
    decodings, a stall, or a makespan <= ``target`` (s)."""
    n = problem.num_tasks
    pinned = _pinned(problem)
    movable = [t for t in range(n) if pinned[t] is None]
    can_justify = not problem.release.any() and not problem.node_avail.any() and len(movable) == n
    choice, order = list(start.choice), list(start.order)
    cur = serial_schedule(problem, choice, order)
    if start.schedule.makespan < cur.makespan:
        cur = start.schedule  # keep the better decoding as the incumbent schedule
    best = HeuristicResult(cur, list(choice), list(order), 0)
    best_key = cur_key = _key(cur)
    evaluated = 1
    temp0 = 0.002
    t_begin = time.perf_counter()
    span = max(1e-3, deadline - t_begin)
    since_best = 0
    while time.perf_counter() < deadline and since_best < STALL:
        if not movable or (budget is not None and evaluated >= budget):
            break
        if can_justify and since_best and since_best % 50 == 0:
            just, jorder = _justify(problem, best.schedule)
            evaluated += 2
            k = _key(just)
            if k < best_key:
                best_key = cur_key = k
                choice, order, cur = list(best.choice), jorder, just
                best = HeuristicResult(just, list(choice), list(order), 0)
                since_best = 0
                if on_schedule:
                    on_schedule(just)
                continue
        ends = [a + d for a, d in zip(cur.start, cur.durations, strict=False)]
        m = max(ends)
        late = [t for t in movable if ends[t] >= m * 0.97]
        new_choice, new_order = choice, order
        r = rng.random()
        t = rng.choice(late) if late and r < 0.7 else rng.choice(movable)
        if r < 0.35 or len(problem.options[t]) == 1:
            # Re-prioritise: move t earlier in the order.
            pos = order.index(t)
            if pos == 0:
                since_best += 1  # a proposal that changes nothing is one without improvement
                continue
            new_order = list(order)
            new_order.pop(pos)
            new_order.insert(rng.randrange(pos), t)
        elif r < 0.85:
            new_choice = list(choice)
            opts = problem.options[t]
            new_choice[t] = rng.choice([o for o in range(len(opts)) if o != choice[t]])
        else:
            i, j = rng.randrange(n), rng.randrange(n)
            if i == j:
                since_best += 1
                continue
            new_order = list(order)
            new_order[i], new_order[j] = new_order[j], new_order[i]
        cand = serial_schedule(problem, new_choice, new_order)
        evaluated += 1
        k = _key(cand)
        frac = min(1.0, evaluated / budget) if budget else min(1.0, (time.perf_counter() - t_begin) / span)
        temp = temp0 * (1 - frac) + 1e-6
        delta = (k[0] - cur_key[0]) / max(cur_key[0], 1e-9)
        if delta <= 0:
            accept = k <= cur_key or rng.random() < 0.1  # same makespan: sometimes drift on the plateau
        else:
            accept = delta < 0.05 and rng.random() < math.exp(-delta / temp)
        if accept:
            choice, order, cur, cur_key = new_choice, new_order, cand, k
            if k < best_key:
                best_key = k
                improved = k[0] < best.schedule.makespan - 1e-9
                best = HeuristicResult(cand, list(choice), list(order), 0)
                since_best = 0
                if improved and on_schedule:
                    on_schedule(cand)
                if k[0] <= target:
                    break
                continue
        since_best += 1
        if since_best % 400 == 0:
            # Restart from the best.
            choice, order, cur, cur_key = list(best.choice), list(best.order), best.schedule, best_key
    best.evaluated = evaluated
    return best
