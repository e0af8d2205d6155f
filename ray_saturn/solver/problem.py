"""The scheduling problem as arrays: built once, read by every policy.

This is the one place where a ProfileTable, a ClusterSpec and a
PlanningContext are turned into what solvers work on:

- ``tasks``: task names, in profile (FIFO) order;
- ``options[t]``: the ways to run task ``t`` that fit the cluster, each an
  :class:`Option` (configuration, duration = any restart set-up + the
  configuration's start-up + its steps, GPUs per node, node count, and, for
  a running task kept in place, its pinned nodes: steps only, it started
  already);
- ``node_gpus``, ``node_avail``: per node, its GPUs and when it is free;
- ``release``: per task, the earliest start.

Dominated options are pruned: an option is dropped when another one of the
same task with the same node count is no slower and uses no more GPUs. This
never removes an optimal plan (swap the dominated option for its dominator
in any schedule: it ends no later on a subset of the same GPUs).

Solvers return a :class:`Schedule` (option index, start, node indices per
task); :meth:`Problem.to_plan` is the one conversion to the public Plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ray_saturn.context import PlanningContext
from ray_saturn.errors import InfeasibleError, ProfileError, SpecError
from ray_saturn.plan import Assignment, Plan
from ray_saturn.profile_table import Config, ProfileTable
from ray_saturn.spec import ClusterSpec

__all__ = ["BOUND_TOL", "Option", "Problem", "Schedule", "build_problem"]


@dataclass(frozen=True)
class Option:
    """One way to run one task (a feasible profile row that fits the cluster)."""

    config: Config
    duration_s: float
    setup_s: float
    k: int
    per_node: int | float
    pinned_nodes: tuple[int, ...] | None = None
    #: The node indices of the option's GPU type (a row measured on one type); ``None``: every node.
    nodes_ok: tuple[int, ...] | None = None
    #: A running task kept in place that names its devices: node index -> the device indices it holds.
    pinned_devices: Mapping[int, tuple[int, ...]] | None = None

    @property
    def gpus(self) -> int | float:
        return self.config.gpus

    @property
    def area(self) -> float:
        """GPU-seconds the option occupies (device-share-seconds for a share of one GPU)."""
        return self.config.gpus * self.duration_s

    @property
    def pinned(self) -> bool:
        return self.pinned_nodes is not None


@dataclass
class Schedule:
    """A solver's answer: for each task, the option index, start time and node indices."""

    option: list[int]
    start: list[float]
    nodes: list[tuple[int, ...]]
    durations: list[float] = field(default_factory=list)
    #: Per task, node index -> ((device, share), ...): set by device-level packing
    #: (:mod:`ray_saturn.solver.packing`), ``None`` for whole GPUs on untyped nodes.
    devices: list[dict[int, tuple[tuple[int, float], ...]]] | None = None

    @property
    def makespan(self) -> float:
        if not self.start:
            return 0.0
        return max(s + d for s, d in zip(self.start, self.durations, strict=False))


