"""Plans for completion time: SRPT-like priorities with elastic, efficiency-bounded allotments.

What theory says works for mean completion time:

- one machine, known sizes: shortest remaining processing time first (SRPT)
  is optimal (Schrage 1968), and weighted shortest processing time (Smith's
  rule, ``p_t / w_t``) without release times;
- parallel jobs with a concave speed-up: heSRPT (Berg, Vesilo and
  Harchol-Balter, SIGMETRICS 2020) runs the shortest jobs first *and* gives
  them more servers, but never more than their speed-up repays: a job's share
  shrinks as its efficiency falls.

:func:`completion_search` builds plans in that spirit and keeps the best for
the objective (:mod:`ray_saturn.solver.objective`):

1. Priority: tasks sorted by remaining work per weight, SRPT on GPU-area
   (``min_o g_o d_o / w_t``) or on time (``min_o d_o / w_t``).
2. Allotment, heSRPT-like: each task in turn, at its earliest feasible start
   (serial schedule generation), takes the option that finishes first among
   those whose efficiency ``min area / area`` is at least ``e``; ``e`` is
   swept from 1 (least GPU-seconds only) to 0 (fastest), so short jobs grab
   wide allotments only while the speed-up pays and wait for more GPUs only
   when that ends them sooner.
3. Running tasks: either kept where they run (every candidate has a version
   that keeps them) or taken in priority order like any other task, which
   moves, shrinks or grows one (paying its restart set-up) or stops it for a
   shorter one (SRPT preemption). The controller only accepts such a plan
   when its objective beats keeping them by more than the restart costs.
4. ``online``: among the candidates whose makespan is within the slack of
   the best makespan known (the candidates', and the makespan plan given by
   the caller), the least weighted completion; ``completion`` ignores the
   makespan; critical-first orders (the longest tasks ahead of SRPT) are
   added so that a long job arriving late is not starved.
5. ``online`` while jobs arrive: a background task (almost every arrival is
   smaller and passes it, and the cluster cannot clear it within
   :data:`~ray_saturn.solver.objective.BACKGROUND_HORIZON_S`) fills what is
   left: the widest option of efficiency >= :data:`FILL_EFFICIENCY` (and at
   most :data:`FILL_SPAN` x its fastest run) among those that start first,
   rather than waiting for a wide row that the next arrivals would take
   again; its completion counts
   :data:`~ray_saturn.solver.objective.BACKGROUND_WEIGHT` of its weight, so
   a short arrival may shrink or pause it.
6. ``online`` without an arrival price (the guard on), and ``completion``: each
   reference plan's GPU counts decoded in the priority orders, and (``online``)
   the large tasks (each >= :data:`LARGE_SHARE` of the least GPU-seconds) held
   at a reference's GPU counts while the others are planned as in 2-3: the
   makespan plan's allotments for the tasks that set the makespan, completion
   time for the rest. These are made within :data:`EXTRA_WORK` task placements
   and the time limit.
7. Improvement: adjacent swaps in the priority order, kept when they lower
   the objective, while the evaluation budget lasts.

The time limit stops each phase (the sweep of 1-5 too, once it has one
candidate; it goes rule by rule across the orders and modes, so a cut sweep
has tried each). Otherwise the budgets of decodings decide, so a caller that
wants the same plan on any machine (``SaturnPolicy(deterministic=True)``)
gives a limit that only a far slower machine would reach.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ray_saturn.errors import InfeasibleError
from ray_saturn.solver.listsched import _first_k_fit, _FreshNodes, _Profiles, list_schedule, serial_schedule
from ray_saturn.solver.objective import BACKGROUND_WEIGHT, ONLINE_SLACK, is_background, weighted_completion
from ray_saturn.solver.problem import Problem, Schedule

__all__ = ["CompletionResult", "completion_schedule", "completion_search", "objective_value"]

_EFFICIENCIES = (1.0, 0.75, 0.5, 0.0)
#: GPU caps as multiples of the fair share G / m (m tasks to plan); None: no cap.
_SHARES = (1.0, 2.0, 4.0, None)
#: ``online`` while jobs arrive: a background task (see :func:`background_tasks`) takes, among its
#: options with at least this efficiency (least area / area) ...
FILL_EFFICIENCY = 0.84
#: ... and at most this many times its shortest duration, the widest of those that start first.
FILL_SPAN = 4.0
#: ``online`` with the makespan guard on: a task holding at least this share of the least GPU-seconds
#: of all tasks is large (it keeps a makespan reference's GPU count in some candidates).
LARGE_SHARE = 0.1
#: Candidates from the reference plans (step 6): at most EXTRA_WORK / tasks decodings, at least EXTRA_MIN.
EXTRA_WORK = 20_000
EXTRA_MIN = 60
#: Decodings of the improvement phase per candidate family.
IMPROVE_EVALS = 60


@dataclass
class CompletionResult:
    schedule: Schedule
    value: float
    evaluated: int


def objective_value(problem: Problem, sched: Schedule, objective: str, weights: Sequence[float]) -> float:
    """The schedule's value for ``objective`` (makespan, or weighted sum of ends)."""
    if objective == "makespan":
        return sched.makespan
    ends = [s + d for s, d in zip(sched.start, sched.durations, strict=True)]
    return weighted_completion(ends, weights)


