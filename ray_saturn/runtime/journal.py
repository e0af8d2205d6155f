"""The run folder's files: their names (defined here only) and how they are read and written.

::

    RUN_DIR/
      run.json          RUN_FILE      what was asked (RunSettings), to resume
      profile.parquet   PROFILE_FILE  the profile the run plans from
      state.json        STATE_FILE    the driver's persisted state (rewritten atomically)
      events.jsonl      EVENTS_FILE   one JSON event per line: launches, re-plans, moves, exits
      plan.json         PLAN_FILE     the plan being followed
      gantt.png         GANTT_FILE    planned against actual, when a report drew it
      tasks/<task>/     TASKS_DIR     one task: Ray Train's run of it, and
        checkpoints/    CHECKPOINTS_DIR  its checkpoints (see :mod:`ray_saturn.strategies.checkpoint`)

:class:`Journal` reads and writes them on a :class:`RunStorage` (local or
any pyarrow URI); :func:`read_local_state` is the quiet reader a progress
display polls while the run writes. :data:`DEMO_PROFILE_STORE` names the
demo's profile cache.

Example:
    >>> import tempfile
    >>> j = Journal(RunStorage(tempfile.mkdtemp()))
    >>> j.has_state()
    False
    >>> j.write_state({"driver_state": "running"}); j.read_state()["driver_state"]
    'running'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ray_saturn.plan import Plan
from ray_saturn.profile_table import ProfileTable
from ray_saturn.runtime.storage import CHECKPOINTS_DIR, TASKS_DIR, RunStorage, StorageError

__all__ = [
    "CHECKPOINTS_DIR",
    "DEMO_PROFILE_STORE",
    "EVENTS_FILE",
    "GANTT_FILE",
    "PLAN_FILE",
    "PROFILE_FILE",
    "RUN_FILE",
    "STATE_FILE",
    "TASKS_DIR",
    "Journal",
    "read_local_state",
]

RUN_FILE = "run.json"
PROFILE_FILE = "profile.parquet"
STATE_FILE = "state.json"
EVENTS_FILE = "events.jsonl"
PLAN_FILE = "plan.json"
GANTT_FILE = "gantt.png"
#: The demo's profile store (a cache keyed by performance signature), under the user's cache folder.
DEMO_PROFILE_STORE = "demo-profile-v2.parquet"


class Journal:
    """The run folder's files on ``storage`` (see the module docstring)."""

    def __init__(self, storage: RunStorage) -> None:
        self.storage = storage

    @property
    def uri(self) -> str:
        return self.storage.uri

    # ------------------------------------------------------------- events
    def event(self, record: dict[str, Any]) -> None:
        """Append one event (a JSON object) to ``events.jsonl``."""
        self.storage.append_jsonl(EVENTS_FILE, record)

    def events(self) -> list[dict[str, Any]]:
        """Every event so far (torn lines skipped)."""
        return self.storage.read_jsonl(EVENTS_FILE)

    # -------------------------------------------------------------- state
    def has_state(self) -> bool:
        return self.storage.exists(STATE_FILE)

    def write_state(self, state: dict[str, Any]) -> None:
        self.storage.write_json(STATE_FILE, state)

    def read_state(self) -> dict[str, Any]:
        return self.storage.read_json(STATE_FILE)

    # --------------------------------------------------------------- plan
    def write_plan(self, plan: Plan) -> None:
        self.storage.write_json(PLAN_FILE, plan.to_dict())

    def read_plan(self) -> Plan | None:
        """The plan being followed (``None`` before the first one)."""
        if not self.storage.exists(PLAN_FILE):
            return None
        return Plan.from_dict(self.storage.read_json(PLAN_FILE))

    # ----------------------------------------------------------- settings
    def has_settings(self) -> bool:
        return self.storage.exists(RUN_FILE)

    def write_settings(self, settings: dict[str, Any]) -> None:
        self.storage.write_json(RUN_FILE, settings)

    def read_settings(self) -> dict[str, Any]:
        return self.storage.read_json(RUN_FILE)

    # ------------------------------------------------------------ profile
    def write_profile(self, profile: ProfileTable) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(profile.to_arrow(), sink)
        self.storage.write_bytes(PROFILE_FILE, sink.getvalue().to_pybytes())

    def read_profile(self) -> ProfileTable:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(pa.BufferReader(self.storage.read_bytes(PROFILE_FILE)))
        return ProfileTable(table, source=f"{self.storage.uri}/{PROFILE_FILE}")

    def __repr__(self) -> str:
        return f"Journal({self.storage.uri!r})"


def read_local_state(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``state.json`` of a local run folder, or ``None`` while it is missing or half-written."""
    path = Path(run_dir) / STATE_FILE
    if not path.is_file():
        return None
    try:
        return RunStorage(run_dir, create=False).read_json(STATE_FILE)
    except (StorageError, OSError):
        return None