@dataclass
class Problem:
    tasks: list[str]
    options: list[list[Option]]
    node_names: list[str]
    node_gpus: np.ndarray
    node_avail: np.ndarray
    release: np.ndarray
    profile: ProfileTable
    cluster: ClusterSpec
    context: PlanningContext

    @property
    def packing(self) -> bool:
        """True when some option shares a device or runs only on one GPU type: schedules then place
        tasks on devices (:mod:`ray_saturn.solver.packing`)."""
        return any(o.config.gpus < 1 or o.nodes_ok is not None for opts in self.options for o in opts)

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    @property
    def total_gpus(self) -> int:
        return int(self.node_gpus.sum())

    def pinned_option(self, t: int) -> int | None:
        """Index of task t's keep-in-place option (a running task), or None."""
        for i, o in enumerate(self.options[t]):
            if o.pinned:
                return i
        return None

    def choose(self, key: Callable[[int, Option], Any]) -> list[int]:
        """Per task, the option minimising ``key(task, option)``; a running task's pinned option wins."""
        out = []
        for t, opts in enumerate(self.options):
            p = self.pinned_option(t)
            out.append(p if p is not None else min(range(len(opts)), key=lambda i: key(t, opts[i])))
        return out

    def incumbent_hint(self) -> tuple[list[int], list[int], list[tuple[int, ...] | None]] | None:
        """The context's incumbent plan as (option, priority order, nodes) per task, or ``None``.

        A running task keeps its pinned option, unless the incumbent moves it
        (another configuration or other nodes) and it may move there (an
        option with that configuration, its set-up included); a task with its incumbent
        configuration among the options gets it on its incumbent nodes (when
        they are all still here and hold its GPUs), else the fastest option with the same node
        count and no more GPUs (the one that pruned it), else its fastest
        option, on nodes chosen when its turn comes. The order is the
        incumbent's, then the other tasks by release time.
        """
        inc = self.context.incumbent
        if inc is None:
            return None
        node_index = {n: i for i, n in enumerate(self.node_names)}
        choice: list[int] = []
        nodes_of: list[tuple[int, ...] | None] = []
        for t, name in enumerate(self.tasks):
            opts = self.options[t]
            pinned = self.pinned_option(t)
            want = inc.placements.get(name)
            if pinned is not None:
                moved = self._incumbent_move(t, want, node_index) if want is not None else None
                choice.append(pinned if moved is None else moved[0])
                nodes_of.append(opts[pinned].pinned_nodes if moved is None else moved[1])
                continue
            fastest = min(range(len(opts)), key=lambda i: (opts[i].duration_s, i))
            if want is None:
                choice.append(fastest)
                nodes_of.append(None)
                continue
            strategy, gpus, names = want
            k = len(names)
            here = {node_index[n] for n in names if n in node_index}

            def on_type(o: Option, here: set[int] = here) -> bool:  # a typed option: the incumbent's nodes
                return o.nodes_ok is None or here <= set(o.nodes_ok)  # only when they are of its type

            exact = [i for i, o in enumerate(opts) if (o.config.strategy, o.gpus, o.k) == (strategy, gpus, k)]
            exact.sort(key=lambda i: not on_type(opts[i]))
            near = [i for i, o in enumerate(opts) if o.k == k and o.gpus <= gpus]
            if exact:
                choice.append(exact[0])
            elif near:
                choice.append(min(near, key=lambda i: (opts[i].duration_s, i)))
            else:
                choice.append(fastest)
            q = opts[choice[-1]].per_node
            fits = opts[choice[-1]].k == k and on_type(opts[choice[-1]]) and all(
                n in node_index and self.node_gpus[node_index[n]] >= q for n in names
            )
            nodes_of.append(tuple(sorted(node_index[n] for n in names)) if fits else None)
        rank = {name: i for i, name in enumerate(inc.order)}
        order = sorted(
            range(self.num_tasks),
            key=lambda t: (rank.get(self.tasks[t], len(rank)), float(self.release[t]), t),
        )
        return choice, order, nodes_of

    def _incumbent_move(
        self, t: int, want: tuple[str, int, tuple[str, ...]], node_index: Mapping[str, int]
    ) -> tuple[int, tuple[int, ...]] | None:
        """Running task t's movable option and nodes where the incumbent puts it, when that is a move."""
        strategy, gpus, names = want
        opts = self.options[t]
        here = opts[self.pinned_option(t)]
        nodes = tuple(sorted(node_index[n] for n in names if n in node_index))
        if len(nodes) != len(names) or (
            (here.config.strategy, here.gpus) == (strategy, gpus) and nodes == tuple(sorted(here.pinned_nodes))
        ):
            return None
        for i, o in enumerate(opts):
            if (
                not o.pinned
                and (o.config.strategy, o.gpus, o.k) == (strategy, gpus, len(names))
                and (o.nodes_ok is None or set(nodes) <= set(o.nodes_ok))
                and all(self.node_gpus[n] >= o.per_node for n in nodes)
            ):
                return i, nodes
        return None

    def _kept_in_place(self, t: int, o: int, start: float, nodes: tuple[int, ...],
                       devices: Mapping[int, tuple[tuple[int, float], ...]] | None = None) -> Option | None:
        """Running task t's pinned option, when the schedule "restarts" it at 0 on its own
        configuration, nodes and (if it names them) devices: that is carrying on, which needs no
        start-up (the plan says so, as the validator and the controller read it). ``None`` otherwise."""
        p = self.pinned_option(t)
        if p is None or o == p or start > 0:
            return None
        here = self.options[t][p]
        # Both options are made from the same profile row when the schedule restarts it on its own.
        if self.options[t][o].config != here.config or set(nodes) != set(here.pinned_nodes):
            return None
        if here.pinned_devices is not None:
            planned = {n: tuple(sorted(d for d, _ in ds)) for n, ds in (devices or {}).items() if ds}
            held = {n: tuple(sorted(ds)) for n, ds in here.pinned_devices.items() if ds}
            if planned != held:
                return None  # other devices of its nodes: a restart there
        return here

    def durations(self, choice: list[int]) -> list[float]:
        return [self.options[t][o].duration_s for t, o in enumerate(choice)]

    def schedule(self, option: list[int], start: list[float], nodes: list[tuple[int, ...]]) -> Schedule:
        return Schedule(list(option), list(start), list(nodes), self.durations(option))

    def to_plan(
        self,
        sched: Schedule,
        *,
        policy: str,
        lower_bound_s: float,
        solve_time_s: float,
        status: str | None = None,
    ) -> Plan:
        assignments = []
        for t, name in enumerate(self.tasks):
            opt = self.options[t][sched.option[t]]
            start = float(sched.start[t])
            nodes = tuple(sched.nodes[t])
            devices = None
            if sched.devices is not None:
                devices = {self.node_names[n]: ds for n, ds in sched.devices[t].items()}
            here = self._kept_in_place(t, sched.option[t], start, nodes,
                                       sched.devices[t] if sched.devices is not None else None)
            if here is not None:
                opt, nodes = here, here.pinned_nodes
            assignments.append(
                Assignment(
                    task=name,
                    strategy=opt.config.strategy,
                    gpus=opt.config.gpus,
                    nodes=tuple(self.node_names[n] for n in nodes),
                    start_s=start,
                    end_s=start + opt.duration_s,
                    setup_s=opt.setup_s,
                    devices=devices,
                    gpu_type=opt.config.gpu_type,
                )
            )
        makespan = max((a.end_s for a in assignments), default=0.0)
        if status is None:
            status = "optimal" if makespan <= lower_bound_s * (1 + BOUND_TOL) + BOUND_TOL else "feasible"
        return Plan(policy, makespan, lower_bound_s, solve_time_s, status, assignments)


