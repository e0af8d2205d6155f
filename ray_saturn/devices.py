"""Per-device checks of a plan: shares of one GPU never add up to more than the GPU.

A plan's assignment may say which devices it occupies on each of its nodes
(``devices``: node -> ``[(device index, share), ...]``). A whole-GPU
assignment holds ``gpus / nodes`` distinct devices per node at share 1.0; a
share (``gpus`` = 1/k) holds one device at share 1/k. An assignment without
``devices`` holds whole GPUs somewhere on its nodes.

:func:`check_devices` is part of the independent plan validator
(:func:`ray_saturn.plan.validate_plan`); it shares no code with the solvers.

Example:
    >>> from ray_saturn.plan import Assignment, Plan
    >>> from ray_saturn.spec import ClusterSpec
    >>> a = [Assignment(f"t{i}", "single", 0.5, ("node-0",), 0.0, 10.0, devices={"node-0": [(0, 0.5)]})
    ...      for i in range(3)]
    >>> try:
    ...     check_devices(Plan("p", 10.0, 0.0, 0.0, "feasible", a), ClusterSpec.uniform(1, 2))
    ... except Exception as exc:
    ...     print(str(exc)[:57])
    device 0 of node 'node-0' holds 1.5 of one GPU at 0.000 s
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ray_saturn.errors import PlanError

if TYPE_CHECKING:
    from ray_saturn.plan import Plan
    from ray_saturn.spec import ClusterSpec

__all__ = ["check_devices", "simultaneous"]

_SLACK = 1e-9


def check_devices(plan: Plan, cluster: ClusterSpec, *, tol: float = 1e-6) -> None:
    """Raise :class:`PlanError` unless every assignment's ``devices`` are well formed and no device or
    node is ever over-full.

    Rules: a share (``gpus`` < 1) names its device; ``devices`` names exactly the assignment's nodes;
    per node, a share holds one device at exactly its share, whole GPUs hold ``gpus / nodes``
    distinct devices at 1.0 each; device indices lie in ``0 .. GPUs - 1``; at no time does a device
    hold more than 1.0; and at no time do a node's occupied devices plus the whole GPUs of
    assignments without ``devices`` exceed its GPUs.
    """
    gpus = {n.name: n.gpus for n in cluster.nodes}
    # node -> [(time, 0 end / 1 start, device or None, amount, task)]
    events: dict[str, list[tuple[float, int, int | None, float, str]]] = {n: [] for n in gpus}
    for a in plan.assignments:
        where = f"plan assignment for task {a.task!r}"
        share = a.gpus < 1
        if a.devices is None:
            if share:
                raise PlanError(
                    f"{where}: shares one device (gpus={a.gpus}) but names no device; "
                    f'give devices, e.g. {{"{a.nodes[0] if a.nodes else "node-0"}": [[0, {a.gpus}]]}}'
                )
            for n in a.nodes:
                if n in events:
                    events[n].append((a.start_s, 1, None, float(a.gpus_per_node), a.task))
                    events[n].append((a.end_s, 0, None, -float(a.gpus_per_node), a.task))
            continue
        if set(a.devices) != set(a.nodes):
            raise PlanError(f"{where}: devices name nodes {sorted(a.devices)} but the task runs on {sorted(a.nodes)}")
        for n, entries in a.devices.items():
            idx = [d for d, _ in entries]
            if len(set(idx)) != len(idx):
                raise PlanError(f"{where}: device(s) listed twice on node {n!r}: {idx}")
            for d in idx:
                if not 0 <= d < gpus[n]:
                    raise PlanError(f"{where}: device {d} is not on node {n!r}, which has devices 0..{gpus[n] - 1}")
            if share:
                if len(entries) != 1 or not abs(entries[0][1] - a.gpus) <= _SLACK:  # not <=: NaN is refused
                    raise PlanError(
                        f"{where}: a {a.gpus} share holds one device at share {a.gpus} on node {n!r}, "
                        f"not {[list(e) for e in entries]}"
                    )
            elif len(entries) != a.gpus_per_node or not all(abs(s - 1.0) <= _SLACK for _, s in entries):
                raise PlanError(
                    f"{where}: {a.gpus_per_node} whole GPU(s) per node hold {a.gpus_per_node} device(s) at share 1.0 "
                    f"on node {n!r}, not {[list(e) for e in entries]}"
                )
            for d, s in entries:
                events[n].append((a.start_s, 1, d, s, a.task))
                events[n].append((a.end_s, 0, d, -s, a.task))
    for n, evs in events.items():
        if not any(e[2] is not None for e in evs):
            continue  # no device named on this node: the node-level check of the validator covers it
        load: dict[int, float] = {}
        anonymous = 0.0
        for t0, group in simultaneous(evs, tol):
            for _, _, d, amount, _ in group:
                if d is None:
                    anonymous += amount
                else:
                    load[d] = load.get(d, 0.0) + amount
            starting = sorted({e[4] for e in group if e[1] == 1})
            for d, x in load.items():
                if x > 1.0 + _SLACK:
                    raise PlanError(
                        f"device {d} of node {n!r} holds {x:g} of one GPU at {t0:.3f} s (tasks starting then: "
                        f"{', '.join(starting)}); shares on one device must not exceed 1.0"
                    )
            busy = sum(x > _SLACK for x in load.values())
            if busy + anonymous > gpus[n] + _SLACK:
                raise PlanError(
                    f"node {n!r} has {busy} device(s) in use and {anonymous:g} more whole GPU(s) at {t0:.3f} s "
                    f"but {gpus[n]} GPUs (tasks starting then: {', '.join(starting)})"
                )


def simultaneous(events: list[tuple], tol: float) -> Iterator[tuple[float, list[tuple]]]:
    """Sort ``events`` (``(time, kind, ...)``, kind 0 = end before 1 = start) and yield each instant
    ``(t0, events within tol x max(1, |t0|) of it)``: the validator's sweeps treat those as simultaneous."""
    events.sort(key=lambda e: (e[0], e[1]))
    i = 0
    while i < len(events):
        t0 = events[i][0]
        j = i
        while j < len(events) and events[j][0] - t0 <= tol * max(1.0, abs(t0)):
            j += 1
        yield t0, events[i:j]
        i = j
