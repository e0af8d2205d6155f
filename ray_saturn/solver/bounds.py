"""Lower bounds on the makespan: every plan's makespan is at least the best of these.

Notation: task ``t`` has options ``o`` with duration ``d_o`` (restart set-up
included) and GPU count ``g_o``; ``a_o = g_o d_o`` is its area (GPU-seconds);
``r_t`` is the release time; node ``n`` has ``G_n`` GPUs and is unavailable
until ``u_n``; ``G = sum_n G_n``.

- Length bound: ``max_t (r_t + min_o d_o)``; no task can end sooner.
- Area bound: the smallest ``T`` with ``sum_n G_n (T - u_n)^+ >= sum_t min_o a_o``;
  the GPUs must be able to hold the least work of every task.
- Allotment LP: each task takes a convex mix ``x_t`` of its options::

      minimise    T
      subject to  sum_o x_to = 1                                  for each t
                  r_t + sum_o x_to d_o <= T                        for each t
                  sum_t sum_o x_to a_o <= G T - sum_n G_n min(u_n, theta)
                  x >= 0

  Any schedule of makespan ``T*`` gives a feasible point (its own options,
  ``T = T*``), so the LP optimum is a lower bound. The capacity line is valid
  for ``T >= theta``; we first solve with ``theta = 0`` (no node blocked),
  then again with ``theta`` set to that bound. The LP dominates both simple
  bounds when no node is blocked; we report the maximum anyway.
- Exclusive-task bound: whatever option ``o`` task ``t`` runs with, the other
  tasks get at most ``G - g_o`` GPUs while it runs, so with ``A_t`` the least
  area of all other tasks::

      T >= min_o [ d_o + max(0, A_t - (G - g_o) d_o) / G ]      for each t

  It catches what the LP's fractional mix hides: one wide, long task that
  must either share the cluster slowly or hold all of it. (Computed when no
  node is blocked.) It holds for plans, where each task keeps one option; a
  run that moves tasks between options mid-way can beat it, so bounds on
  such runs use :attr:`LowerBound.with_moves` (the best of the other three,
  which stay valid when a task's work is split between options).

The LP also gives fractional allotments that the heuristic rounds.

Shares of one device (``g_o`` = 1/k) count their area in device-shares, so
every bound above stays valid for them. On a cluster with GPU types the LP
also takes a capacity line per set of types
(:mod:`ray_saturn.solver.typed_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ray_saturn.solver.problem import Problem

__all__ = ["LowerBound", "lower_bound"]


@dataclass(frozen=True)
class LowerBound:
    """The bounds, their maximum (``value``) and the LP's fractional mix per task."""

    value: float
    length: float
    area: float
    lp: float
    lp_mix: list[np.ndarray] | None = None
    exclusive: float = 0.0

    @property
    def with_moves(self) -> float:
        """A bound that also holds when tasks move between options mid-run (checkpoint-restart)."""
        return max(self.length, self.area, self.lp)

    @property
    def binding(self) -> str:
        """Which bound is the best: 'lp', 'area', 'length' or 'exclusive'."""
        pairs = (("lp", self.lp), ("area", self.area), ("length", self.length), ("exclusive", self.exclusive))
        return max(pairs, key=lambda kv: kv[1])[0]


def _capacity_time(work: float, gpus: np.ndarray, avail: np.ndarray) -> float:
    """Smallest T with sum_n G_n (T - u_n)^+ >= work."""
    if work <= 0:
        return 0.0
    order = np.argsort(avail)
    u = avail[order].astype(float)
    g = gpus[order].astype(float)
    covered = 0.0  # work that fits before time u[i] using nodes 0..i-1
    rate = 0.0
    for i in range(len(u)):
        if i > 0:
            covered += rate * (u[i] - u[i - 1])
            if covered >= work:
                return float(u[i] - (covered - work) / rate)
        rate += g[i]
    return float(u[-1] + (work - covered) / rate)