#: Relative (and absolute, in seconds) floating-point slack when a bound is compared with a makespan.
BOUND_TOL = 1e-9


def _dominates(a: Option, b: Option) -> bool:
    same_nodes = a.nodes_ok is None or a.nodes_ok == b.nodes_ok  # a runs wherever b does
    return a.k == b.k and a.duration_s <= b.duration_s and a.gpus <= b.gpus and same_nodes


def _prune(options: list[Option]) -> list[Option]:
    keep: list[Option] = []
    for i, o in enumerate(options):
        if o.pinned:
            keep.append(o)
            continue
        dominated = False
        for j, p in enumerate(options):
            if i == j or p.pinned or not _dominates(p, o):
                continue
            # Strict domination, or an exact tie broken by position.
            if p.duration_s < o.duration_s or p.gpus < o.gpus or j < i:
                dominated = True
                break
        if not dominated:
            keep.append(o)
    return keep


def build_problem(
    profile: ProfileTable,
    cluster: ClusterSpec,
    context: PlanningContext | None = None,
    *,
    prune: bool = True,
) -> Problem:
    """Turn the inputs into a :class:`Problem`; raise if some task cannot run at all."""
    if not isinstance(profile, ProfileTable):
        raise SpecError(f"profile is a {type(profile).__name__}; give a ProfileTable (ProfileTable.read(path) "
                        "reads a .csv or .parquet file, ProfileTable.from_rows(rows) takes dicts)")
    if not isinstance(cluster, ClusterSpec):
        raise SpecError(f"cluster is a {type(cluster).__name__}; give a ClusterSpec (ClusterSpec.uniform(nodes, "
                        "gpus_per_node), ClusterSpec.from_dict(d) or ClusterSpec.from_json(path))")
    if context is not None and not isinstance(context, PlanningContext):
        raise SpecError(f"context is a {type(context).__name__}; give a PlanningContext or None")
    ctx = context or PlanningContext()
    node_names = list(cluster.names)
    node_index = {n: i for i, n in enumerate(node_names)}
    node_gpus = np.array([n.gpus for n in cluster.nodes], dtype=np.int64)
    sorted_caps = np.sort(node_gpus)[::-1]
    tasks = profile.tasks
    known = set(tasks)
    for r in ctx.running:
        if r.task not in known:
            raise ProfileError(f"running task {r.task!r} has no rows in the profile; add its remaining steps")
        for n in r.nodes:
            if n not in node_index:
                raise InfeasibleError(f"running task {r.task!r} is on node {n!r}, which is not in the cluster")
            if ctx.available(n) > 0:
                raise InfeasibleError(
                    f"running task {r.task!r} is on node {n!r}, which the context marks unavailable; "
                    "a task on an unavailable node is not running: drop it from running"
                )
    for name in list(ctx.release_s) + list(ctx.node_available_s):
        if name not in known and name not in node_index:
            raise ProfileError(f"the planning context names {name!r}, which is neither a task nor a node")
    running = {r.task: r for r in ctx.running}
    options: list[list[Option]] = []
    for name in tasks:
        run = running.get(name)
        opts: list[Option] = []
        why: list[str] = []
        for cfg in profile.configs(name):
            if not cfg.feasible:
                continue
            per_node = cfg.gpus_per_node
            nodes_ok = None
            if cfg.gpu_type is not None:
                # A row measured on one GPU type runs only on nodes of that type.
                nodes_ok = tuple(i for i, n in enumerate(cluster.nodes) if n.gpu_type == cfg.gpu_type)
                caps_ok = sorted((int(node_gpus[i]) for i in nodes_ok), reverse=True)
                if cfg.nodes > len(caps_ok) or caps_ok[cfg.nodes - 1] < per_node:
                    why.append(f"{cfg.strategy}/{cfg.gpus} GPUs/{cfg.nodes} node(s) on {cfg.gpu_type}")
                    continue
            runtime = cfg.runtime_s  # start-up included: a segment launched on it starts afresh
            if run is not None and (cfg.strategy, cfg.gpus, cfg.nodes, cfg.gpu_type) == (
                run.strategy, run.gpus, len(run.nodes), run.gpu_type
            ):
                # Kept where it runs: it started already, only its steps are left, on the devices it holds.
                pinned = tuple(node_index[n] for n in run.nodes)
                devs = None
                if run.devices is not None:
                    devs = {node_index[n]: tuple(d for d, _ in v) for n, v in run.devices.items()}
                    _check_running_devices(run, devs, node_gpus, node_names)
                opts.append(Option(cfg, cfg.train_s, 0.0, cfg.nodes, per_node, pinned, nodes_ok, devs))
            if run is not None and not run.movable:
                continue
            if cfg.nodes > len(node_gpus) or sorted_caps[cfg.nodes - 1] < per_node:
                why.append(f"{cfg.strategy}/{cfg.gpus} GPUs/{cfg.nodes} node(s)")
                continue
            setup = run.restart_s if run is not None else 0.0
            opts.append(Option(cfg, setup + runtime, setup, cfg.nodes, per_node, None, nodes_ok))
        if run is not None and not any(o.pinned for o in opts):
            on = f" on {run.gpu_type}" if run.gpu_type is not None else ""
            raise ProfileError(
                f"running task {name!r} has no profile row for its current configuration "
                f"({run.strategy}, {run.gpus} GPUs, {len(run.nodes)} node(s){on}); add one with the remaining steps"
            )
        if not opts:
            if not any(c.feasible for c in profile.configs(name)):
                raise InfeasibleError(
                    f"task {name!r} has no feasible configuration in {profile.source} "
                    f"({profile.why_infeasible(name)}); profile it with more GPUs or another strategy, or drop it"
                )
            raise InfeasibleError(
                f"task {name!r} fits nowhere on this cluster: its configurations "
                f"({', '.join(why[:4])}) need more GPUs per node or more nodes (of their GPU type) than the "
                f"cluster has ({len(node_gpus)} nodes, at most {int(sorted_caps[0])} GPUs each"
                + (f", types {', '.join(sorted({str(x) for x in cluster.gpu_types}))})" if any(cluster.gpu_types)
                   else ")")
            )
        options.append(_prune(opts) if prune else opts)
    release = np.array([ctx.release(t) for t in tasks], dtype=float)
    node_avail = np.array([ctx.available(n) for n in node_names], dtype=float)
    _check_running_fits(running, node_names, node_index, node_gpus)
    return Problem(tasks, options, node_names, node_gpus, node_avail, release, profile, cluster, ctx)