def priced_area(problem: Problem, sched: Schedule) -> float:
    """GPU-seconds the schedule holds, each task's scaled by its share of the arrival price
    (:attr:`~ray_saturn.context.PlanningContext.area_share`; 1 when not given)."""
    ctx = problem.context
    return float(sum(ctx.share(problem.tasks[t]) * problem.options[t][o].gpus * d
                     for t, (o, d) in enumerate(zip(sched.option, sched.durations, strict=True))))


def completion_schedule(
    problem: Problem,
    order: Sequence[int],
    efficiency: float,
    *,
    keep_running: bool,
    cap: int | None = None,
    pause: bool = False,
    fill: Collection[int] = (),
    fixed: Mapping[int, int] | None = None,
) -> Schedule:
    """Serial schedule generation with the option picked per task (see the module docstring).

    ``keep_running``: running tasks stay where they are (their pinned option,
    placed first); otherwise they are taken in ``order`` and their pinned
    option competes with their other options (it must start at 0 on its nodes).
    """
    n = problem.num_tasks
    # Nodes nothing is placed on are interchangeable per size: only the touched ones and the first
    # fresh ones of each size are candidates (as in serial_schedule), so a large cluster costs no more.
    profiles = _Profiles(problem.node_gpus)
    fresh = _FreshNodes(problem.node_gpus)
    for i in np.flatnonzero(np.asarray(problem.node_avail) > 0):
        i = int(i)
        profiles[i].add(0.0, float(problem.node_avail[i]), profiles[i].cap)
        fresh.touch(i)
    option = [0] * n
    start = [0.0] * n
    nodes: list[tuple[int, ...]] = [()] * n
    dur = [0.0] * n
    done = [False] * n
    for t in range(n):
        p = problem.pinned_option(t)
        # A running task stays where it is when asked to, or when it may not move (no other option).
        if p is None or not (keep_running or len(problem.options[t]) == 1):
            continue
        o = problem.options[t][p]
        option[t], start[t], nodes[t], dur[t], done[t] = p, 0.0, o.pinned_nodes, o.duration_s, True
        for i in o.pinned_nodes:
            profiles[i].add(0.0, o.duration_s, o.per_node)
            fresh.touch(i)
    # Running tasks still to place restart at once: a queued task starting at 0 must leave them the
    # GPUs of their smallest option (counted over the cluster; a node-level misfit drops the candidate).
    waiting_running = [t for t in range(n) if not done[t] and problem.pinned_option(t) is not None]
    reserve = 0 if pause else sum(min(o.gpus for o in problem.options[t]) for t in waiting_running)
    free_at_0 = int(problem.total_gpus) - sum(p.used_at(0.0) for p in profiles.values())
    for t in order:
        if done[t]:
            continue
        opts = problem.options[t]
        running = problem.pinned_option(t) is not None
        if running and not pause:
            reserve -= min(o.gpus for o in opts)
        filling = t in fill and _has_fill_option(opts)
        r = float(problem.release[t])
        # A running task that moves restarts at once, unless it may be paused.
        at_once = any(o.pinned for o in opts) and not pause
        best: tuple[float, int, int, float, tuple[int, ...]] | None = None  # (end, gpus, option, start, nodes)
        for j in _candidate_options(opts, efficiency, cap, filling, fixed.get(t) if fixed is not None else None):
            o = opts[j]
            d = o.duration_s
            if o.pinned_nodes is not None:
                if all(profiles[i].fits(0.0, d, o.per_node) for i in o.pinned_nodes):
                    key = (0.0, -o.gpus, j, 0.0, o.pinned_nodes) if filling else (d, o.gpus, j, 0.0, o.pinned_nodes)
                    if best is None or key[:2] < best[:2]:
                        best = key
                continue
            q, k = o.per_node, o.k
            if filling:
                give_up = best[0] if best is not None else math.inf
            else:
                give_up = best[0] - d if best is not None else math.inf
            if give_up < r:
                continue
            if k == 1:
                found = None
                for i in fresh.eligible(q, 1):
                    p = profiles[i]
                    s = p.earliest(r, d, q, found[0] if found is not None else give_up)
                    if math.isinf(s):
                        continue
                    cand = (s, -p.used_at(s), i)
                    if found is None or cand < found:
                        found = cand
                if found is None or (at_once and found[0] > 1e-6):
                    continue
                s, sel = found[0], (found[2],)
                if not running and s <= 1e-6 and free_at_0 - o.gpus < reserve:
                    continue
            else:
                hit = _first_k_fit(profiles, fresh.eligible(q, k), r, d, q, k, give_up)
                if hit is None:
                    continue
                s, sel = hit
            if at_once and s > 1e-6:
                continue
            if not running and s <= 1e-6 and free_at_0 - o.gpus < reserve:
                continue
            key = (s, -o.gpus, j, s, sel) if filling else (s + d, o.gpus, j, s, sel)
            if best is None or key[:2] < best[:2]:
                best = key
        if best is None:
            raise InfeasibleError(f"task {problem.tasks[t]} can never start: no node set fits any of its options")
        _, _, j, s, sel = best
        o = opts[j]
        if s <= 1e-6:
            free_at_0 -= o.gpus
        option[t], start[t], nodes[t], dur[t], done[t] = j, s, tuple(sel), o.duration_s, True
        for i in sel:
            profiles[i].add(s, o.duration_s, o.per_node)
            fresh.touch(i)
    return Schedule(option, start, nodes, dur)


