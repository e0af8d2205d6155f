"""The threshold-area bound: a plan that ends by ``T`` runs every task on an option that ends by ``T``.

Notation of :mod:`ray_saturn.solver.bounds`. In a plan (each task keeps one
option) of makespan ``T``, task ``t`` runs an option with ``r_t + d_o <= T``,
so its area is at least ``A_t(T) = min {a_o : r_t + d_o <= T}`` (infinite if
none), and the GPUs must hold all of it::

    T >= min { T : sum_t A_t(T) <= sum_n G_n (T - u_n)^+ }

The allotment LP mixes options fractionally, so a task whose fast option is
wide and whose narrow option is slow (a whole GPU against a 1/4 share at
twice the time) counts as a blend; here it must pay for one or the other,
which is what makes shares of one device hard to pack near the makespan.
Like the exclusive-task bound it holds for plans, not for runs that move a
task between options mid-way (it is left out of ``with_moves``).

``sum_t A_t(T)`` only falls as ``T`` grows (at the options' end times) and
the capacity only rises, so one sweep over the end times finds the least
``T``, in ``O(options log options)``.

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> from ray_saturn.solver import build_problem
    >>> rows = [{"task": t, "strategy": "s", "gpus": g, "step_time_s": d, "steps": 1}
    ...         for t in "ab" for g, d in ((1, 4.0), (0.25, 8.0))]
    >>> threshold_area_bound(build_problem(ProfileTable.from_rows(rows), ClusterSpec.uniform(1, 1)))
    8.0
"""

from __future__ import annotations

import math

from ray_saturn.solver.bounds import _capacity_time
from ray_saturn.solver.problem import Problem

__all__ = ["threshold_area_bound"]


def threshold_area_bound(problem: Problem) -> float:
    """The bound of the module docstring (0.0 for an empty problem)."""
    if not problem.num_tasks:
        return 0.0
    events = sorted(
        (float(problem.release[t]) + o.duration_s, t, o.area)
        for t, opts in enumerate(problem.options)
        for o in opts
    )
    best = [math.inf] * problem.num_tasks
    missing = problem.num_tasks  # tasks with no option ending by T yet
    work = 0.0
    i = 0
    while i < len(events):
        T = events[i][0]
        while i < len(events) and events[i][0] <= T:
            _, t, area = events[i]
            if area < best[t]:
                if math.isinf(best[t]):
                    missing -= 1
                    work += area
                else:
                    work -= best[t] - area
                best[t] = area
            i += 1
        if missing:
            continue
        nxt = events[i][0] if i < len(events) else math.inf
        need = max(T, _capacity_time(work, problem.node_gpus, problem.node_avail))
        if need <= nxt:
            return need
    return 0.0  # pragma: no cover - the last end time always leaves a finite answer
