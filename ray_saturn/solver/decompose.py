"""Planning at cluster scale: POP-style partitioning, exact sub-problems, full-cluster compaction.

At 1000 tasks on 128 nodes the monolithic CP-SAT model has about a million
node intervals and cannot be loaded in time, and one serial-schedule decoding
of the whole problem is slow enough that a local search makes few moves. In
the spirit of POP (Narayanan et al., SOSP 2021, "Solving Large-Scale
Granular Resource Allocation Problems Efficiently with POP"), the problem is
split into ``k`` independent sub-problems that are each small enough for the
exact model:

1. Nodes are cut into ``k`` groups of consecutive nodes with (about) equal
   GPUs, each at least as large as the widest configuration any task needs
   (tasks keep every option that fits inside a group).
2. Tasks are dealt to groups by longest-processing-time on their LP work
   (``sum_o x_to a_o`` of the allotment LP; least area when there is no LP
   mix): the largest task first, each to the group whose normalised load
   ``(work + area) / G_group`` is smallest. A running task goes to the group
   holding its nodes (if its nodes span groups, the problem is not split).
3. Each sub-problem is solved by the solve function the caller hands in,
   within the sub-problem's share of the time (the ``saturn`` policy hands
   itself: heuristic, then the exact model on the part).
4. The union of the sub-schedules is a valid schedule of the whole problem
   (groups share no node). It is then compacted on the whole cluster: the
   tasks' options are kept and they are list-scheduled (and serially
   scheduled) in the order of their start times, which lets a task start
   early on another group's idle nodes; the best of the three is returned.

:func:`pop_schedule` returns ``None`` when the problem cannot be split (too
few nodes, a task that fits in no group, a running task across groups).

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> from ray_saturn.solver import build_problem, lower_bound
    >>> rows = [{"task": f"t{i}", "strategy": "ddp", "gpus": g, "step_time_s": 8.0 / g, "steps": 10}
    ...         for i in range(8) for g in (1, 2)]
    >>> problem = build_problem(ProfileTable.from_rows(rows), ClusterSpec.uniform(4, 2))
    >>> from ray_saturn.solver.heuristic import heuristic_schedule
    >>> def solve_part(sub, time_limit_s, seed):
    ...     return heuristic_schedule(sub, lower_bound(sub), time_limit_s=time_limit_s, seed=seed).schedule
    >>> result = pop_schedule(problem, lower_bound(problem), solve_part, parts=2, time_limit_s=2.0)
    >>> result.schedule.makespan, result.parts
    (80.0, 2)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ray_saturn.solver.bounds import LowerBound
from ray_saturn.solver.listsched import list_schedule, serial_schedule
from ray_saturn.solver.problem import Option, Problem, Schedule

__all__ = ["DecomposeResult", "SolvePart", "choose_parts", "decomposed_start", "pop_schedule"]

logger = logging.getLogger(__name__)

#: Sub-problems are sized so that each has at most about this many tasks.
TASKS_PER_PART = 64
#: The saturn policy starts from the decomposition on clusters of at least this many nodes, where
#: one list-scheduling pass over all nodes gets slow (measured: release/scale_benchmark.py).
DECOMPOSE_MIN_NODES = 256
#: ... and at least this many tasks (fewer are planned in well under a second without it).
DECOMPOSE_MIN_TASKS = 4 * TASKS_PER_PART
#: Share of the saturn policy's time limit the decomposition may use.
DECOMPOSE_SHARE = 0.3

SolvePart = Callable[[Problem, float, int], Schedule]
"""Solves one part: ``(sub_problem, time_limit_s, seed) -> Schedule`` of every task of the part."""


@dataclass
class DecomposeResult:
    """The merged (and compacted) schedule, its choice and order, and how it was made."""

    schedule: Schedule
    choice: list[int]
    order: list[int]
    parts: int
    part_makespans: list[float]
    compacted: str


def choose_parts(problem: Problem) -> int:
    """How many groups to cut the cluster into: about :data:`TASKS_PER_PART` tasks each, no group
    narrower than the widest configuration that some task has no narrower alternative to."""
    widest = max(min(o.k for o in opts) for opts in problem.options)
    by_nodes = problem.num_nodes // max(1, widest)
    return max(1, min(by_nodes, math.ceil(problem.num_tasks / TASKS_PER_PART)))


def _node_groups(problem: Problem, parts: int) -> list[list[int]]:
    caps = problem.node_gpus.astype(float)
    target = caps.sum() / parts
    groups: list[list[int]] = [[]]
    acc = 0.0
    for n in range(problem.num_nodes):
        if acc >= target * len(groups) - 1e-9 and len(groups) < parts:
            groups.append([])
        groups[-1].append(n)
        acc += caps[n]
    return [g for g in groups if g]


def _sub_problem(problem: Problem, tasks: list[int], nodes: list[int]) -> tuple[Problem, list[list[int]]] | None:
    """The problem restricted to ``tasks`` on ``nodes``, and each option's index in the original."""
    local = {n: i for i, n in enumerate(nodes)}
    caps = sorted((int(problem.node_gpus[n]) for n in nodes), reverse=True)
    options: list[list[Option]] = []
    index: list[list[int]] = []
    for t in tasks:
        opts, idx = [], []
        for i, o in enumerate(problem.options[t]):
            if o.pinned_nodes is not None:
                if not all(n in local for n in o.pinned_nodes):
                    return None
                o = Option(o.config, o.duration_s, o.setup_s, o.k, o.per_node, tuple(local[n] for n in o.pinned_nodes))
            elif o.k > len(nodes) or caps[o.k - 1] < o.per_node:
                continue
            opts.append(o)
            idx.append(i)
        if not opts:
            return None
        options.append(opts)
        index.append(idx)
    sub = Problem(
        tasks=[problem.tasks[t] for t in tasks],
        options=options,
        node_names=[problem.node_names[n] for n in nodes],
        node_gpus=problem.node_gpus[nodes],
        node_avail=problem.node_avail[nodes],
        release=problem.release[tasks],
        profile=problem.profile,
        cluster=problem.cluster,
        context=problem.context,
    )
    return sub, index


