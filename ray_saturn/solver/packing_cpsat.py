"""The exact SPASE model with device shares and GPU types, on CP-SAT.

The model of :mod:`ray_saturn.solver.cpsat`, one level down: every device is
a resource of :data:`~ray_saturn.solver.packing.UNITS` units. Notation as
there, plus per option ``o``: ``w_o`` units per device (``8/k`` for a 1/k
share, 8 for whole GPUs) and ``m_o`` devices per node (1 for a share, else
``q_o``); ``N_o`` the nodes of its GPU type (all nodes for an untyped row).

Variables:
    ``s_t``         integer start of task t
    ``x_to``        boolean, task t runs with option o
    ``y_ton``       boolean, option o of task t occupies node n (n in N_o)
    ``z_tod``       boolean, option o of task t occupies device d
    ``C``           integer makespan

Constraints:
    ``sum_o x_to = 1``                                    one option per task
    ``sum_n y_ton = k_o x_to``                            k_o distinct nodes of its type
    ``sum_{d in n} z_tod = m_o y_ton``                     m_o devices on each of them
    ``cumulative_d({[s_t, s_t + D_o) : z_tod}, w_o) <= 8`` per device d
        (an unavailable node's devices are blocked until it is available)
    ``cumulative_n({[s_t, s_t + D_o) : y_ton}, m_o w_o) <= 8 G_n``  redundant, per node
    ``C >= s_t + sum_o D_o x_to``                          for each t
    a running task kept in place: ``x_to => s_t = 0`` on its nodes (and on the devices it holds, when named).

Objective: minimise ``C``. Warm-started with the device-level list schedule
of a given choice and order (on the rounded durations, so the hint is
feasible), and never returned worse than it. The rounding of times to a unit
and the bound it proves are as in :mod:`ray_saturn.solver.cpsat` (devices
are resources like nodes there; the argument does not change).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from ray_saturn.solver.cpsat import RESOLUTION, CpSatResult, new_solver, solve_until, time_unit
from ray_saturn.solver.packing import UNITS, devices_per_node, pack_schedule, units
from ray_saturn.solver.problem import Problem, Schedule

__all__ = ["MAX_DEVICE_INTERVALS", "solve_packing_cpsat"]

logger = logging.getLogger(__name__)

#: Above this many (option, device) intervals the exact packing model is not built.
MAX_DEVICE_INTERVALS = 6_000


def device_intervals(problem: Problem) -> int:
    """How many optional device intervals the model would hold."""
    total = 0
    for opts in problem.options:
        for o in opts:
            nodes = o.pinned_nodes or o.nodes_ok or range(problem.num_nodes)
            total += sum(int(problem.node_gpus[n]) for n in nodes)
    return total


def solve_packing_cpsat(
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
    """Solve the device-level model (see the module docstring), warm-started with ``choice`` in ``order``
    (``gap``, ``stop_at_s``: as :func:`~ray_saturn.solver.cpsat.solve_cpsat`).

    Returns ``None`` when CP-SAT finds no schedule within the limit.
    """
    from ortools.sat.python import cp_model

    unit, exact = time_unit(problem, horizon_s, resolution)
    D = [[max(1, math.ceil(o.duration_s / unit - 1e-9)) for o in opts] for opts in problem.options]
    hint = pack_schedule(problem, choice, order, durations=[D[t][c] * unit for t, c in enumerate(choice)])
    horizon = math.ceil(hint.makespan / unit - 1e-9)
    m = cp_model.CpModel()
    caps = [int(g) for g in problem.node_gpus]
    dev_iv: list[list[list]] = [[[] for _ in range(g)] for g in caps]
    dev_dem: list[list[list[int]]] = [[[] for _ in range(g)] for g in caps]
    node_iv: list[list] = [[] for _ in caps]
    node_dem: list[list[int]] = [[] for _ in caps]
    C = m.NewIntVar(0, horizon, "makespan")
    for n, g in enumerate(caps):
        block = math.ceil(problem.node_avail[n] / unit - 1e-9)
        if block > 0:
            for d in range(g):
                dev_iv[n][d].append(m.NewFixedSizeIntervalVar(0, block, f"blocked_{n}_{d}"))
                dev_dem[n][d].append(UNITS)
    starts, xs, ys, zs = [], [], [], []
    for t, opts in enumerate(problem.options):
        rel = math.ceil(problem.release[t] / unit - 1e-9)
        s = m.NewIntVar(rel, max(rel, horizon - min(D[t])), f"s_{t}")
        starts.append(s)
        xt, yt, zt = [], [], []
        for o, opt in enumerate(opts):
            x = m.NewBoolVar(f"x_{t}_{o}")
            xt.append(x)
            w, per = units(opt), devices_per_node(opt)
            if opt.pinned_nodes is not None:
                m.Add(s == 0).OnlyEnforceIf(x)
                eligible = list(opt.pinned_nodes)
            else:
                base = opt.nodes_ok if opt.nodes_ok is not None else range(len(caps))
                eligible = [n for n in base if caps[n] >= per]
            yo, zo = {}, {}
            for n in eligible:
                y = m.NewBoolVar(f"y_{t}_{o}_{n}")
                m.AddImplication(y, x)
                yo[n] = y
                node_iv[n].append(m.NewOptionalFixedSizeIntervalVar(s, D[t][o], y, f"nv_{t}_{o}_{n}"))
                node_dem[n].append(w * per)
                zn = []
                held = opt.pinned_devices.get(n) if opt.pinned_devices is not None else None
                for d in range(caps[n]) if held is None else held:  # kept in place: on the devices it holds
                    z = m.NewBoolVar(f"z_{t}_{o}_{n}_{d}")
                    zo[(n, d)] = z
                    zn.append(z)
                    dev_iv[n][d].append(m.NewOptionalFixedSizeIntervalVar(s, D[t][o], z, f"dv_{t}_{o}_{n}_{d}"))
                    dev_dem[n][d].append(w)
                m.Add(sum(zn) == per * y)
            if opt.pinned_nodes is not None:
                for y in yo.values():
                    m.Add(y == x)
            else:
                m.Add(sum(yo.values()) == opt.k * x)
            yt.append(yo)
            zt.append(zo)
        m.AddExactlyOne(xt)
        m.Add(s + sum(D[t][o] * xt[o] for o in range(len(opts))) <= C)
        xs.append(xt)
        ys.append(yt)
        zs.append(zt)
    for n, g in enumerate(caps):
        for d in range(g):
            if dev_iv[n][d]:
                m.AddCumulative(dev_iv[n][d], dev_dem[n][d], UNITS)
        if node_iv[n]:
            m.AddCumulative(node_iv[n], node_dem[n], UNITS * g)
    m.Minimize(C)
    assert hint.devices is not None
    for t in range(problem.num_tasks):
        c = hint.option[t]
        m.AddHint(starts[t], round(hint.start[t] / unit))
        used = {(n, d) for n, ds in hint.devices[t].items() for d, _ in ds}
        for o, x in enumerate(xs[t]):
            m.AddHint(x, o == c)
            for n, y in ys[t][o].items():
                m.AddHint(y, o == c and n in hint.nodes[t])
            for key, z in zs[t][o].items():
                m.AddHint(z, o == c and key in used)
    m.AddHint(C, horizon)

    solver = new_solver(time_limit_s, seed=seed, deterministic=deterministic, gap=gap)
    status = solve_until(solver, m, None if stop_at_s is None else stop_at_s / unit)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        logger.info("packing CP-SAT found no schedule in %.1f s (status %s)", time_limit_s, solver.StatusName(status))
        return None
    option, start, nodes, devices = [], [], [], []
    for t, opts in enumerate(problem.options):
        o = next(i for i, x in enumerate(xs[t]) if solver.Value(x))
        option.append(o)
        start.append(solver.Value(starts[t]) * unit)
        nodes.append(tuple(sorted(n for n, y in ys[t][o].items() if solver.Value(y))))
        share = opts[o].config.gpus if opts[o].config.gpus < 1 else 1.0
        per: dict[int, list[tuple[int, float]]] = {}
        for (n, d), z in sorted(zs[t][o].items()):
            if solver.Value(z):
                per.setdefault(n, []).append((d, float(share)))
        devices.append({n: tuple(v) for n, v in per.items()})
    sched = Schedule(option, start, nodes, problem.durations(option), devices)
    if on_schedule is not None:
        on_schedule(sched)
    lb_units = solver.BestObjectiveBound()
    proven = lb_units * unit if exact else (lb_units - problem.num_tasks - 1) * unit
    # With a gap, CP-SAT reports OPTIMAL once within it: optimal only where the bound is met.
    optimal = status == cp_model.OPTIMAL and exact and solver.ObjectiveValue() <= lb_units + 1e-9
    return CpSatResult(sched, max(0.0, proven), optimal, unit, not exact)
