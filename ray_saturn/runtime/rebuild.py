"""Rebuild a run's state from ``events.jsonl`` when ``state.json`` (and its backup) is lost.

The driver logs every launch, first step, exit, move, node loss, re-plan
and resume as one event. From them this module rebuilds what ``resume``
needs so that nothing already trained is run again:

- per task: its segments (placement, start, first step, end, status,
  steps), attempts, and whether it finished (an exit with status
  ``finished``) or was given up (``task_gave_up``); a task neither finished
  nor given up continues from its newest checkpoint (the driver reads it);
- the run's clock at the driver's death: the last event's clock plus the
  wall time from that event to the last sign of life (the dead owner's
  lease heartbeat, an ``interrupted`` event), divided by the time scale, so
  the realised makespan keeps the history;
- the planned makespan (the first plan) and the re-plan and move counters.

What events do not hold is said in :attr:`RebuiltState.notes`: losses and
measured step times (they come back with the first progress reports), and
how the clock at death was estimated.

Example:
    >>> from ray_saturn import ProfileTable
    >>> prof = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1, "steps": 5}])
    >>> ev = [{"kind": "launch", "task": "a", "attempt": 0, "strategy": "ddp", "gpus": 1, "nodes": ["n"],
    ...        "from_step": 0, "time_s": 0.0, "wall": 100.0},
    ...       {"kind": "exited", "task": "a", "attempt": 0, "status": "finished", "step": 5, "reason": "",
    ...        "time_s": 5.0, "wall": 105.0}]
    >>> rebuild_state(ev, prof).state["tasks"]["a"]["state"]
    'finished'
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.profile_table import ProfileTable

__all__ = ["RebuiltState", "rebuild_state"]

logger = logging.getLogger(__name__)


@dataclass
class RebuiltState:
    """A state rebuilt from events (the same shape as ``state.json``), and what it could not hold."""

    state: dict[str, Any]
    finished: list[str] = field(default_factory=list)
    given_up: list[str] = field(default_factory=list)
    resumable: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line: what was rebuilt and what was not."""
        parts = [
            f"{len(self.finished)} finished (not re-run)",
            f"{len(self.resumable)} to continue from their checkpoints",
        ]
        if self.given_up:
            parts.append(f"{len(self.given_up)} given up")
        return f"rebuilt from events: {', '.join(parts)}; " + "; ".join(self.notes)


def _num(d: Mapping[str, Any], key: str, default: float | None = None) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) else default


