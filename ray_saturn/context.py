"""Re-planning inputs: what is already happening when a plan is made.

All times are seconds relative to the moment of planning ("now" = 0).

- ``release_s``: a task that arrives later may not start before its release.
- ``running``: tasks that are running now, each on a configuration and set of
  nodes. The profile row for that configuration must hold the *remaining*
  steps (and, ideally, the measured step time). A plan either keeps such a
  task where it is (same strategy, GPUs and nodes, start 0, no set-up) or
  moves it: any other configuration, paying ``restart_s`` of set-up
  (checkpoint, stop, relaunch) before its steps resume.
- ``node_available_s``: a node that is busy or unavailable until a time.
- ``incumbent``: the plan being followed (each task's configuration, in
  planned start order). A solver decodes it for the new problem and keeps it
  as a candidate, so a re-plan is never predicted worse than carrying on.
- ``area_share``: ``online`` objective, per task, the share (0..1) of the
  jobs expected to arrive that would queue behind it (those larger than its
  remaining work: shortest-remaining-work-first lets smaller ones pass it);
  the arrival price of its GPU-seconds is scaled by it. A task not named
  pays the whole price.

Example:
    >>> ctx = PlanningContext(
    ...     running=(RunningTask("a", "ddp", 2, ("node-0",), restart_s=30.0),),
    ...     release_s={"b": 100.0},
    ... )
    >>> ctx.running_task("a").restart_s
    30.0
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ray_saturn.errors import SpecError

__all__ = ["Incumbent", "PlanningContext", "RunningTask"]


def _splits(gpus: float, nodes: int) -> bool:
    """True when ``gpus`` split evenly over ``nodes`` (a share 1/k of one device: one node)."""
    if gpus < 1:
        return nodes == 1 and gpus > 0 and abs(1 / gpus - round(1 / gpus)) < 1e-9
    return gpus == int(gpus) and int(gpus) % nodes == 0


@dataclass(frozen=True)
class RunningTask:
    """A task running now, on ``strategy`` with ``gpus`` GPUs over ``nodes``.

    ``gpus`` may be a share 1/k of one device (one node). ``gpu_type``: the GPU
    type of the profile row it runs (``None``: the untyped row). ``devices``:
    per node, the devices it holds and its share of each, e.g.
    ``{"node-0": ((2, 0.25),)}``; a plan keeping it in place keeps those
    devices (``None``: whole GPUs somewhere on its nodes).
    """

    task: str
    strategy: str
    gpus: int | float
    nodes: tuple[str, ...]
    restart_s: float = 0.0
    movable: bool = True
    gpu_type: str | None = None
    devices: Mapping[str, tuple[tuple[int, float], ...]] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.nodes, (str, bytes)):  # "node-0" would read as six one-letter nodes
            raise SpecError(f"running task {self.task!r}: nodes is {self.nodes!r}; give a tuple of node names")
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes or len(set(self.nodes)) != len(self.nodes):
            raise SpecError(f"running task {self.task!r}: nodes must be distinct and non-empty")
        if not _splits(self.gpus, len(self.nodes)):
            raise SpecError(
                f"running task {self.task!r}: {self.gpus} GPUs over {len(self.nodes)} nodes do not split evenly"
            )
        if self.devices is not None:
            devices = {str(n): tuple((int(d), float(s)) for d, s in v) for n, v in self.devices.items()}
            if set(devices) != set(self.nodes):
                raise SpecError(
                    f"running task {self.task!r}: devices name nodes {sorted(devices)}, but it runs on "
                    f"{sorted(self.nodes)}; give devices for exactly its nodes"
                )
            object.__setattr__(self, "devices", devices)
        if not math.isfinite(self.restart_s) or self.restart_s < 0:
            raise SpecError(f"running task {self.task!r}: restart_s must be >= 0, got {self.restart_s}")


@dataclass(frozen=True)
class Incumbent:
    """The plan being followed: tasks in planned start order, each with its placement.

    ``placements`` maps a task to ``(strategy, gpus, nodes)`` (node names);
    tasks may be missing (e.g. arrived since), and extra ones are ignored.

    Example:
        >>> inc = Incumbent(("b", "a"), {"a": ("ddp", 2, ("node-0",)), "b": ("fsdp", 4, ("node-1",))})
        >>> inc.placements["b"]
        ('fsdp', 4, ('node-1',))
    """

    order: tuple[str, ...]
    placements: Mapping[str, tuple[str, int, tuple[str, ...]]]

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", tuple(self.order))
        object.__setattr__(self, "placements", {t: (s, g, tuple(n)) for t, (s, g, n) in self.placements.items()})
        if len(set(self.order)) != len(self.order):
            raise SpecError("a task appears twice in the incumbent plan's order")
        missing = [t for t in self.order if t not in self.placements]
        if missing:
            raise SpecError(f"incumbent plan: no placement for task(s) {', '.join(missing[:5])}")
        for t, (_, gpus, nodes) in self.placements.items():
            if not nodes or len(set(nodes)) != len(nodes) or not _splits(gpus, len(nodes)):
                raise SpecError(
                    f"incumbent plan: task {t!r} has {gpus} GPUs on nodes {list(nodes)}; "
                    "give distinct nodes that split the GPUs evenly"
                )


@dataclass(frozen=True)
class PlanningContext:
    """Everything besides the profile and cluster that constrains a plan."""

    release_s: Mapping[str, float] = field(default_factory=dict)
    running: tuple[RunningTask, ...] = ()
    node_available_s: Mapping[str, float] = field(default_factory=dict)
    incumbent: Incumbent | None = None
    area_share: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.running, (str, bytes, Mapping, RunningTask)) or not isinstance(self.running, Iterable):
            raise SpecError(f"running is a {type(self.running).__name__}; give a tuple of RunningTask")
        object.__setattr__(self, "running", tuple(self.running))
        for r in self.running:
            if not isinstance(r, RunningTask):
                raise SpecError(f"running holds a {type(r).__name__}; give RunningTask(task, strategy, gpus, nodes)")
        for what in ("release_s", "node_available_s", "area_share"):
            mapping = getattr(self, what)
            if not isinstance(mapping, Mapping):
                raise SpecError(f"{what} is a {type(mapping).__name__}; give a dict of name -> number")
            for key, value in mapping.items():
                if isinstance(value, bool) or not isinstance(value, numbers.Real):
                    raise SpecError(f"{what}[{key!r}] is {value!r}; give a number")
            object.__setattr__(self, what, dict(mapping))
        for key, value in self.area_share.items():
            if not math.isfinite(value) or not 0 <= value <= 1:
                raise SpecError(f"area_share[{key!r}] is {value}; give a share from 0 to 1")
        names = [r.task for r in self.running]
        if len(set(names)) != len(names):
            raise SpecError("a task is listed as running twice in the planning context")
        for what, mapping in (("release_s", self.release_s), ("node_available_s", self.node_available_s)):
            for key, value in mapping.items():
                if not math.isfinite(value) or value < 0:
                    raise SpecError(f"{what}[{key!r}] is {value}; it must be a finite time >= 0")

    def release(self, task: str) -> float:
        return float(self.release_s.get(task, 0.0))

    def running_task(self, task: str) -> RunningTask | None:
        for r in self.running:
            if r.task == task:
                return r
        return None

    def share(self, task: str) -> float:
        """``task``'s share of the arrival price of GPU-seconds (1 when not given)."""
        return float(self.area_share.get(task, 1.0))

    def available(self, node: str) -> float:
        return float(self.node_available_s.get(node, 0.0))

    @property
    def is_empty(self) -> bool:
        return not self.release_s and not self.running and not self.node_available_s
