"""The plan: per task one configuration, its nodes and its start time.

This is contract 2 of the design brief. ``Plan.to_dict()`` is the JSON object
``ray-saturn plan --json`` prints::

    {"policy": "saturn", "makespan_s": 38821.5, "lower_bound_s": 35209.1,
     "solve_time_s": 4.2, "status": "optimal|feasible",
     "assignments": [{"task": "bert-4", "strategy": "ddp", "gpus": 4,
                      "nodes": ["node-0"], "start_s": 0.0, "end_s": 3420.0}, ...]}

:func:`validate_plan` is the independent checker every plan goes through. It
shares no code with the solvers: it re-reads the profile and the cluster and
checks every rule from scratch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.context import PlanningContext
from ray_saturn.devices import check_devices, simultaneous
from ray_saturn.errors import PlanError, ProfileError, SpecError
from ray_saturn.profile_table import ProfileTable
from ray_saturn.spec import ClusterSpec

__all__ = ["Assignment", "Plan", "validate_plan"]

STATUSES = ("optimal", "feasible")


@dataclass(frozen=True)
class Assignment:
    """One task's decision: configuration, nodes, and when it holds them.

    ``setup_s`` is time at the start of the interval spent restarting a moved
    task (0 for a fresh start); ``end_s - start_s = setup_s + startup_s + steps
    x step_time_s`` with the profile row's ``startup_s`` (0 for a running task
    kept in place: it started already).
    """

    task: str
    strategy: str
    gpus: int | float
    nodes: tuple[str, ...]
    start_s: float
    end_s: float
    setup_s: float = 0.0
    #: Per node, the devices it occupies and its share of each, e.g. ``{"node-0": ((3, 0.25),)}``;
    #: ``None`` when the plan does not say (whole GPUs on identical devices).
    devices: Mapping[str, tuple[tuple[int, float], ...]] | None = None
    #: The GPU type of the profile row it runs (``None``: the untyped row).
    gpu_type: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if self.devices is not None:
            object.__setattr__(self, "devices", {str(n): tuple((int(d), float(s)) for d, s in v)
                                                 for n, v in self.devices.items()})

    @property
    def key(self) -> tuple[str, str, int | float, int]:
        return (self.task, self.strategy, self.gpus, len(self.nodes))

    @property
    def gpus_per_node(self) -> int | float:
        return self.gpus if self.gpus < 1 else self.gpus // max(1, len(self.nodes))

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def to_dict(self) -> dict[str, Any]:
        # start_s and end_s as they are (JSON floats round-trip exactly): rounded apart, end_s - start_s
        # missed the runtime by up to 1e-6.
        out: dict[str, Any] = {
            "task": self.task,
            "strategy": self.strategy,
            "gpus": self.gpus,
            "nodes": list(self.nodes),
            "start_s": float(self.start_s),
            "end_s": float(self.end_s),
        }
        if self.setup_s:
            out["setup_s"] = round(self.setup_s, 6)
        if self.devices is not None:
            out["devices"] = {n: [[d, s] for d, s in v] for n, v in self.devices.items()}
        if self.gpu_type is not None:
            out["gpu_type"] = self.gpu_type
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Assignment:
        if not isinstance(data, Mapping):
            raise PlanError(f"malformed assignment {data!r}: an assignment is an object "
                            '{"task": ..., "strategy": ..., "gpus": ..., "nodes": [...], "start_s": ..., "end_s": ...}')
        try:
            if isinstance(data.get("nodes"), (str, bytes)):  # "node-0" would read as six one-letter nodes
                raise TypeError(f"nodes is {data['nodes']!r}; give a list of node names")
            return cls(
                task=str(data["task"]),
                strategy=str(data["strategy"]),
                gpus=_gpus(data["gpus"]),
                nodes=tuple(str(n) for n in data["nodes"]),
                start_s=float(data["start_s"]),
                end_s=float(data["end_s"]),
                setup_s=float(data.get("setup_s", 0.0)),
                devices=_devices(data.get("devices")),
                gpu_type=None if data.get("gpu_type") is None else str(data["gpu_type"]),
            )
        except KeyError as exc:
            raise PlanError(f"malformed assignment {dict(data)!r}: {exc} is missing") from None
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:  # Overflow: gpus 1e400
            raise PlanError(f"malformed assignment {dict(data)!r}: {exc}") from None


@dataclass
class Plan:
    """A schedule for every task, with its makespan and a proven lower bound.

    Example:
        >>> plan = Plan("saturn", 10.0, 9.0, 0.1, "feasible",
        ...             [Assignment("a", "ddp", 2, ("node-0",), 0.0, 10.0)])
        >>> round(plan.gap, 3)
        0.111
        >>> Plan.from_json(plan.to_json()) == plan
        True
    """

    policy: str
    makespan_s: float
    lower_bound_s: float
    solve_time_s: float
    status: str
    assignments: list[Assignment] = field(default_factory=list)
    #: What the plan was optimised for (``makespan``, ``completion`` or ``online``). For the other two
    #: the plan also carries its (weighted) mean completion time, end minus release, and a lower bound on it.
    objective: str = "makespan"
    mean_completion_s: float | None = None
    completion_lower_bound_s: float | None = None

    @property
    def gap(self) -> float:
        """(makespan - lower bound) / lower bound: how far from optimal the plan can be."""
        if self.lower_bound_s <= 0:
            return 0.0 if self.makespan_s <= 0 else math.inf
        return max(0.0, (self.makespan_s - self.lower_bound_s) / self.lower_bound_s)

    def assignment(self, task: str) -> Assignment:
        for a in self.assignments:
            if a.task == task:
                return a
        raise PlanError(f"the plan has no assignment for task {task!r}")

    def by_task(self) -> dict[str, Assignment]:
        return {a.task: a for a in self.assignments}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "policy": self.policy,
            "makespan_s": float(self.makespan_s),  # unrounded, as the assignments' end_s it is the latest of
            "lower_bound_s": float(self.lower_bound_s),  # unrounded: never above the makespan by rounding
            "solve_time_s": round(self.solve_time_s, 6),
            "status": self.status,
            "assignments": [a.to_dict() for a in self.assignments],
        }
        if self.objective != "makespan":
            out["objective"] = self.objective
        if self.mean_completion_s is not None:
            out["mean_completion_s"] = float(self.mean_completion_s)
        if self.completion_lower_bound_s is not None:
            out["completion_lower_bound_s"] = float(self.completion_lower_bound_s)
        return out

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        if not isinstance(data, Mapping):
            raise PlanError("a plan must be a JSON object")
        missing = [k for k in ("policy", "makespan_s", "lower_bound_s", "status", "assignments") if k not in data]
        if missing:
            raise PlanError(f"the plan is missing {', '.join(missing)}")
        if not isinstance(data["assignments"], list):
            raise PlanError("the plan's assignments must be a list")
        return cls(
            policy=str(data["policy"]),
            makespan_s=_plan_float(data["makespan_s"], "makespan_s"),
            lower_bound_s=_plan_float(data["lower_bound_s"], "lower_bound_s"),
            solve_time_s=_plan_float(data.get("solve_time_s", 0.0), "solve_time_s"),
            status=str(data["status"]),
            assignments=[Assignment.from_dict(a) for a in data["assignments"]],
            objective=str(data.get("objective", "makespan")),
            mean_completion_s=_opt_float(data.get("mean_completion_s")),
            completion_lower_bound_s=_opt_float(data.get("completion_lower_bound_s")),
        )

    @classmethod
    def from_json(cls, text: str) -> Plan:
        if not isinstance(text, (str, bytes, bytearray)):
            raise PlanError(f"the plan is a {type(text).__name__}; give its JSON text (Plan.from_dict takes a dict)")
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise PlanError(f"the plan is not valid JSON ({exc})") from None
        except RecursionError:
            raise PlanError("the plan's JSON is nested too deeply; a plan is one JSON object") from None
        return cls.from_dict(data)

    def validate(
        self,
        profile: ProfileTable,
        cluster: ClusterSpec,
        context: PlanningContext | None = None,
        *,
        tol: float = 1e-6,
    ) -> None:
        """Raise :class:`PlanError` unless the plan is valid; see :func:`validate_plan`."""
        validate_plan(self, profile, cluster, context, tol=tol)


def _gpus(value: Any) -> int | float:
    f = float(value)
    return int(f) if f >= 1 and f == int(f) else f


def _same_devices(held, planned) -> bool:
    """Whether a running task holding ``held`` devices stays on them under ``planned`` ones (either
    unnamed: the same place; else the same device indices per node)."""
    if held is None or planned is None:
        return True
    def ids(m):
        return {str(n): sorted(int(d) for d, _ in ds) for n, ds in m.items() if ds}
    return ids(held) == ids(planned)


def _devices(value: Any) -> dict[str, tuple[tuple[int, float], ...]] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError('devices must be an object {"node": [[device, share], ...]}')
    out = {}
    for node, entries in value.items():
        pairs = []
        for e in entries:
            d, share = e
            if float(d) != int(d):
                raise ValueError(f"device index {d!r} is not a whole number")
            pairs.append((int(d), float(share)))
        out[str(node)] = tuple(pairs)
    return out


def _plan_float(value: Any, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise PlanError(f"the plan's {what} is {value!r}; give a number of seconds") from None


def _opt_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise PlanError(f"{value!r} is not a number") from None


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def validate_plan(
    plan: Plan,
    profile: ProfileTable,
    cluster: ClusterSpec,
    context: PlanningContext | None = None,
    *,
    tol: float = 1e-6,
) -> None:
    """Check every rule of contract 2 from scratch; raise :class:`PlanError` on the first broken one.

    Rules: every profiled task appears exactly once; its configuration is a
    feasible profile row; a k-node configuration lists k distinct nodes of
    the cluster, GPUs split evenly; ``end_s - start_s`` equals the profile
    runtime, start-up included (plus the restart set-up of a moved task; a
    running task kept in place has no start-up left); no node ever holds more
    than its GPUs; no device ever holds more than 1.0 (with ``devices``: see
:func:`ray_saturn.devices.check_devices`); a row measured on a GPU type runs
only on nodes of that type; the makespan is the last end; the lower bound is not above
    the makespan; and, with a context, release times, node availability and
    running tasks are respected.
    """
    for name, value, kind, hint in (
        ("plan", plan, Plan, "Plan.from_json(text) reads one"),
        ("profile", profile, ProfileTable, "ProfileTable.read(path) reads one"),
        ("cluster", cluster, ClusterSpec, "ClusterSpec.uniform(nodes, gpus_per_node) or ClusterSpec.from_json(path)"),
    ):
        if not isinstance(value, kind):
            raise SpecError(f"validate_plan: {name} is a {type(value).__name__}; give a {kind.__name__} ({hint})")
    if context is not None and not isinstance(context, PlanningContext):
        raise SpecError(f"validate_plan: context is a {type(context).__name__}; give a PlanningContext or None")
    ctx = context or PlanningContext()
    if plan.status not in STATUSES:
        raise PlanError(f"plan status {plan.status!r} must be one of {', '.join(STATUSES)}")
    node_gpus = {n.name: n.gpus for n in cluster.nodes}
    node_type = {n.name: n.gpu_type for n in cluster.nodes}
    running = {r.task: r for r in ctx.running}
    seen: set[str] = set()
    events: dict[str, list[tuple[float, int, int, str]]] = {n: [] for n in node_gpus}
    latest_end = 0.0
    for a in plan.assignments:
        where = f"plan assignment for task {a.task!r}"
        if a.task in seen:
            raise PlanError(f"{where}: the task appears twice; every task must appear exactly once")
        seen.add(a.task)
        try:
            cfg = profile.get(a.task, a.strategy, a.gpus, len(a.nodes), a.gpu_type)
        except ProfileError:
            on = f" measured on {a.gpu_type}" if a.gpu_type is not None else ""
            raise PlanError(
                f"{where}: ({a.strategy}, {a.gpus} GPUs, {len(a.nodes)} node(s){on}) is not a profiled configuration"
            ) from None
        if not cfg.feasible:
            raise PlanError(f"{where}: configuration ({a.strategy}, {a.gpus} GPUs) is marked infeasible")
        if len(set(a.nodes)) != len(a.nodes):
            raise PlanError(f"{where}: nodes {list(a.nodes)} are not distinct")
        for n in a.nodes:
            if n not in node_gpus:
                raise PlanError(f"{where}: node {n!r} is not in the cluster")
            if cfg.gpu_type is not None and node_type[n] != cfg.gpu_type:
                raise PlanError(
                    f"{where}: runs its row measured on {cfg.gpu_type} on node {n!r} of type {node_type[n]}; "
                    f"the task has no such row for that node's type"
                )
        if not all(math.isfinite(x) for x in (a.start_s, a.end_s, a.setup_s)):
            raise PlanError(f"{where}: start, end and set-up must be finite numbers")
        if a.start_s < -tol:
            raise PlanError(f"{where}: starts at {a.start_s}, before time 0")
        if a.start_s + tol * max(1.0, a.start_s) < ctx.release(a.task):
            raise PlanError(f"{where}: starts at {a.start_s:.3f} s, before its release at {ctx.release(a.task):.3f} s")
        run = running.get(a.task)
        same_place = (run is not None and (run.strategy, run.gpus, tuple(run.nodes)) == (a.strategy, a.gpus, a.nodes)
                      and _same_devices(run.devices, a.devices))
        # Kept in place: same configuration and nodes, continuing at 0 with no set-up. Anything
        # else is a move (also a stop and a later restart on the same nodes), which pays restart_s.
        stays = same_place and abs(a.start_s) <= tol and abs(a.setup_s) <= tol
        if run is None or stays:
            expected_setup = 0.0
        else:
            if not run.movable:
                if same_place:
                    raise PlanError(f"{where}: a running task kept in place must continue at time 0, not {a.start_s}")
                raise PlanError(f"{where}: the running task may not be moved")
            expected_setup = run.restart_s
        if not _close(a.setup_s, expected_setup, tol):
            raise PlanError(f"{where}: set-up is {a.setup_s} s but must be {expected_setup} s")
        # A segment launched afresh pays the configuration's start-up; one kept in place started already.
        startup = 0.0 if stays else cfg.startup_s
        expected = expected_setup + startup + cfg.steps * cfg.step_time_s
        if not _close(a.end_s - a.start_s, expected, tol):
            raise PlanError(
                f"{where}: runs {a.end_s - a.start_s:.6f} s but the profile says start-up {startup} s + "
                f"{cfg.steps} steps x {cfg.step_time_s} s + set-up {expected_setup} s = {expected:.6f} s"
            )
        per_node = a.gpus_per_node
        for n in a.nodes:
            if per_node > node_gpus[n]:
                raise PlanError(f"{where}: needs {per_node} GPUs on node {n!r}, which has {node_gpus[n]}")
            if a.start_s + tol * max(1.0, a.start_s) < ctx.available(n) and not stays:
                raise PlanError(
                    f"{where}: uses node {n!r} at {a.start_s:.3f} s, before it is available at {ctx.available(n):.3f} s"
                )
            # Ends sort before starts at the same instant (0 < 1).
            events[n].append((a.start_s, 1, per_node, a.task))
            events[n].append((a.end_s, 0, -per_node, a.task))
        latest_end = max(latest_end, a.end_s)
    missing = [t for t in profile.tasks if t not in seen]
    if missing:
        raise PlanError(f"the plan has no assignment for task(s) {', '.join(missing[:5])}; every task must appear once")
    extra = [t for t in seen if t not in set(profile.tasks)]
    if extra:
        raise PlanError(f"the plan assigns task(s) {', '.join(extra[:5])} that are not in the profile")
    for n, evs in events.items():
        # Treat events within tol of each other as simultaneous: ends first.
        used = 0
        for t0, group in simultaneous(evs, tol):
            used += sum(e[2] for e in group)
            if used > node_gpus[n] + 1e-9:
                tasks = sorted({e[3] for e in group})
                raise PlanError(
                    f"node {n!r} holds {used} GPUs at {t0:.3f} s but has {node_gpus[n]} "
                    f"(tasks starting then: {', '.join(tasks)})"
                )
    check_devices(plan, cluster, tol=tol)
    if not _close(plan.makespan_s, latest_end, tol):
        raise PlanError(f"the plan's makespan {plan.makespan_s} is not its last end time {latest_end}")
    if plan.mean_completion_s is not None:
        _check_completion(plan, profile, ctx, tol)
    if not plan.lower_bound_s <= plan.makespan_s * (1 + tol) + tol:
        # Never clipped: a lower bound above a valid plan's makespan is wrong, whoever claimed it.
        raise PlanError(
            f"policy {plan.policy} reports a lower bound of {plan.lower_bound_s:.6g} s above its own makespan of "
            f"{plan.makespan_s:.6g} s: the bound is wrong (a bug in the policy or the bounds), not a plan to trust"
        )


def _check_completion(plan: Plan, profile: ProfileTable, ctx: PlanningContext, tol: float) -> None:
    """The plan's mean completion time is its weighted mean of end - release; its bound is not above it."""
    table = profile.to_arrow()
    weight: dict[str, float] = {}
    if "weight" in table.column_names:
        for t, w in zip(table.column("task").to_pylist(), table.column("weight").to_pylist(), strict=False):
            if w is not None:
                weight[t] = float(w)
    total = sum(weight.get(a.task, 1.0) * (a.end_s - ctx.release(a.task)) for a in plan.assignments)
    mean = total / max(1e-12, sum(weight.get(a.task, 1.0) for a in plan.assignments))
    if not _close(plan.mean_completion_s, mean, tol):
        raise PlanError(f"the plan's mean completion time {plan.mean_completion_s} is not its tasks' mean {mean}")
    lb = plan.completion_lower_bound_s
    if lb is not None and not lb <= plan.mean_completion_s * (1 + tol) + tol:  # not <=: a NaN bound is refused
        raise PlanError(
            f"the plan's completion-time lower bound {lb} is above its mean completion time {plan.mean_completion_s}"
        )
