"""``saturn``: the SPASE model (select a parallelism, allocate GPUs, schedule) on CP-SAT.

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

The search is warm-started with the heuristic's best schedule (recomputed on
the rounded durations, so the hint is feasible) and bounded above by it, so
the returned plan is never worse than the heuristic's. CP-SAT's proven
objective bound becomes a lower bound in seconds: exactly ``C_lb u`` when no
duration was rounded, and ``(C_lb - n - 1) u`` otherwise (rounding up n
durations lengthens an optimal schedule by at most ``(n + 1) u``).
"""

from __future__ import annotations

import logging
import math
import time

from ray_saturn.solver.decompose import decomposed_start
from ray_saturn.solver.heuristic import heuristic_schedule
from ray_saturn.solver.listsched import list_schedule, replay_schedule
from ray_saturn.solver.policy import Policy, PolicyResult, get_policy, register_policy
from ray_saturn.solver.problem import Problem, Schedule

logger = logging.getLogger(__name__)

#: Target number of time units in the horizon.
RESOLUTION = 20_000
#: Above this many node intervals the exact model is not built (too big to help in time).
MAX_INTERVALS = 12_000
#: Local-search decodings per second of time limit in deterministic mode.
EVALS_PER_SECOND = 300
#: In deterministic mode a wall clock only stops a search that overruns its work budget this many
#: times over (a safety net): a loaded machine must not change the plan.
SAFETY_FACTOR = 50


def _unit(problem: Problem, horizon_s: float) -> tuple[float, bool]:
    """The time unit, and whether every time is an exact multiple of it."""
    values = [o.duration_s for opts in problem.options for o in opts]
    values += [float(r) for r in problem.release] + [float(a) for a in problem.node_avail]
    if all(float(v).is_integer() for v in values) and horizon_s <= 50 * RESOLUTION:
        return 1.0, True
    unit = max(horizon_s / RESOLUTION, 1e-6)
    exact = all(abs(v / unit - round(v / unit)) < 1e-9 for v in values)
    return unit, exact


@register_policy
class SaturnPolicy(Policy):
    """The default policy: heuristic first plan, then the exact model where it fits.

    Small and medium problems (at most :data:`MAX_INTERVALS` node intervals)
    give the heuristic a short share of the time limit and CP-SAT the rest;
    larger ones spend the whole limit in the heuristic's local search, which
    improves faster than CP-SAT can load and search a model that size.

    With ``deterministic=True`` the limits are counted in work, not seconds
    (local-search decodings and CP-SAT's deterministic time on one worker), so
    the plan depends only on the inputs and the seed.
    """

    name = "saturn"

    def __init__(self, deterministic: bool = False) -> None:
        self.deterministic = deterministic

    def solve(self, problem, bound, *, time_limit_s, seed, on_schedule=None):
        t0 = time.perf_counter()
        first: list[float] = []

        def seen(s: Schedule) -> None:
            if not first:
                first.append(time.perf_counter() - t0)
            if on_schedule:
                on_schedule(s)

        # The baselines are cheap: their schedules seed the search, so saturn is never worse.
        baselines = [
            get_policy(name).solve(problem, bound, time_limit_s=0, seed=seed).schedule
            for name in ("fifo-fastest", "fifo-min-gpus", "fifo-whole-node", "optimus-greedy")
        ]
        # A re-plan also starts from the plan being followed, so it is never predicted worse than carrying on.
        hint = problem.incumbent_hint()
        if hint is not None:
            choice, order, nodes_of = hint
            baselines += [replay_schedule(problem, choice, order, nodes_of), list_schedule(problem, choice, order)]
        n_intervals = sum(len(o) for o in problem.options) * problem.num_nodes
        exact = n_intervals <= MAX_INTERVALS
        share = min(5.0, 0.2 * time_limit_s) if exact else time_limit_s
        pop = None
        if not exact:  # too big for the exact model: on very large clusters, start from a decomposition
            pop = decomposed_start(problem, bound, time_limit_s=time_limit_s, seed=seed,
                                   deterministic=self.deterministic, on_schedule=seen)
            if pop is not None and pop.makespan <= bound.value * (1 + 1e-9):
                return PolicyResult(pop, bound.value, True, first[0])
            share = max(0.0, time_limit_s - (time.perf_counter() - t0)) if pop is not None else share
        heur = heuristic_schedule(
            problem,
            bound,
            time_limit_s=max(10.0, SAFETY_FACTOR * share) if self.deterministic else share,
            seed=seed,
            on_schedule=seen,
            max_evaluations=int(EVALS_PER_SECOND * share) if self.deterministic else None,
            candidates=baselines,
        )
        best = heur.schedule if pop is None or heur.schedule.makespan <= pop.makespan else pop
        if best.makespan <= bound.value * (1 + 1e-9):
            return PolicyResult(best, bound.value, True, first[0] if first else None)
        remaining = time_limit_s - (time.perf_counter() - t0)
        if not exact:
            logger.info("exact model skipped: %d node intervals > %d", n_intervals, MAX_INTERVALS)
            return PolicyResult(best, 0.0, False, first[0])
        if remaining < 0.05 and not self.deterministic:
            return PolicyResult(best, 0.0, False, first[0])
        budget = time_limit_s - share if self.deterministic else remaining
        result = _cp_sat(problem, heur.choice, heur.order, best.makespan, budget, seed, seen, self.deterministic)
        if result is None:
            return PolicyResult(best, 0.0, False, first[0])
        sched, proven, optimal = result
        if sched is not None and sched.makespan < best.makespan - 1e-9:
            best = sched
        else:
            optimal = optimal and sched is not None and abs(sched.makespan - best.makespan) < 1e-9
        return PolicyResult(best, proven, optimal, first[0])


def _cp_sat(problem: Problem, choice, order, ub_s: float, time_limit_s: float, seed: int, on_schedule,
            deterministic: bool = False):
    from ortools.sat.python import cp_model

    unit, exact = _unit(problem, ub_s)
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
    p.log_search_progress = False

    def extract() -> Schedule:
        option, start, nodes = [], [], []
        for t in range(problem.num_tasks):
            o = next(i for i, x in enumerate(xs[t]) if solver.Value(x))
            option.append(o)
            start.append(solver.Value(starts[t]) * unit)
            nodes.append(tuple(sorted(n for n, y in ys[t][o].items() if solver.Value(y))))
        return problem.schedule(option, start, nodes)

    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        logger.info("CP-SAT found no schedule in %.1f s (status %s)", time_limit_s, solver.StatusName(status))
        return None
    sched = extract()
    on_schedule(sched)
    lb_units = solver.BestObjectiveBound()
    proven = lb_units * unit if exact else (lb_units - problem.num_tasks - 1) * unit
    optimal = status == cp_model.OPTIMAL and exact
    return sched, max(0.0, proven), optimal
