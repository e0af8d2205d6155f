"""Move decisions: is moving running tasks worth their restart?

A re-plan that may move running tasks is solved twice: once with running
tasks movable (each move pays ``restart_s`` of set-up in the model) and once
with them pinned. :func:`decide_moves` compares the two plans. The predicted
gain is the makespan of the pinned plan minus that of the moving plan (the
set-up of every move already counted in the latter); the moves are made only
when that gain exceeds the restart cost of all of them together (a margin
against estimation error: a restart's real cost is only an estimate, and a
plan that gains less than it does not pay for the churn). Otherwise every
running task stays where it is and the pinned plan is used.

A moved task may restart later than now: the plan can stop it with a
checkpoint and restart it once its target's GPUs free up (the makespan
planner's "stop now, restart wider later", the ``online`` objective's SRPT
preemption); the plan's makespan already counts the wait. That is the one
rule for every objective: until 2026-12-01 a makespan run dropped such a
plan (a rule added with the Tune integration), which cut the moves of
event-driven re-planning from 7.7 to 0.8 per simulated run and left it
behind periodic re-planning (release/README.md, "Simulator and scale").

Example:
    >>> from ray_saturn.control.state import Placement
    >>> from ray_saturn.plan import Assignment, Plan
    >>> here = Placement("ddp", 2, ("node-0",))
    >>> plan = Plan("saturn", 50.0, 40.0, 0.1, "feasible",
    ...             [Assignment("a", "ddp", 4, ("node-1",), 0.0, 50.0, setup_s=5.0)])
    >>> [d.move for d in decide_moves({"a": here}, plan, keep_makespan_s=80.0, restart_s=5.0)]
    [True]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ray_saturn.control.state import Placement
from ray_saturn.plan import Plan

__all__ = ["MoveDecision", "decide_moves"]

@dataclass(frozen=True)
class MoveDecision:
    """Whether running ``task`` moves from ``current`` to ``target`` and why."""

    task: str
    move: bool
    current: Placement
    target: Placement
    predicted_gain_s: float
    restart_s: float
    reason: str

    def to_dict(self) -> dict:
        return {
            "task": self.task,
            "move": self.move,
            "from": self.current.to_dict(),
            "to": self.target.to_dict(),
            "predicted_gain_s": round(self.predicted_gain_s, 3),
            "restart_s": self.restart_s,
            "reason": self.reason,
        }


def moved_tasks(running: Mapping[str, Placement], plan: Plan) -> dict[str, Placement]:
    """Running tasks that ``plan`` puts on another placement, with that placement."""
    out = {}
    for a in plan.assignments:
        cur = running.get(a.task)
        if cur is None:
            continue
        new = Placement(a.strategy, a.gpus, a.nodes, a.gpu_type, a.devices)
        if not new.same_config(cur) or a.setup_s > 0 or a.start_s > 0:
            out[a.task] = new  # elsewhere, or stopped and restarted later on the same nodes
    return out


def decide_moves(
    running: Mapping[str, Placement],
    move_plan: Plan,
    keep_makespan_s: float,
    restart_s: float | Mapping[str, float],
    *,
    gain_s: float | None = None,
) -> list[MoveDecision]:
    """One decision per running task that ``move_plan`` moves (empty: it moves none).

    ``restart_s`` is the restart cost of a move, or per task (stop, save,
    the target's start-up, load). ``gain_s``: the predicted gain when the
    objective is not the makespan (e.g. the weighted completion seconds
    saved); by default the makespan saved. A moved task may restart later
    than now (see the module's docstring); the reason says when.
    """
    moved = moved_tasks(running, move_plan)
    if not moved:
        return []
    costs = {t: float(restart_s[t]) if isinstance(restart_s, Mapping) else float(restart_s) for t in moved}
    gain = keep_makespan_s - move_plan.makespan_s if gain_s is None else gain_s
    cost = sum(costs.values())
    waits = sorted((move_plan.assignment(t).start_s, t) for t in moved if move_plan.assignment(t).start_s > 0)
    later = f"; {len(waits)} restart(s) later (first {waits[0][1]}, {waits[0][0]:.1f} s on)" if waits else ""
    accept = gain > cost
    if accept:
        reason = f"moving {len(moved)} task(s) gains {gain:.1f} s > restart cost {cost:.1f} s{later}"
    else:
        reason = f"moving {len(moved)} task(s) would gain {gain:.1f} s <= restart cost {cost:.1f} s{later}"
    return [MoveDecision(t, accept, running[t], p, gain, costs[t], reason) for t, p in sorted(moved.items())]
