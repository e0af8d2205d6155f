"""Device-level packing: shares of one GPU and GPU types, placed jointly with everything else.

A problem *packs* (:attr:`~ray_saturn.solver.problem.Problem.packing`) when
some option is a share of one device (``gpus`` = 1/k) or may run only on
nodes of one GPU type. Its schedules then say, per task, which devices of
which nodes it holds: a share holds one device at 1/k, whole GPUs hold
``gpus / nodes`` devices per node at 1.0. Every device is a resource of
:data:`UNITS` units (1/8 of a GPU each), so shares are whole numbers of
units and no floating-point sum can overflow a device.

The list-scheduling engine of :mod:`ray_saturn.solver.listsched` hands a
packing problem to :func:`pack_schedule` here, so every policy (the
baselines, the heuristic's local search, saturn) places shares and types
the same way. It is serial schedule generation on device timelines: each
task, in priority order, at its earliest start on nodes of its type where
its devices are free for its whole duration; among equal starts the node and
device already most used then (best fit, so whole devices stay free for
whole-GPU tasks and shares fill devices already shared).

Variants, for the policies built on them:

- ``strict``: no task starts before the one before it in the order (first
  come, first served);
- ``whole_node``: a task holds every device of its nodes (``fifo-whole-node``); a running task
  kept in place holds what it uses, as in every variant;
- ``nodes_of``: a task's planned nodes (replaying a plan);
- ``not_before`` per task is implied by ``strict`` only.

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> from ray_saturn.solver import build_problem
    >>> rows = [{"task": f"t{i}", "strategy": "single", "gpus": 0.25, "step_time_s": 2.0, "steps": 10}
    ...         for i in range(5)]
    >>> p = build_problem(ProfileTable.from_rows(rows), ClusterSpec.uniform(1, 1))
    >>> s = pack_schedule(p, [0] * 5, range(5))
    >>> s.start, s.devices[4]
    ([0.0, 0.0, 0.0, 0.0, 20.0], {0: ((0, 0.25),)})
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ray_saturn.errors import InfeasibleError
from ray_saturn.solver.listsched import _first_k_fit, _NodeProfile
from ray_saturn.solver.problem import Option, Problem, Schedule

__all__ = ["UNITS", "pack_schedule", "units"]

#: Units of one device: shares 1/2, 1/4, 1/8 are 4, 2, 1 of them.
UNITS = 8


def units(option: Option) -> int:
    """Device units one device of ``option`` takes: 8/k for a 1/k share, all 8 for a whole GPU."""
    g = option.config.gpus
    return round(UNITS * g) if g < 1 else UNITS


def devices_per_node(option: Option) -> int:
    """Devices ``option`` holds on each of its nodes: 1 for a share, else its GPUs per node."""
    return 1 if option.config.gpus < 1 else int(option.per_node)


class _Devices:
    """Per node, one timeline of used units per device."""

    def __init__(self, problem: Problem) -> None:
        self.caps = [int(g) for g in problem.node_gpus]
        self.dev = [[_NodeProfile(UNITS) for _ in range(g)] for g in self.caps]

    def used_at(self, n: int, t: float) -> int:
        return sum(p.used_at(t) for p in self.dev[n])

    def node_first_fit(self, n: int, s: float, d: float, q: int, m: int) -> tuple[float, tuple[int, ...]] | None:
        """Earliest start >= s at which ``m`` devices of node n hold ``q`` units each for ``d``, and which."""
        if m > self.caps[n]:
            return None
        if m == 1:
            best = None
            for i, p in enumerate(self.dev[n]):
                e = p.earliest(s, d, q, best[0] if best is not None else math.inf)
                if math.isinf(e):
                    continue
                key = (e, -p.used_at(e), i)
                if best is None or key < best:
                    best = key
            return None if best is None else (best[0], (best[2],))
        return _first_k_fit(self.dev[n], range(self.caps[n]), s, d, q, m)

    def add(self, n: int, devs: Sequence[int], s: float, d: float, q: int) -> None:
        for i in devs:
            self.dev[n][i].add(s, d, q)


def _eligible(problem: Problem, opt: Option) -> list[int]:
    """Nodes (of the option's type) with the devices it uses on each node; holding a whole node
    (``whole_node``) does not make a node smaller than the option fit it."""
    m = devices_per_node(opt)
    nodes = opt.nodes_ok if opt.nodes_ok is not None else range(problem.num_nodes)
    return [n for n in nodes if int(problem.node_gpus[n]) >= m]


def _place(
    problem: Problem, devs: _Devices, t: int, opt: Option, r: float, d: float, whole_node: bool,
    nodes: Sequence[int] | None,
) -> tuple[float, dict[int, tuple[int, ...]]] | None:
    """Earliest start >= r of option ``opt`` for ``d`` seconds, and its devices per node."""
    q = UNITS if whole_node else units(opt)
    eligible = list(nodes) if nodes is not None else _eligible(problem, opt)

    def need(n: int) -> int:
        return devs.caps[n] if whole_node else devices_per_node(opt)

    if opt.k == 1:
        best = None
        for n in eligible:
            found = devs.node_first_fit(n, r, d, q, need(n))
            if found is None:
                continue
            s, ds = found
            if best is not None and s > best[0][0]:
                continue
            key = (s, -devs.used_at(n, s), n)
            if best is None or key < best[0]:
                best = (key, ds)
        if best is None:
            return None
        return best[0][0], {best[0][2]: best[1]}
    # k nodes: jump to the k-th smallest first fit until k nodes fit at the same start.
    s = r
    e: dict[int, float] = {}
    for n in eligible:
        f = devs.node_first_fit(n, s, d, q, need(n))
        if f is not None:
            e[n] = f[0]
    while True:
        if len(e) < opt.k:
            return None
        kth = sorted(e.values())[opt.k - 1]
        if kth <= s + 1e-12:
            break
        s = kth
        for n in list(e):
            if e[n] < s:
                f = devs.node_first_fit(n, s, d, q, need(n))
                if f is None:
                    del e[n]
                else:
                    e[n] = f[0]
    fit = []
    for n in e:
        f = devs.node_first_fit(n, s, d, q, need(n))
        if f is not None and f[0] <= s + 1e-12:
            fit.append((-devs.used_at(n, s), n, f[1]))
    if len(fit) < opt.k:  # pragma: no cover - floating-point ties only
        return None
    fit.sort()
    return s, {n: ds for _, n, ds in fit[: opt.k]}


def pack_schedule(
    problem: Problem,
    choice: Sequence[int],
    order: Sequence[int],
    *,
    strict: bool = False,
    whole_node: bool = False,
    nodes_of: Sequence[tuple[int, ...] | None] | None = None,
    durations: Sequence[float] | None = None,
) -> Schedule:
    """Place every task with its chosen option on devices, in priority ``order`` (see the module docstring)."""
    n = problem.num_tasks
    order = list(order)
    if sorted(order) != list(range(n)):
        raise ValueError("order must be a permutation of the task indices")
    dur = list(durations) if durations is not None else problem.durations(list(choice))
    opts = [problem.options[t][choice[t]] for t in range(n)]
    devs = _Devices(problem)
    for i, avail in enumerate(problem.node_avail):
        if avail > 0:
            devs.add(i, range(devs.caps[i]), 0.0, float(avail), UNITS)
    start = [0.0] * n
    nodes: list[tuple[int, ...]] = [()] * n
    devices: list[dict[int, tuple[tuple[int, float], ...]]] = [{} for _ in range(n)]

    def commit(t: int, s: float, where: dict[int, tuple[int, ...]], q: int | None = None) -> None:
        opt = opts[t]
        start[t] = s
        nodes[t] = tuple(sorted(where))
        q = q if q is not None else UNITS if whole_node else units(opt)
        share = opt.config.gpus if opt.config.gpus < 1 else 1.0
        for node, ds in where.items():
            devs.add(node, ds, s, dur[t], q)
            own = ds[: devices_per_node(opt)]  # a whole-node task uses its own devices, holds the rest
            devices[t][node] = tuple((int(i), float(share)) for i in own)

    # Running tasks kept in place hold what they use, whatever the variant (whole_node is for tasks
    # that start: they wait for wholly free nodes). Those that name their devices first, on them.
    for t, opt in enumerate(opts):
        if opt.pinned_devices is not None:
            q = units(opt)
            for node, ds in opt.pinned_devices.items():
                if not all(0 <= d < devs.caps[node] and devs.dev[node][d].fits(0.0, dur[t], q) for d in ds):
                    raise InfeasibleError(
                        f"running task {problem.tasks[t]} no longer fits the devices {list(ds)} it holds on "
                        f"node {problem.node_names[node]}"
                    )
            commit(t, 0.0, dict(opt.pinned_devices), q)
    # Then the others on devices of their nodes free at 0, the most units per node first (whole GPUs
    # before shares, larger shares before smaller: with shares of 1/2, 1/4 and 1/8, best fit in that
    # order strands no task that the devices left over can hold).
    loose = [t for t, opt in enumerate(opts) if opt.pinned_nodes is not None and opt.pinned_devices is None]
    loose.sort(key=lambda t: (-units(opts[t]) * devices_per_node(opts[t]), t))
    for t in loose:
        opt = opts[t]
        found = _place(problem, devs, t, opt, 0.0, dur[t], False, opt.pinned_nodes)
        if found is None or found[0] > 1e-9:
            raise InfeasibleError(f"running task {problem.tasks[t]} no longer fits its devices on its nodes")
        commit(t, 0.0, found[1], units(opt))
    last = 0.0
    for t in order:
        opt = opts[t]
        if opt.pinned_nodes is not None:
            continue
        r = float(problem.release[t])
        if strict:
            r = max(r, last)
        planned = nodes_of[t] if nodes_of is not None else None
        found = _place(problem, devs, t, opt, r, dur[t], whole_node, planned)
        if found is None and planned is not None:
            found = _place(problem, devs, t, opt, r, dur[t], whole_node, None)
        if found is None:
            where = f"nodes of type {opt.config.gpu_type}" if opt.config.gpu_type else "nodes"
            raise InfeasibleError(
                f"task {problem.tasks[t]} can never start: no {opt.k} {where} hold its "
                f"{opt.config.gpus} GPU(s) on devices"
            )
        commit(t, found[0], found[1])
        last = max(last, found[0])
    return Schedule(list(choice), start, nodes, dur, devices)
