"""A lower bound for clusters with GPU types: the allotment LP with one capacity line per set of types.

Notation of :mod:`ray_saturn.solver.bounds`; node ``n`` has type ``tau_n``
(an untyped node is its own type ``None``). An option measured on a type
runs only on nodes of that type (``N_o``); an untyped option on any node.
For every non-empty set ``S`` of types, with ``G_S`` the GPUs of its nodes,
the options confined to nodes of ``S`` must fit there::

    minimise    T
    subject to  sum_o x_to = 1                                      for each t
                r_t + sum_o x_to d_o <= T                            for each t
                sum_t sum_{o: N_o within S} x_to a_o <= G_S T         for each S
                x >= 0

(``S`` = all types is the plain area line.) Any plan of makespan ``T*``
gives a feasible point (its own options), so the optimum is a lower bound;
areas are device-shares x seconds, so shares of one GPU count what they
hold. Computed when no node is blocked (no ``node_avail``) and at most
:data:`MAX_TYPES` types exist; else 0 (no claim).
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from ray_saturn.solver.problem import Problem

__all__ = ["MAX_TYPES", "typed_lp_bound"]

MAX_TYPES = 6


def typed_lp_bound(problem: Problem) -> float:
    """The LP bound of the module docstring, or 0.0 when it does not apply."""
    if not problem.num_tasks or (problem.node_avail > 0).any():
        return 0.0
    types = list(dict.fromkeys(problem.cluster.gpu_types))
    if len(types) < 2 or len(types) > MAX_TYPES:
        return 0.0
    from scipy.optimize import linprog

    node_type = list(problem.cluster.gpu_types)
    opts = [o for os in problem.options for o in os]
    counts = [len(os) for os in problem.options]
    nvar = len(opts) + 1
    T = nvar - 1
    task_of = np.repeat(np.arange(problem.num_tasks), counts)
    rows, rhs = [], []
    # Length: sum_o x d - T <= -r_t.
    for t in range(problem.num_tasks):
        row = np.zeros(nvar)
        row[: T][task_of == t] = [o.duration_s for o, tt in zip(opts, task_of, strict=True) if tt == t]
        row[T] = -1.0
        rows.append(row)
        rhs.append(-float(problem.release[t]))
    for size in range(1, len(types) + 1):
        for subset in combinations(types, size):
            nodes = {n for n, ty in enumerate(node_type) if ty in subset}
            G = float(sum(int(problem.node_gpus[n]) for n in nodes))
            row = np.zeros(nvar)
            for i, o in enumerate(opts):
                allowed = set(o.pinned_nodes or o.nodes_ok or range(problem.num_nodes))
                if allowed <= nodes:
                    row[i] = o.area
            if not row.any():
                continue
            row[T] = -G
            rows.append(row)
            rhs.append(0.0)
    A_eq = np.zeros((problem.num_tasks, nvar))
    A_eq[task_of, np.arange(len(opts))] = 1.0
    c = np.zeros(nvar)
    c[T] = 1.0
    res = linprog(c, A_ub=np.array(rows), b_ub=np.array(rhs), A_eq=A_eq, b_eq=np.ones(problem.num_tasks),
                  bounds=(0, None), method="highs")
    if res.status != 0:
        return 0.0
    return float(res.x[T]) * (1 - 1e-7)