def _has_fill_option(opts) -> bool:
    """Whether a background task has an option the fill rule allows: efficiency >= FILL_EFFICIENCY and
    at most FILL_SPAN x its fastest run. A task that scales well to many GPUs may have none (its
    efficient rows too slow, its fast rows too wide); it is then placed like any other task."""
    free = [o for o in opts if not o.pinned]
    if not free:
        return False
    least, longest = min(o.area for o in free), FILL_SPAN * min(o.duration_s for o in free)
    return any(_efficient_enough(o, least, FILL_EFFICIENCY, longest) for o in free)


def _candidate_options(opts, efficiency: float, cap: int | None, filling: bool,
                       fixed_option: int | None) -> tuple[int, ...]:
    """The options :func:`completion_schedule` weighs for a task, by index, under a rule (``efficiency``,
    ``cap``). A background task (``filling``): those of efficiency >= FILL_EFFICIENCY and at most FILL_SPAN x
    its fastest run. A task whose option is given (``fixed_option``): that one, uncapped. Any other: those
    within the GPU cap (unless none is) of efficiency >= ``efficiency``. A running task's own option
    (pinned to its nodes) passes every efficiency test."""
    if filling:
        limit, e_t = math.inf, FILL_EFFICIENCY
    elif fixed_option is not None:
        limit, e_t = math.inf, 0.0  # its option is given: no cap, no efficiency floor
    else:
        # The GPU cap (a share of the cluster) applies unless no option fits under it.
        limit = cap if cap is not None and any(o.gpus <= cap for o in opts) else math.inf
        e_t = efficiency
    areas = [o.area for o in opts if not o.pinned and o.gpus <= limit]
    least = min(areas) if areas else math.inf
    longest = FILL_SPAN * min(o.duration_s for o in opts if not o.pinned) if filling and areas else math.inf
    return tuple(j for j, o in enumerate(opts)
                 if o.gpus <= limit and (fixed_option is None or j == fixed_option)
                 and (o.pinned_nodes is not None or _efficient_enough(o, least, e_t, longest)))


def _rule_classes(problem: Problem, rules: Sequence[tuple[float, int | None]], fill: Collection[int],
                  fixed: Mapping[int, int] | None = None) -> list[bool]:
    """Per rule, whether it is the first of the rules that give every task the same candidate options
    (:func:`_candidate_options`): a later one decodes every order to the same schedule, so it is skipped."""
    per_task = [(opts, t in fill and _has_fill_option(opts), fixed.get(t) if fixed is not None else None)
                for t, opts in enumerate(problem.options)]
    seen = set()
    first = []
    for e, cap in rules:
        sig = tuple(_candidate_options(opts, e, cap, filling, only) for opts, filling, only in per_task)
        first.append(sig not in seen)
        seen.add(sig)
    return first


