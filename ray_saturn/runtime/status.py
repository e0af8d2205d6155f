"""What ``ray-saturn status`` says about a run: its persisted state, and whether its driver lives.

The state is ``state.json`` (its backup when it is damaged, a state rebuilt
from ``events.jsonl`` when both are gone). Whether the driver lives is the
run folder's lease (:mod:`~ray_saturn.runtime.lease`): a live lease means a
live run; a run whose state is not final and whose lease is gone or stale
has a dead driver, and the status says for how long it has not been seen
and that ``ray-saturn resume`` continues it.

Example:
    >>> # run_status("/tmp/runs/sweep")["driver"]["note"]
    >>> # 'driver not seen for 42 s: run `ray-saturn resume /tmp/runs/sweep`'
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from ray_saturn.runtime.config import RunSettings
from ray_saturn.runtime.journal import (
    EVENTS_FILE,
    PROFILE_FILE,
    RUN_FILE,
    STATE_BACKUP_FILE,
    STATE_FILE,
    Journal,
)
from ray_saturn.runtime.lease import read_lease
from ray_saturn.runtime.records import RunOutcome
from ray_saturn.runtime.storage import RunStorage, StorageError

__all__ = ["FINAL_STATES", "DriverHealth", "run_status"]

#: Driver states after which nothing runs (no heartbeat is expected).
FINAL_STATES = ("finished", "failed")


@dataclass(frozen=True)
class DriverHealth:
    """Whether a run's driver lives, and the one line that says so."""

    alive: bool
    seen_s_ago: float | None  # since its last heartbeat (None: never seen)
    owner: str | None  # who holds the run folder, when someone does
    note: str  # one line for the user

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _health(storage: RunStorage, state: dict[str, Any] | None, *, settings_ok: bool = True) -> DriverHealth:
    now = time.time()
    lease = read_lease(storage)
    driver_state = (state or {}).get("driver_state")
    if lease is not None and lease.alive(now):
        return DriverHealth(True, round(lease.seen_s_ago(now), 1), lease.describe(),
                            f"driver: {driver_state or 'starting'} ({lease.describe()}, "
                            f"seen {lease.seen_s_ago(now):.0f} s ago)")
    if driver_state in FINAL_STATES:
        return DriverHealth(False, None, None, f"driver: {driver_state}")
    seen = [w for w in (lease.heartbeat_wall if lease else None, (state or {}).get("updated_wall"))
            if isinstance(w, (int, float)) and math.isfinite(w)]
    ago = round(max(0.0, now - max(seen)), 1) if seen else None
    resume = f"run `ray-saturn resume {storage.display}`" + ("" if settings_ok else f" once {RUN_FILE} is mended")
    if ago is None:
        note = f"driver not running (no heartbeat recorded): {resume}"
    else:
        note = f"driver not seen for {ago:.0f} s: {resume}"
    return DriverHealth(False, ago, None, note)


def run_status(storage: str | os.PathLike[str]) -> dict[str, Any]:
    """A run's persisted state with ``driver`` (a :class:`DriverHealth` as a dict) and ``state_source``.

    A damaged ``run.json`` (the run's settings, which ``resume`` needs) is said in
    ``settings_problem``: one line naming the file, what is wrong and how to recover.

    Raises:
        StorageError: one line, when the folder holds no run, or when its state files are damaged
            (or missing, with ``run.json`` damaged), nothing can be rebuilt from its events and no
            live driver will write them again.

    Example:
        >>> # run_status("/tmp/runs/lr-sweep")["tasks"]["bert-0"]["state"]
    """
    store = RunStorage(storage, create=False)
    journal = Journal(store)
    loaded = journal.load_state()
    state = loaded.state
    source = loaded.source
    problems = list(loaded.problems)
    settings, settings_problem = None, None
    if journal.has_settings():
        try:
            settings = journal.load_settings()
        except StorageError as exc:
            settings_problem = str(exc)
    if state is None:
        if not journal.holds_run() and read_lease(store) is None:
            raise StorageError(f"{store.display}: no ray_saturn run here (no {RUN_FILE})")
        state = _rebuilt_view(journal, problems, settings)
        source = EVENTS_FILE if state is not None else None
    out: dict[str, Any] = dict(state or {"tasks": {}})
    tasks = out.get("tasks") or {}
    o = RunOutcome.of(out.get("driver_state"), {t: r.get("state") for t, r in tasks.items() if isinstance(r, dict)})
    out["failed_tasks"] = len(o.failed)
    if o.every_task_failed:
        out["driver_state"] = o.state
        out["reason"] = out.get("reason") or f"every task failed ({len(o.failed)})"
        state = {**state, "driver_state": o.state} if state else state
    health = _health(store, state, settings_ok=settings_problem is None)
    damaged = [p for p in problems if not p.endswith(" is missing")]
    if state is None and damaged and not health.alive:
        raise StorageError(
            f"{store.display}: no readable run state ({'; '.join(damaged)}); put back a good "
            f"{STATE_FILE} or {STATE_BACKUP_FILE}, or start the run again in a new folder"
            + (f"; and {settings_problem}" if settings_problem else "")
        )
    if state is None and settings_problem and not health.alive:
        raise StorageError(settings_problem)  # nothing else to show: not an empty status
    if state is None:
        out["driver_state"] = "starting" if health.alive else "stopped"
    elif not health.alive and out.get("driver_state") not in FINAL_STATES:
        out["driver_state"] = "stopped"
    out["driver"] = health.to_dict()
    out["state_source"] = source
    if settings_problem:
        out["settings_problem"] = settings_problem
    if problems and source != "state.json":
        out["state_problems"] = [p for p in problems if not p.endswith(" is missing") or source is None]
    return out


def _rebuilt_view(journal: Journal, problems: list[str], settings: RunSettings | None) -> dict[str, Any] | None:
    """What ``resume`` would rebuild from the events (a view: nothing is written)."""
    from ray_saturn.runtime.rebuild import rebuild_state

    if not journal.storage.exists(EVENTS_FILE) or not journal.storage.exists(PROFILE_FILE):
        return None
    try:
        profile = journal.read_profile()
        scale = settings.time_scale if settings is not None and settings.mode == "emulate" else 1.0
        return rebuild_state(journal.events(), profile, time_scale=scale).state
    except Exception as exc:  # a view only: say what was wrong, never a traceback
        problems.append(f"the events could not be read ({type(exc).__name__}: {exc})".splitlines()[0])
        return None