def length_bound(problem: Problem) -> float:
    return max(
        (float(problem.release[t]) + min(o.duration_s for o in opts) for t, opts in enumerate(problem.options)),
        default=0.0,
    )


def area_bound(problem: Problem) -> float:
    work = sum(min(o.area for o in opts) for opts in problem.options)
    return _capacity_time(work, problem.node_gpus, problem.node_avail)


def exclusive_bound(problem: Problem) -> float:
    if (problem.node_avail > 0).any():
        return 0.0
    G = float(problem.total_gpus)
    min_area = [min(o.area for o in opts) for opts in problem.options]
    total = sum(min_area)
    best = 0.0
    for t, opts in enumerate(problem.options):
        rest = total - min_area[t]
        value = min(o.duration_s + max(0.0, rest - (G - o.gpus) * o.duration_s) / G for o in opts)
        best = max(best, value)
    return best


def _solve_lp(problem: Problem, blocked: float) -> tuple[float, list[np.ndarray]] | None:
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    counts = [len(opts) for opts in problem.options]
    nvar = sum(counts) + 1  # last variable: T
    T = nvar - 1
    d = np.concatenate([[o.duration_s for o in opts] for opts in problem.options])
    area = np.concatenate([[o.area for o in opts] for opts in problem.options])
    task_of = np.repeat(np.arange(problem.num_tasks), counts)
    cols = np.arange(nvar - 1)
    nt = problem.num_tasks
    # Inequalities: per task  sum x d - T <= -r_t ; capacity  sum x a - G T <= -blocked
    rows = np.concatenate([task_of, np.arange(nt), np.full(nvar - 1, nt), [nt]])
    cc = np.concatenate([cols, np.full(nt, T), cols, [T]])
    vals = np.concatenate([d, -np.ones(nt), area, [-float(problem.total_gpus)]])
    A_ub = coo_matrix((vals, (rows, cc)), shape=(nt + 1, nvar)).tocsr()
    b_ub = np.concatenate([-problem.release.astype(float), [-blocked]])
    A_eq = coo_matrix((np.ones(nvar - 1), (task_of, cols)), shape=(nt, nvar)).tocsr()
    b_eq = np.ones(nt)
    c = np.zeros(nvar)
    c[T] = 1.0
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if res.status != 0:
        return None
    x = res.x
    # HiGHS' dual bound is the safe side: the optimum is proven within its tolerance.
    value = float(x[T])
    mixes = np.split(x[:-1], np.cumsum(counts)[:-1])
    return value * (1 - 1e-7), mixes


def lower_bound(problem: Problem, *, use_lp: bool = True) -> LowerBound:
    """All bounds for ``problem``; see the module docstring."""
    length = length_bound(problem)
    area = area_bound(problem)
    lp = 0.0
    mix = None
    if use_lp and problem.num_tasks:
        out = _solve_lp(problem, 0.0)
        if out is not None:
            lp, mix = out
            if (problem.node_avail > 0).any():
                theta = max(lp, length, area)
                blocked = float((problem.node_gpus * np.minimum(problem.node_avail, theta)).sum())
                again = _solve_lp(problem, blocked)
                if again is not None:
                    lp, mix = max(lp, again[0]), again[1]
    if use_lp and any(o.nodes_ok is not None for opts in problem.options for o in opts):
        # GPU types: the same LP with a capacity line per set of types (ray_saturn.solver.typed_bound).
        from ray_saturn.solver.typed_bound import typed_lp_bound

        lp = max(lp, typed_lp_bound(problem))
    excl = exclusive_bound(problem)
    if problem.packing:
        # Plans of shares of one device: each task pays its whole option or its share (threshold_bound).
        from ray_saturn.solver.threshold_bound import threshold_area_bound

        excl = max(excl, threshold_area_bound(problem))
    return LowerBound(max(length, area, lp, excl), length, area, lp, mix, excl)