def _check_running_devices(run, devs: Mapping[int, tuple[int, ...]], node_gpus, node_names) -> None:
    """A running task's devices lie on its nodes and number one (a share) or its GPUs per node."""
    want = 1 if run.gpus < 1 else int(run.gpus) // len(run.nodes)
    for n, ds in devs.items():
        if len(set(ds)) != want or len(ds) != want or not all(0 <= d < int(node_gpus[n]) for d in ds):
            raise InfeasibleError(
                f"running task {run.task!r} holds devices {list(ds)} on node {node_names[n]!r}, which has "
                f"devices 0..{int(node_gpus[n]) - 1}; it needs {want} distinct one(s) there"
            )


def _check_running_fits(running, node_names, node_index, node_gpus) -> None:
    used = np.zeros(len(node_gpus), dtype=float)
    for r in running.values():
        for n in r.nodes:
            used[node_index[n]] += r.gpus if r.gpus < 1 else r.gpus // len(r.nodes)
    over = np.nonzero(used > node_gpus + 1e-9)[0]
    if len(over):
        n = int(over[0])
        raise InfeasibleError(
            f"running tasks hold {used[n]:g} GPUs on node {node_names[n]!r}, which has {int(node_gpus[n])}; "
            "the planning context is inconsistent"
        )