def _assign(problem: Problem, bound: LowerBound, groups: list[list[int]]) -> list[list[int]] | None:
    work = []
    for t, opts in enumerate(problem.options):
        if bound.lp_mix is not None and len(bound.lp_mix[t]) == len(opts):
            work.append(float(np.dot(bound.lp_mix[t], [o.area for o in opts])))
        else:
            work.append(min(o.area for o in opts))
    group_of_node = {n: g for g, ns in enumerate(groups) for n in ns}
    gpus = [float(problem.node_gpus[ns].sum()) for ns in groups]
    widest = [max(int(problem.node_gpus[n]) for n in ns) for ns in groups]
    load = [0.0] * len(groups)
    out: list[list[int]] = [[] for _ in groups]
    for t in sorted(range(problem.num_tasks), key=lambda t: (-work[t], t)):
        pin = problem.pinned_option(t)
        if pin is not None:
            gs = {group_of_node[n] for n in problem.options[t][pin].pinned_nodes or ()}
            if len(gs) != 1:
                return None
            g = gs.pop()
        else:
            fits = [
                g
                for g in range(len(groups))
                if any(o.k <= len(groups[g]) and o.per_node <= widest[g] for o in problem.options[t])
            ]
            if not fits:
                return None
            g = min(fits, key=lambda g: (load[g] / gpus[g], g))
        out[g].append(t)
        load[g] += work[t]
    return out


def pop_schedule(
    problem: Problem,
    bound: LowerBound,
    solve_part: SolvePart,
    *,
    parts: int | None = None,
    time_limit_s: float,
    seed: int = 0,
    deterministic: bool = False,
    on_schedule: Callable[[Schedule], None] | None = None,
) -> DecomposeResult | None:
    """Partition, solve the parts with ``solve_part``, merge and compact (see the module docstring).

    ``deterministic`` shares the time limit evenly between the parts (rather
    than by the time left) and always compacts serially too, so the result
    depends on the clock only through ``solve_part``.
    """
    t0 = time.perf_counter()
    k = parts or choose_parts(problem)
    if k < 2 or problem.num_nodes < 2:
        return None
    groups = _node_groups(problem, k)
    assignment = _assign(problem, bound, groups)
    if assignment is None:
        logger.info("decomposition skipped: the tasks cannot be split over %d node groups", len(groups))
        return None
    n = problem.num_tasks
    choice = [0] * n
    start = [0.0] * n
    nodes: list[tuple[int, ...]] = [()] * n
    part_spans = []
    live = [(g, ts) for g, ts in zip(groups, assignment, strict=True) if ts]
    for i, (group, tasks) in enumerate(live):
        built = _sub_problem(problem, tasks, group)
        if built is None:
            return None
        sub, index = built
        if deterministic:
            share = time_limit_s / len(live)
        else:
            left = time_limit_s - (time.perf_counter() - t0)
            share = max(0.05, 0.8 * left / (len(live) - i))
        s = solve_part(sub, share, seed)
        part_spans.append(s.makespan)
        for j, t in enumerate(tasks):
            choice[t] = index[j][s.option[j]]
            start[t] = float(s.start[j])
            nodes[t] = tuple(group[x] for x in s.nodes[j])
    merged = problem.schedule(choice, start, nodes)
    best, how = merged, "none"
    order = sorted(range(n), key=lambda t: (start[t], t))
    for name, fn in (("list", list_schedule), ("serial", serial_schedule)):
        if name == "serial" and not deterministic and time.perf_counter() - t0 > time_limit_s:
            break
        cand = fn(problem, choice, order)
        if cand.makespan < best.makespan - 1e-9:
            best, how = cand, name
    if on_schedule is not None:
        on_schedule(best)
    logger.info(
        "decomposition: %d parts (makespans %.0f..%.0f s), merged %.0f s, compacted (%s) %.0f s in %.1f s",
        len(live),
        min(part_spans),
        max(part_spans),
        merged.makespan,
        how,
        best.makespan,
        time.perf_counter() - t0,
    )
    return DecomposeResult(best, choice, order, len(live), part_spans, how)


def decomposed_start(
    problem: Problem,
    bound: LowerBound,
    solve_part: SolvePart,
    *,
    time_limit_s: float,
    seed: int = 0,
    deterministic: bool = False,
    on_schedule: Callable[[Schedule], None] | None = None,
) -> Schedule | None:
    """The saturn policy's hook for problems too big for the exact model.

    On clusters of at least :data:`DECOMPOSE_MIN_NODES` nodes with at least
    :data:`DECOMPOSE_MIN_TASKS` tasks: the POP schedule within
    :data:`DECOMPOSE_SHARE` of the time limit; ``None`` otherwise, or when the
    problem cannot be split."""
    if problem.num_nodes < DECOMPOSE_MIN_NODES or problem.num_tasks < DECOMPOSE_MIN_TASKS:
        return None
    res = pop_schedule(
        problem,
        bound,
        solve_part,
        time_limit_s=DECOMPOSE_SHARE * time_limit_s,
        seed=seed,
        deterministic=deterministic,
        on_schedule=on_schedule,
    )
    return None if res is None else res.schedule