def _efficient_enough(o, least_area: float, efficiency: float, longest_s: float) -> bool:
    """Whether option ``o`` uses at most ``least_area / efficiency`` GPU-seconds and runs at most ``longest_s``."""
    return o.area <= least_area / max(efficiency, 1e-12) * (1 + 1e-9) and o.duration_s <= longest_s


def background_tasks(problem: Problem) -> frozenset[int]:
    """The tasks in the background (:func:`~ray_saturn.solver.objective.is_background`): almost
    every job that arrives is smaller and passes them, so they take what capacity is left."""
    shares = problem.context.area_share
    return frozenset(
        t for t, name in enumerate(problem.tasks)
        if is_background(shares.get(name), min(o.area for o in problem.options[t]), problem.total_gpus)
    )


def _orders(problem: Problem, weights: Sequence[float], critical: bool) -> list[list[int]]:
    n = problem.num_tasks
    rel = problem.release
    area = [min(o.area for o in opts) / w for opts, w in zip(problem.options, weights, strict=True)]
    length = [min(o.duration_s for o in opts) / w for opts, w in zip(problem.options, weights, strict=True)]
    by_area = sorted(range(n), key=lambda t: (area[t], rel[t], t))
    by_length = sorted(range(n), key=lambda t: (length[t], rel[t], t))
    out = [by_area, by_length]
    if critical:
        longest = sorted(range(n), key=lambda t: (-(rel[t] + min(o.duration_s for o in problem.options[t])), t))
        for k in (1, 2, 4, 8):
            if k >= n:
                break
            head = longest[:k]
            out.append(head + [t for t in by_area if t not in head])
    return out


