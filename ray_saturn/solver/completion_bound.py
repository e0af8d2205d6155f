"""Lower bounds on the (weighted) sum of completion times: what the ``completion`` objective is measured against.

Notation as in :mod:`ray_saturn.solver.bounds`: task ``t`` has release
``r_t``, options ``o`` of duration ``d_o`` and area ``a_o = g_o d_o``, and a
weight ``w_t``; the cluster has ``G`` GPUs. Let ``p_t = min_o a_o / G``.

- Length bound: ``C_t >= r_t + min_o d_o``, so ``sum_t w_t C_t >= sum_t w_t (r_t + min_o d_o)``.
- Single-machine relaxation. Any schedule of the cluster, also one that moves
  tasks between options mid-run, gives task ``t`` at least ``min_o a_o``
  GPU-seconds between ``r_t`` and ``C_t``, and the cluster delivers at most
  ``G`` GPU-seconds per second. Shrinking time by ``G`` this is a
  processor-sharing schedule of one machine in which job ``t`` (size
  ``p_t``, release ``r_t``) is done by ``C_t``. On one machine a
  processor-sharing schedule meeting the deadlines ``C_t`` can be made
  preemptive meeting them too (earliest deadline first is feasible whenever
  any fractional schedule is: both are the same interval-load condition), so
  ``C_t`` dominates a preemptive one-machine schedule. Then

  - unit weights: SRPT is optimal for ``1 | r_t, pmtn | sum C_t`` (Schrage
    1968), so its total completion time is a bound;
  - weights: the preemptive WSPT schedule (always run the released job with
    the largest ``w_t / p_t``) minimises ``sum_t w_t M_t``, ``M_t`` the mean
    busy time, over all preemptive schedules (Goemans, SODA 1996), and
    ``C_t >= M_t + p_t / 2``; so ``sum_t w_t (M_t + p_t / 2)`` is a bound.

  Unavailable nodes only lower the capacity, so ignoring them keeps the
  relaxation valid.

The reported bound is the larger of the two sums. Both hold for runs that
move tasks (checkpoint-restart only adds work), so the simulator's realised
mean completion time can be compared with them.

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> from ray_saturn.solver import build_problem
    >>> prof = ProfileTable.from_rows([
    ...     {"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10},
    ...     {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 30},
    ... ])
    >>> round(completion_lower_bound(build_problem(prof, ClusterSpec.uniform(1, 1))).total, 6)
    50.0
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from ray_saturn.solver.objective import task_weights
from ray_saturn.solver.problem import Problem

__all__ = ["CompletionBound", "completion_lower_bound", "srpt_total", "wspt_mean_busy_bound"]


@dataclass(frozen=True)
class CompletionBound:
    """Bounds on ``sum_t w_t C_t`` (completion measured from time 0) and the mean JCT bound they give."""

    total: float
    length: float
    machine: float
    weight_sum: float
    release_sum: float

    @property
    def mean_completion_s(self) -> float:
        """A bound on the weighted mean of ``C_t - r_t`` (the mean job completion time for unit weights)."""
        if self.weight_sum <= 0:
            return 0.0
        return max(0.0, (self.total - self.release_sum) / self.weight_sum)


def srpt_total(release: Sequence[float], size: Sequence[float]) -> float:
    """``sum_t C_t`` of preemptive SRPT on one unit-speed machine."""
    jobs = sorted(range(len(size)), key=lambda t: release[t])
    heap: list[tuple[float, int]] = []
    now, i, total = 0.0, 0, 0.0
    while i < len(jobs) or heap:
        if not heap:
            now = max(now, release[jobs[i]])
        while i < len(jobs) and release[jobs[i]] <= now:
            heapq.heappush(heap, (size[jobs[i]], jobs[i]))
            i += 1
        left, t = heapq.heappop(heap)
        nxt = release[jobs[i]] if i < len(jobs) else float("inf")
        if now + left <= nxt:
            now += left
            total += now
        else:
            heapq.heappush(heap, (left - (nxt - now), t))
            now = nxt
    return total


def wspt_mean_busy_bound(release: Sequence[float], size: Sequence[float], weight: Sequence[float]) -> float:
    """``sum_t w_t (M_t + p_t / 2)`` with ``M_t`` the mean busy time under preemptive WSPT."""
    jobs = sorted(range(len(size)), key=lambda t: release[t])
    heap: list[tuple[float, int]] = []
    left = list(size)
    busy = [0.0] * len(size)  # integral of the time over the job's processing
    now, i = 0.0, 0
    while i < len(jobs) or heap:
        if not heap:
            now = max(now, release[jobs[i]])
        while i < len(jobs) and release[jobs[i]] <= now:
            t = jobs[i]
            heapq.heappush(heap, (-weight[t] / size[t] if size[t] > 0 else float("-inf"), t))
            i += 1
        _, t = heap[0]
        nxt = release[jobs[i]] if i < len(jobs) else float("inf")
        run = min(left[t], nxt - now)
        busy[t] += run * (now + run / 2)
        left[t] -= run
        now += run
        if left[t] <= 1e-12:
            heapq.heappop(heap)
    total = 0.0
    for t in range(len(size)):
        mean_busy = busy[t] / size[t] if size[t] > 0 else release[t]
        total += weight[t] * (mean_busy + size[t] / 2)
    return total


def completion_lower_bound(problem: Problem, weights: Sequence[float] | None = None) -> CompletionBound:
    """Both bounds for ``problem`` (weights default to the profile's ``weight`` column, else 1)."""
    w = list(weights) if weights is not None else task_weights(problem.profile, problem.tasks)
    rel = [float(r) for r in problem.release]
    G = float(problem.total_gpus)
    shortest = [min(o.duration_s for o in opts) for opts in problem.options]
    length = sum(wt * (r + d) for wt, r, d in zip(w, rel, shortest, strict=True))
    size = [min(o.area for o in opts) / G for opts in problem.options]
    unit = all(abs(x - 1.0) < 1e-12 for x in w)
    machine = srpt_total(rel, size) if unit else wspt_mean_busy_bound(rel, size, w)
    # Floating-point safety: a bound must never exceed the optimum by rounding.
    total = max(length, machine) * (1 - 1e-9)
    return CompletionBound(total, length, machine, sum(w), sum(wt * r for wt, r in zip(w, rel, strict=True)))
