"""The SPASE model (select a parallelism, allocate GPUs, schedule) on CP-SAT.

Time is discretised to a unit ``u`` (durations rounded up, so any integer
schedule is valid in real seconds). Notation as in
:mod:`ray_saturn.solver.bounds`; per option ``o`` of task ``t``: integer
duration ``D_o = ceil(d_o / u)``, node count ``k_o``, GPUs per node ``q_o``.

Variables:
    ``s_t``         integer start of task t, ``ceil(r_t/u) <= s_t``
    ``x_to``        boolean, task t runs with option o
    ``y_ton``       boolean, option o of task t occupies node n
    ``C``           integer makespan

Constraints:
    ``sum_o x_to = 1``                                     one option per task
    ``sum_n y_ton = k_o x_to``                             k_o distinct nodes
    ``y_ton = 0`` where ``q_o > G_n``                       it must fit the node
    ``cumulative_n({[s_t, s_t + D_o) : y_ton}, q_o) <= G_n`` per node n
        (with a fixed block ``[0, ceil(u_n/u))`` of ``G_n`` on an unavailable node)
    ``cumulative({[s_t, s_t + D_o) : x_to}, g_o) <= G``    redundant, whole cluster
    ``C >= s_t + sum_o D_o x_to``                           for each t
    running task kept in place: its pinned option has ``y`` fixed to its
    nodes and ``x_to => s_t = 0``; every other option of it includes the
    restart set-up in ``d_o``.

Objective: minimise ``C``.

The search is warm-started with a given choice and order (list-scheduled on
the rounded durations, so the hint is feasible) and bounded above by that
hint, so the returned schedule is never worse than it.

CP-SAT's proven objective bound ``C_lb`` becomes a lower bound in seconds:
exactly ``C_lb u`` when every time is a multiple of ``u``, and
``(C_lb - n - 1) u`` otherwise, for ``n`` tasks. Why: take an optimal
schedule in real seconds, makespan ``OPT``, and let ``r_t`` count the tasks
that end by the time task t starts (``r_t <= n - 1``; 0 for a running task,
which starts at 0). Starting each task at ``ceil(s_t / u) + r_t`` with the
rounded durations keeps every pair that did not overlap apart (if a ends
by s_b then ``ceil(s_a/u) + D_a <= ceil(s_b/u) + 1`` and ``r_b >= r_a + 1``),
so tasks that overlap now overlapped before, on the same nodes, and by the
Helly property of intervals were all running at one time: no node holds more
than its GPUs. Releases and unavailable nodes are respected (times only move
later). Every task ends before ``(s_t + d_t)/u + n + 1``, so the integer
optimum, and hence ``C_lb``, is below ``OPT/u + n + 1``.

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> from ray_saturn.solver import build_problem
    >>> rows = [{"task": t, "strategy": "ddp", "gpus": g, "step_time_s": 8.0 / g, "steps": 10}
    ...         for t in ("a", "b") for g in (1, 2)]
    >>> problem = build_problem(ProfileTable.from_rows(rows), ClusterSpec.uniform(1, 2))
    >>> result = solve_cpsat(problem, [0, 0], [0, 1], horizon_s=80.0, time_limit_s=5.0)
    >>> result.schedule.makespan, result.proven_bound_s, result.optimal
    (80.0, 80.0, True)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ray_saturn.solver.listsched import list_schedule
from ray_saturn.solver.problem import Problem, Schedule

__all__ = ["RESOLUTION", "SAFETY_FACTOR", "CpSatResult", "new_solver", "solve_cpsat", "solve_until", "time_unit"]

logger = logging.getLogger(__name__)

#: Target number of time units in the horizon.
RESOLUTION = 20_000
#: In deterministic mode a wall clock only stops a search that overruns its work budget this many
#: times over (a safety net): a loaded machine must not change the plan.
SAFETY_FACTOR = 50


@dataclass
class CpSatResult:
    """The best schedule CP-SAT found, the lower bound it proved (seconds) and whether it is optimal.

    ``unit_s`` is the model's time unit; ``rounded`` says whether some time
    was rounded up to it (then ``proven_bound_s`` carries the ``(n + 1) u``
    adjustment of the module docstring, and ``optimal`` is False: the
    schedule is optimal for the rounded times only).
    """

    schedule: Schedule
    proven_bound_s: float
    optimal: bool
    unit_s: float = 1.0
    rounded: bool = False


def time_unit(problem: Problem, horizon_s: float, resolution: int = RESOLUTION) -> tuple[float, bool]:
    """The time unit ``u``, and whether every time of ``problem`` is an exact multiple of it."""
    values = [o.duration_s for opts in problem.options for o in opts]
    values += [float(r) for r in problem.release] + [float(a) for a in problem.node_avail]
    if all(float(v).is_integer() for v in values) and horizon_s <= 50 * resolution:
        return 1.0, True
    unit = max(horizon_s / resolution, 1e-6)
    exact = all(abs(v / unit - round(v / unit)) < 1e-9 for v in values)
    return unit, exact


def solve_cpsat(
    problem: Problem,
    choice: Sequence[int],
    order: Sequence[int],
    *,
    horizon_s: float,
    time_limit_s: float,
    seed: int = 0,
    on_schedule: Callable[[Schedule], None] | None = None,
    deterministic: bool = False,
    resolution: int = RESOLUTION,
    gap: float = 0.0,
    stop_at_s: float | None = None,
) -> CpSatResult | None:
    """Solve the SPASE model (see the module docstring), warm-started with ``choice`` in ``order``;
    stop at a relative ``gap`` to CP-SAT's own bound, or at a schedule of makespan <= ``stop_at_s``.

    ``horizon_s`` (the makespan of a known schedule, in seconds) sets the time
    unit, ``horizon_s / resolution``, or one second when every time is a whole
    number of seconds and the horizon is short enough. The model's horizon is
    the hint's makespan on the rounded durations. With
    ``deterministic=True`` the limit is CP-SAT's deterministic time on one
    worker. ``resolution`` is the target number of time units in the horizon.
    Returns ``None`` when CP-SAT finds no schedule within the limit.
    """
    from ortools.sat.python import cp_model

    unit, exact = time_unit(problem, horizon_s, resolution)
    D = [[max(1, math.ceil(o.duration_s / unit - 1e-9)) for o in opts] for opts in problem.options]
    # A hint that is feasible under the rounded durations, and the horizon it implies.
    hint = list_schedule(problem, choice, order, durations=[D[t][c] * unit for t, c in enumerate(choice)])
    horizon = math.ceil(hint.makespan / unit - 1e-9)
    m = cp_model.CpModel()
    n_nodes = problem.num_nodes
    caps = [int(g) for g in problem.node_gpus]
    node_iv: list[list] = [[] for _ in range(n_nodes)]
    node_dem: list[list[int]] = [[] for _ in range(n_nodes)]
    all_iv, all_dem = [], []
    C = m.NewIntVar(0, horizon, "makespan")
    starts, xs, ys = [], [], []
    for n in range(n_nodes):
        block = math.ceil(problem.node_avail[n] / unit - 1e-9)
        if block > 0:
            iv = m.NewFixedSizeIntervalVar(0, block, f"blocked_{n}")
            node_iv[n].append(iv)
            node_dem[n].append(caps[n])
            all_iv.append(iv)
            all_dem.append(caps[n])
    for t, opts in enumerate(problem.options):
        rel = math.ceil(problem.release[t] / unit - 1e-9)
        s = m.NewIntVar(rel, max(rel, horizon - min(D[t])), f"s_{t}")
        starts.append(s)
        xt, yt = [], []
        for o, opt in enumerate(opts):
            x = m.NewBoolVar(f"x_{t}_{o}")
            xt.append(x)
            iv = m.NewOptionalFixedSizeIntervalVar(s, D[t][o], x, f"iv_{t}_{o}")
            all_iv.append(iv)
            all_dem.append(opt.gpus)
            yo = {}
            if opt.pinned_nodes is not None:
                m.Add(s == 0).OnlyEnforceIf(x)
                eligible = list(opt.pinned_nodes)
                for n in eligible:
                    yo[n] = x
            else:
                eligible = [n for n in range(n_nodes) if caps[n] >= opt.per_node]
                if opt.k == 1:
                    for n in eligible:
                        yo[n] = m.NewBoolVar(f"y_{t}_{o}_{n}")
                    m.AddExactlyOne([*yo.values(), x.Not()])
                else:
                    for n in eligible:
                        yo[n] = m.NewBoolVar(f"y_{t}_{o}_{n}")
                        m.AddImplication(yo[n], x)
                    m.Add(sum(yo.values()) == opt.k * x)
            for n, y in yo.items():
                node_iv[n].append(iv if y is x else m.NewOptionalFixedSizeIntervalVar(s, D[t][o], y, f"nv_{t}_{o}_{n}"))
                node_dem[n].append(opt.per_node)
            yt.append(yo)
        m.AddExactlyOne(xt)
        m.Add(s + sum(D[t][o] * xt[o] for o in range(len(opts))) <= C)
        xs.append(xt)
        ys.append(yt)
    for n in range(n_nodes):
        if node_iv[n]:
            m.AddCumulative(node_iv[n], node_dem[n], caps[n])
    m.AddCumulative(all_iv, all_dem, sum(caps))
    m.Minimize(C)
    # Warm start.
    for t in range(problem.num_tasks):
        c = hint.option[t]
        m.AddHint(starts[t], round(hint.start[t] / unit))
        for o, x in enumerate(xs[t]):
            m.AddHint(x, o == c)
            for n, y in ys[t][o].items():
                if y is not x:
                    m.AddHint(y, o == c and n in hint.nodes[t])
    m.AddHint(C, horizon)

    solver = new_solver(time_limit_s, seed=seed, deterministic=deterministic, gap=gap)

    def extract() -> Schedule:
        option, start, nodes = [], [], []
        for t in range(problem.num_tasks):
            o = next(i for i, x in enumerate(xs[t]) if solver.Value(x))
            option.append(o)
            start.append(solver.Value(starts[t]) * unit)
            nodes.append(tuple(sorted(n for n, y in ys[t][o].items() if solver.Value(y))))
        return problem.schedule(option, start, nodes)

    status = solve_until(solver, m, None if stop_at_s is None else stop_at_s / unit)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        logger.info("CP-SAT found no schedule in %.1f s (status %s)", time_limit_s, solver.StatusName(status))
        return None
    sched = extract()
    if on_schedule is not None:
        on_schedule(sched)
    lb_units = solver.BestObjectiveBound()
    proven = lb_units * unit if exact else (lb_units - problem.num_tasks - 1) * unit
    # With a gap, CP-SAT reports OPTIMAL once within it: optimal only where the bound is met.
    optimal = status == cp_model.OPTIMAL and exact and solver.ObjectiveValue() <= lb_units + 1e-9
    return CpSatResult(sched, max(0.0, proven), optimal, unit, not exact)


def new_solver(time_limit_s: float, *, seed: int, deterministic: bool, gap: float = 0.0):
    """A CP-SAT solver for ``time_limit_s``: in deterministic mode counted in deterministic time on
    one worker (the wall clock a safety net only), else wall seconds on up to 2 workers; it stops
    at a relative ``gap`` to its own bound."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    p = solver.parameters
    p.random_seed = seed
    if deterministic:
        p.max_deterministic_time = max(0.05, time_limit_s)
        p.max_time_in_seconds = max(10.0, SAFETY_FACTOR * time_limit_s)  # a safety net only
        p.num_workers = 1
    else:
        p.max_time_in_seconds = max(0.05, time_limit_s)
        p.num_workers = 2 if time_limit_s >= 1 else 1
    if gap > 0:
        p.relative_gap_limit = float(gap)
    p.log_search_progress = False
    return solver


def solve_until(solver, model, stop_at: float | None):
    """``solver.Solve(model)``, stopped at the first solution of objective <= ``stop_at`` (model
    units; ``None``: not stopped early)."""
    if stop_at is None:
        return solver.Solve(model)
    from ortools.sat.python import cp_model

    class _Stop(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            if self.ObjectiveValue() <= stop_at + 1e-9:
                self.StopSearch()

    return solver.Solve(model, _Stop())