def rebuild_state(
    events: Iterable[Mapping[str, Any]],
    profile: ProfileTable,
    *,
    time_scale: float = 1.0,
    last_seen_wall: float | None = None,
) -> RebuiltState:
    """The run state that ``events`` describe (see the module docstring).

    Args:
        events: ``events.jsonl`` in order.
        profile: the run's profile (its tasks and their total steps).
        time_scale: wall seconds per driver-clock second (emulation; 1 otherwise).
        last_seen_wall: wall time of the driver's last sign of life outside the
            events (e.g. the dead owner's lease heartbeat).
    """
    tasks: dict[str, dict[str, Any]] = {}
    for t in profile.tasks:
        total = max(c.steps for c in profile.configs(t))
        tasks[t] = {
            "task": t,
            "state": "queued",
            "steps_done": 0,
            "total_steps": total,
            "checkpointed_step": 0,
            "attempts": 0,
            "reason": "",
            "segments": [],
        }
    out = RebuiltState(state={})
    replans_in_life = 0
    replans = 0
    moves = 0
    planned: float | None = None
    last_time: float | None = None
    last_wall: float | None = None
    latest_wall: float | None = None
    unknown: set[str] = set()

    def open_segment(name: str) -> dict[str, Any] | None:
        segs = tasks[name]["segments"]
        return segs[-1] if segs and segs[-1]["end_s"] is None else None

    def close_open(at: float | None, status: str, reason: str) -> None:
        for name, rec in tasks.items():
            seg = open_segment(name)
            if seg is not None:
                seg.update(end_s=at if at is not None else seg["start_s"], status=status, reason=reason,
                           steps_end=rec["checkpointed_step"])

    for ev in events:
        kind = ev.get("kind")
        time_s = _num(ev, "time_s")
        wall = _num(ev, "wall")
        if time_s is not None and wall is not None:
            last_time, last_wall = time_s, wall
        if wall is not None:
            latest_wall = wall if latest_wall is None else max(latest_wall, wall)
        name = ev.get("task")
        if name is not None and name not in tasks:
            unknown.add(str(name))
            continue
        if kind == "resume":
            replans += max(0, replans_in_life - 1)
            replans_in_life = 0
            close_open(time_s, "interrupted", "the driver stopped")
        elif kind == "replan":
            replans_in_life += 1
            if planned is None and time_s is not None:
                planned = time_s + (_num(ev, "planned_makespan_s") or 0.0)
        elif kind == "move" and name is not None:
            moves += 1
        elif kind == "launch" and name is not None:
            rec = tasks[name]
            rec["attempts"] += 1
            rec["segments"].append(
                {
                    "strategy": str(ev.get("strategy")),
                    "gpus": int(ev.get("gpus") or 0),
                    "nodes": list(ev.get("nodes") or []),
                    "start_s": time_s or 0.0,
                    "end_s": None,
                    "first_step_s": None,
                    "steps_start": int(ev.get("from_step") or 0),
                    "steps_end": None,
                    "status": "launching",
                    "attempt": int(ev.get("attempt") or 0),
                    "reason": "",
                }
            )
            rec["state"] = "launching"
        elif kind == "started" and name is not None:
            seg = open_segment(name)
            if seg is not None and seg["first_step_s"] is None:
                seg["first_step_s"] = time_s
                seg["status"] = "running"
                tasks[name]["state"] = "running"
        elif kind == "exited" and name is not None:
            rec = tasks[name]
            step = int(ev.get("step") or 0)
            status = str(ev.get("status") or "failed")
            rec["checkpointed_step"] = max(rec["checkpointed_step"], min(step, rec["total_steps"]))
            seg = open_segment(name)
            if seg is not None:
                seg.update(end_s=time_s, status=status, steps_end=step, reason=str(ev.get("reason") or ""))
            if status == "finished":
                rec["state"] = "finished"
                rec["checkpointed_step"] = rec["total_steps"]
            elif rec["state"] != "failed":
                rec["state"] = "queued"
                if status == "failed":
                    rec["reason"] = str(ev.get("reason") or "")
        elif kind == "task_gave_up" and name is not None:
            rec = tasks[name]
            rec["state"] = "failed"
            rec["reason"] = str(ev.get("reason") or rec["reason"] or "failed")
        elif kind == "node_lost_detected":
            for t in ev.get("tasks") or []:
                if t in tasks:
                    seg = open_segment(t)
                    if seg is not None:
                        seg.update(end_s=time_s, status="interrupted", reason="node lost",
                                   steps_end=tasks[t]["checkpointed_step"])
                    if tasks[t]["state"] not in ("finished", "failed"):
                        tasks[t]["state"] = "queued"
    replans += max(0, replans_in_life - 1)

    # The clock at the driver's death: the last event's clock, plus what came after it.
    clock = last_time or 0.0
    if last_wall is not None:
        seen = max(w for w in (latest_wall, last_seen_wall, last_wall) if w is not None)
        clock += max(0.0, seen - last_wall) / max(time_scale, 1e-12)
        if last_seen_wall is not None and last_seen_wall > last_wall:
            out.notes.append(
                f"the clock at the driver's death ({clock:.0f} s) is estimated from its last heartbeat"
            )
    for rec in tasks.values():
        if rec["state"] == "finished":
            rec["steps_done"] = rec["total_steps"]
            out.finished.append(rec["task"])
            seg = open_segment(rec["task"])
            if seg is not None:  # finished, then the driver died before it logged the exit
                seg.update(end_s=clock, status="finished", steps_end=rec["total_steps"])
        elif rec["state"] == "failed":
            rec["steps_done"] = rec["checkpointed_step"]
            out.given_up.append(rec["task"])
        else:
            rec["steps_done"] = rec["checkpointed_step"]
            out.resumable.append(rec["task"])
            if open_segment(rec["task"]) is not None:
                rec["state"] = "running"  # its segment died with the driver: resume ends it there
    out.notes.append("losses and measured step times are not in the events (they return with the next reports)")
    if unknown:
        out.notes.append(f"events of task(s) {', '.join(sorted(unknown)[:5])} that the profile does not hold "
                         "were skipped")
    out.state = {
        "version": 1,
        "driver_state": "interrupted",
        "reason": "state rebuilt from events",
        "time_s": round(clock, 3),
        "updated_wall": latest_wall,
        "time_scale": time_scale,
        "planned_makespan_s": planned,
        "replans": replans,
        "moves": moves,
        "tasks": tasks,
        "rebuilt": True,
    }
    return out