def completion_search(
    problem: Problem,
    objective: str,
    weights: Sequence[float],
    *,
    reference: Sequence[Schedule] = (),
    area_weight: float = 0.0,
    time_limit_s: float = 10.0,
    max_evaluations: int | None = None,
    pause: bool | None = None,
) -> CompletionResult:
    """The best schedule found for ``objective`` (``completion`` or ``online``).

    ``reference``: schedules from elsewhere (e.g. the makespan search): they
    set the best makespan the ``online`` objective stays close to, and are
    candidates themselves. ``pause``: running tasks may be stopped to restart
    later (default: for ``online``); see :func:`completion_schedule`.
    ``area_weight``: task-seconds charged per GPU-second a plan uses (the wait
    it causes jobs expected to arrive), scaled per task by the context's
    ``area_share`` (the share of those jobs that would queue behind it).
    """
    if objective not in ("completion", "online"):
        raise ValueError(f"completion_search optimises completion or online, not {objective}")
    deadline = time.perf_counter() + max(0.0, time_limit_s)
    if pause is None:
        pause = objective == "online"
    has_running = any(problem.pinned_option(t) is not None for t in range(problem.num_tasks))
    modes = (True, False) if has_running else (True,)
    cands: list[tuple[Schedule, list[int], tuple, bool]] = []  # (schedule, order, (efficiency, cap), keep)
    fair = problem.total_gpus / max(1, problem.num_tasks)
    rules = [(e, None if k is None else max(1, math.ceil(k * fair))) for k in _SHARES for e in _EFFICIENCIES]
    evaluated = 0
    fill = background_tasks(problem) if objective == "online" and area_weight > 0 else frozenset()
    score_weights = [BACKGROUND_WEIGHT * w if t in fill else w for t, w in enumerate(weights)]
    # The sweep: every rule in every priority order and mode. Rules that give every task the same options
    # decode every order alike: only the first is decoded (the same schedule again could never rank
    # before it). It is decoded rule by rule across the orders and modes, so a sweep the time limit cuts
    # short (a large problem) has tried each order and mode; the candidates keep the sweep's own order,
    # so a finished sweep ranks its ties as always. At least one candidate is made whatever the clock.
    distinct = _rule_classes(problem, rules, fill)
    orders = _orders(problem, weights, critical=objective == "online")
    slots = [(m, o, r) for m in range(len(modes)) for o in range(len(orders)) for r in range(len(rules))
             if distinct[r]]
    made: dict[tuple[int, int, int], tuple[Schedule, list[int], tuple, bool]] = {}
    for m, o, r in sorted(slots, key=lambda x: (x[2], x[0], x[1])):
        if made and time.perf_counter() >= deadline:
            break
        keep, order, (e, cap) = modes[m], orders[o], rules[r]
        evaluated += 1
        try:
            sched = completion_schedule(problem, order, e, keep_running=keep, cap=cap, pause=pause, fill=fill)
        except InfeasibleError:
            if keep:
                raise
            continue  # a running task found no place to restart at once: keep-mode covers it
        made[(m, o, r)] = (sched, order, (e, cap), keep)
    cands.extend(made[k] for k in sorted(made))
    # Each reference plan's GPU counts, in the priority orders: a makespan plan's allotments with
    # the short tasks first often keep its makespan and end the others much sooner.
    # These candidates are made within a budget of decodings (about EXTRA_WORK task placements, so
    # a big problem gets fewer; deterministic) and the time limit.
    extra_budget = max(EXTRA_MIN, EXTRA_WORK // max(1, problem.num_tasks))
    extra = 0

    def more() -> bool:
        return extra < extra_budget and time.perf_counter() < deadline

    refs = sorted(reference, key=lambda r: r.makespan)  # the best makespan's allotments first
    seen_choices = set()
    for ref in refs if objective != "online" or area_weight <= 0 else ():
        if tuple(ref.option) in seen_choices:
            continue
        seen_choices.add(tuple(ref.option))
        for order in _orders(problem, weights, critical=objective == "online"):
            for decode in (serial_schedule, list_schedule):
                if not more():
                    break
                evaluated += 1
                extra += 1
                try:
                    sched = decode(problem, ref.option, order)
                except InfeasibleError:
                    continue
                # Without pausing, a running task that moves restarts at once.
                if pause or all(sched.start[t] <= 1e-6 for t in range(problem.num_tasks)
                                if problem.pinned_option(t) is not None):
                    cands.append((sched, None, None, None))
    # Without an arrival price the makespan guard is on: the large tasks (each >= LARGE_SHARE of
    # the least GPU-seconds) keep a reference plan's GPU counts, which set its makespan, and the
    # others are planned for completion around them.
    if objective == "online" and area_weight <= 0:
        least = [min(o.area for o in opts) for opts in problem.options]
        large = [t for t in range(problem.num_tasks) if least[t] >= LARGE_SHARE * sum(least)]
        seen_large = set()
        for ref in refs if large else ():
            fixed = {t: ref.option[t] for t in large}
            if tuple(fixed.values()) in seen_large:
                continue
            seen_large.add(tuple(fixed.values()))
            distinct = _rule_classes(problem, rules, (), fixed)
            for keep in modes:
                for order in _orders(problem, weights, critical=True):
                    for (e, cap), first in zip(rules, distinct, strict=True):
                        if not more():
                            break
                        extra += 1  # a skipped rule counts: the budget covers the same rules as before
                        if not first:
                            continue
                        evaluated += 1
                        try:
                            sched = completion_schedule(problem, order, e, keep_running=keep, cap=cap,
                                                        pause=pause, fixed=fixed)
                        except InfeasibleError:
                            continue
                        cands.append((sched, order, (e, cap, fixed), keep))
    best_makespan = min([c[0].makespan for c in cands] + [s.makespan for s in reference])
    # While jobs keep arriving (area_weight > 0) the GPU-seconds a plan uses are what later jobs wait
    # for, and the makespan of the jobs present says little about the run's: no makespan guard then.
    guard = objective == "online" and area_weight <= 0
    limit = best_makespan * (1 + ONLINE_SLACK) + 1e-9 if guard else math.inf

    def score(s: Schedule) -> tuple[int, float]:
        # Plans over the makespan limit rank after every plan within it, by makespan.
        over = s.makespan > limit
        if over:
            return (1, s.makespan)
        return (0, objective_value(problem, s, "completion", score_weights) + area_weight * priced_area(problem, s))

    pool = [(score(s), s, order, e, keep) for s, order, e, keep in cands]
    pool += [(score(s), s, None, None, None) for s in reference]
    pool.sort(key=lambda x: x[0])
    best_score, best, order, eff, keep = pool[0]
    # Improvement: adjacent swaps of the best decoded candidate's order.
    if order is not None:
        budget = IMPROVE_EVALS if max_evaluations is None else max_evaluations
        order = list(order)
        i = 0
        tries = 0
        while tries < budget and len(order) > 1 and time.perf_counter() < deadline:
            i = i % (len(order) - 1)
            cand = [*order[:i], order[i + 1], order[i], *order[i + 2 :]]
            evaluated += 1
            try:
                s = completion_schedule(problem, cand, eff[0], keep_running=keep, cap=eff[1], pause=pause,
                                        fill=fill, fixed=eff[2] if len(eff) > 2 else None)
            except InfeasibleError:
                i += 1
                tries += 1
                continue
            tries += 1
            sc = score(s)
            if sc < best_score:
                best_score, best, order = sc, s, cand
            i += 1
    return CompletionResult(best, best_score[1], evaluated)
