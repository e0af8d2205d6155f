"""The run folder's files: their names (defined here only) and how they are read and written.

::

    RUN_DIR/
      run.json          RUN_FILE      what was asked (RunSettings), to resume
      profile.parquet   PROFILE_FILE  the profile the run plans from
      state.json        STATE_FILE    the driver's persisted state (rewritten atomically)
      state.json.bak    STATE_BACKUP_FILE  the state before the latest write (read when state.json is damaged)
      lease.json        (lease.py)    who runs the folder now, and its heartbeat
      events.jsonl      EVENTS_FILE   one JSON event per line: launches, re-plans, moves, exits
      plan.json         PLAN_FILE     the plan being followed
      gantt.png         GANTT_FILE    planned against actual, when a report drew it
      tasks/<task>/     TASKS_DIR     one task: Ray Train's run of it, and
        checkpoints/    CHECKPOINTS_DIR  its checkpoints (see :mod:`ray_saturn.strategies.checkpoint`)

:class:`Journal` reads and writes them on a :class:`RunStorage` (local or
any pyarrow URI); :func:`read_local_state` is the quiet reader a progress
display polls while the run writes. :meth:`Journal.load_state` reads the
state with its fallback (the backup) and says what was wrong; a state whose
shape is wrong is rejected in one line (:func:`state_problem`). A write that
fails (a read-only folder, a full disk) raises a one-line
:class:`RunFolderUnwritable`. :data:`DEMO_PROFILE_STORE` names the
demo's profile cache.

Example:
    >>> import tempfile
    >>> j = Journal(RunStorage(tempfile.mkdtemp()))
    >>> j.has_state()
    False
    >>> j.write_state({"driver_state": "running", "tasks": {}}); j.read_state()["driver_state"]
    'running'
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray_saturn.plan import Plan
from ray_saturn.profile_table import ProfileTable
from ray_saturn.runtime.storage import CHECKPOINTS_DIR, TASKS_DIR, RunStorage, StorageError

if TYPE_CHECKING:
    from ray_saturn.runtime.config import RunSettings

__all__ = [
    "CHECKPOINTS_DIR",
    "DEMO_PROFILE_STORE",
    "EVENTS_FILE",
    "GANTT_FILE",
    "PLAN_FILE",
    "PROFILE_FILE",
    "RUN_FILE",
    "STATE_BACKUP_FILE",
    "STATE_FILE",
    "TASKS_DIR",
    "Journal",
    "LoadedState",
    "RunFolderUnwritable",
    "read_local_state",
    "state_problem",
]

logger = logging.getLogger(__name__)

RUN_FILE = "run.json"
PROFILE_FILE = "profile.parquet"
STATE_FILE = "state.json"
STATE_BACKUP_FILE = "state.json.bak"
EVENTS_FILE = "events.jsonl"
PLAN_FILE = "plan.json"
GANTT_FILE = "gantt.png"
#: The demo's profile store (a cache keyed by performance signature), under the user's cache folder.
DEMO_PROFILE_STORE = "demo-profile-v2.parquet"


class RunFolderUnwritable(StorageError):
    """A write to the run folder failed (read-only, full, gone): the run stops, resumable."""


def state_problem(state: Any) -> str | None:
    """What is wrong with the shape of a persisted state (``None``: nothing)."""
    from ray_saturn.runtime.records import TaskRecord

    if not isinstance(state, dict):
        return f"it holds a JSON {type(state).__name__}, not an object"
    if not isinstance(state.get("driver_state"), str):
        return "it has no driver_state"
    tasks = state.get("tasks")
    if not isinstance(tasks, dict):
        return "its tasks are not an object of task records"
    for name, rec in tasks.items():
        try:
            TaskRecord.from_dict(rec)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return f"task {name!r} is not a task record ({type(exc).__name__}: {exc})"
    for key in ("time_s", "replans", "moves"):
        if key in state and not isinstance(state[key], (int, float)):
            return f"its {key} is not a number"
    return None


@dataclass
class LoadedState:
    """A persisted state as read: where it came from, and what was wrong with what was skipped."""

    state: dict[str, Any] | None
    source: str | None  # STATE_FILE, STATE_BACKUP_FILE, or None (no usable state)
    problems: list[str] = field(default_factory=list)

    @property
    def fell_back(self) -> bool:
        return self.source == STATE_BACKUP_FILE


class Journal:
    """The run folder's files on ``storage`` (see the module docstring)."""

    def __init__(self, storage: RunStorage) -> None:
        self.storage = storage
        self._last_state: bytes | None = None  # the newest state written (the next backup)

    @contextlib.contextmanager
    def _writing(self, name: str) -> Iterator[None]:
        try:
            yield
        except RunFolderUnwritable:
            raise
        except (OSError, StorageError) as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            where = self.storage.display
            raise RunFolderUnwritable(
                f"cannot write {where}/{name} ({text}); make the run folder writable, "
                f"then `ray-saturn resume {where}`"
            ) from None

    @property
    def uri(self) -> str:
        return self.storage.uri

    # ------------------------------------------------------------- events
    def event(self, record: dict[str, Any]) -> None:
        """Append one event (a JSON object) to ``events.jsonl``."""
        with self._writing(EVENTS_FILE):
            self.storage.append_jsonl(EVENTS_FILE, record)

    def events(self) -> list[dict[str, Any]]:
        """Every event so far (torn lines skipped)."""
        return self.storage.read_jsonl(EVENTS_FILE)

    # -------------------------------------------------------------- state
    def has_state(self) -> bool:
        """Whether a state was written (``state.json`` or its backup)."""
        return self.storage.exists(STATE_FILE) or self.storage.exists(STATE_BACKUP_FILE)

    def holds_run(self) -> bool:
        """Whether a run was started here (its settings, a state or events exist)."""
        return any(self.storage.exists(n) for n in (RUN_FILE, STATE_FILE, STATE_BACKUP_FILE, EVENTS_FILE))

    def write_state(self, state: dict[str, Any]) -> None:
        """Write the state; the one it replaces becomes ``state.json.bak`` (each write atomic)."""
        import json

        data = (json.dumps(state, indent=1, sort_keys=True) + "\n").encode()
        with self._writing(STATE_FILE):
            if self._last_state is None:  # the first write of this process: back up a good state.json
                with contextlib.suppress(ValueError, StorageError):
                    loaded = self._load(STATE_FILE)
                    if loaded is not None:
                        self._last_state = loaded[1]
            if self._last_state is not None:
                self.storage.write_bytes(STATE_BACKUP_FILE, self._last_state)
            self.storage.write_bytes(STATE_FILE, data)
        self._last_state = data

    def _load(self, name: str) -> tuple[dict[str, Any], bytes] | None:
        """A good state from ``name`` and its bytes; ``None`` if missing; raises ValueError if bad."""
        import json

        if not self.storage.exists(name):
            return None
        data = self.storage.read_bytes(name)
        try:
            state = json.loads(data)
        except ValueError as exc:
            raise ValueError(f"{name} is not valid JSON ({exc})") from None
        problem = state_problem(state)
        if problem:
            raise ValueError(f"{name} is not a run state: {problem}")
        return state, data

    def load_state(self) -> LoadedState:
        """The newest usable state: ``state.json``, else its backup; says what was skipped and why."""
        problems: list[str] = []
        for name in (STATE_FILE, STATE_BACKUP_FILE):
            try:
                got = self._load(name)
            except (ValueError, StorageError) as exc:
                problems.append(str(exc))
                continue
            if got is None:
                if name == STATE_FILE:
                    problems.append(f"{name} is missing")
                continue
            if problems:
                logger.warning("%s: %s; using %s", self.storage.display, "; ".join(problems), name)
            return LoadedState(got[0], name, problems)
        return LoadedState(None, None, problems)

    def read_state(self) -> dict[str, Any]:
        """The newest usable state (see :meth:`load_state`); a one-line :class:`StorageError` if none."""
        loaded = self.load_state()
        if loaded.state is None:
            raise StorageError(
                f"{self.storage.display}: no usable run state ({'; '.join(loaded.problems)}); "
                f"`ray-saturn resume {self.storage.display}` rebuilds it from {EVENTS_FILE}"
            )
        return loaded.state

    # --------------------------------------------------------------- plan
    def write_plan(self, plan: Plan) -> None:
        with self._writing(PLAN_FILE):
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
        with self._writing(RUN_FILE):
            self.storage.write_json(RUN_FILE, settings)

    def read_settings(self) -> dict[str, Any]:
        return self.storage.read_json(RUN_FILE)

    def load_settings(self) -> RunSettings:
        """The run's settings from ``run.json``: a one-line :class:`StorageError` naming the file, what is
        wrong and how to recover when it is missing or damaged (nothing is written either way)."""
        from ray_saturn.errors import SaturnError
        from ray_saturn.runtime.config import RunSettings

        where = self.storage.display
        path = f"{where}/{RUN_FILE}"
        if not self.has_settings():
            raise StorageError(f"{where}: no ray_saturn run here (no {RUN_FILE}); give the folder a run was started in")
        recover = (f"put back the {RUN_FILE} the run started with (or mend it), or start the run again "
                   "in a new folder; nothing in the run folder was changed")
        try:
            raw = self.storage.read_json(RUN_FILE)
        except StorageError as exc:
            raise StorageError(f"{exc}; {recover}".replace(f"{where}: {RUN_FILE}", path, 1)) from None
        try:
            return RunSettings.from_dict(raw)
        except SaturnError as exc:
            what = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            what = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise StorageError(f"{path} is not the settings of a run: {what}; {recover}")

    # ------------------------------------------------------------ profile
    def write_profile(self, profile: ProfileTable) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(profile.to_arrow(), sink)
        with self._writing(PROFILE_FILE):
            self.storage.write_bytes(PROFILE_FILE, sink.getvalue().to_pybytes())

    def read_profile(self) -> ProfileTable:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.storage.exists(PROFILE_FILE) and self.storage.exists(RUN_FILE):
            # run.json is written first: the run stopped while profiling, before anything trained.
            raise StorageError(
                f"{self.storage.display} has the run's {RUN_FILE} but no {PROFILE_FILE}: the run stopped before "
                "its profile was written, so nothing was trained; start it again in a new folder (or remove "
                "this one)"
            )
        data = self.storage.read_bytes(PROFILE_FILE)
        try:
            table = pq.read_table(pa.BufferReader(data))
        except (pa.ArrowException, OSError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StorageError(
                f"{self.storage.display}/{PROFILE_FILE} is damaged ({first}); the run plans from it: put back "
                "the profile the run started with (ProfileTable.read(FILE).write(...) writes it as Parquet), "
                "or start the run again in a new folder"
            ) from None
        return ProfileTable(table, source=f"{self.storage.uri}/{PROFILE_FILE}")

    def __repr__(self) -> str:
        return f"Journal({self.storage.uri!r})"


def read_local_state(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The state of a local run folder (its backup while ``state.json`` is rewritten), or ``None``."""
    folder = Path(run_dir)
    if not (folder / STATE_FILE).is_file() and not (folder / STATE_BACKUP_FILE).is_file():
        return None
    try:
        return Journal(RunStorage(run_dir, create=False)).load_state().state
    except (StorageError, OSError):
        return None
