"""The driver actor and how a run folder is started: shared by :mod:`~ray_saturn.runtime.api`
(run, resume) and :mod:`~ray_saturn.runtime.emulation` (emulate).

:class:`DriverActor` builds the placement-group manager, the launcher and
the :class:`~ray_saturn.runtime.driver.Driver` inside the cluster and steps
it to the end. Library code never starts Ray with special settings:
:func:`connected` joins the running cluster (``RAY_ADDRESS``, ``ray job
submit``) and only starts a plain local one when none is running.

Example:
    >>> driver_name("sweep-1")
    'driver:sweep-1'
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from ray_saturn.errors import SaturnError
from ray_saturn.profile_table import ProfileTable
from ray_saturn.runtime.config import RunSettings
from ray_saturn.runtime.journal import (
    GANTT_FILE,
    PLAN_FILE,
    PROFILE_FILE,
    RUN_FILE,
    Journal,
)
from ray_saturn.runtime.launcher import on_head_node
from ray_saturn.runtime.lease import RunLease, live_owner, locked_error
from ray_saturn.runtime.records import DriverResult, TaskRecord
from ray_saturn.runtime.storage import TASKS_DIR, RunStorage, StorageError, redact_uri
from ray_saturn.spec import ClusterSpec, Task

__all__ = [
    "DRIVER_CLASS",
    "DRIVER_NAMESPACE",
    "DRIVER_PREFIX",
    "DriverActor",
    "DriverLost",
    "RunInterrupted",
    "check_new_run_folder",
    "connected",
    "driver_name",
    "enclosing_run",
    "end_orphaned_driver",
    "interrupts_named",
    "is_driver_class",
    "prepare_run",
    "start_driver",
    "wait_for_driver",
]

logger = logging.getLogger(__name__)

DRIVER_NAMESPACE = "ray_saturn"
#: The class name Ray records for the driver actor (the class's ``__qualname__``, set here: a class
#: defined inside a function is recorded as ``_actor_cls.<locals>.DriverActor`` otherwise).
DRIVER_CLASS = "DriverActor"
#: A driver actor is named ``driver:<run>`` in :data:`DRIVER_NAMESPACE`.
DRIVER_PREFIX = "driver:"


def is_driver_class(class_name: str) -> bool:
    """Whether Ray's recorded ``class_name`` of an actor is our driver's: :data:`DRIVER_CLASS`,
    or ``_actor_cls.<locals>.DriverActor`` as drivers of earlier versions were recorded."""
    return class_name.rsplit(".", 1)[-1] == DRIVER_CLASS


def _actor_cls():
    import ray

    class DriverActor:
        """Runs one :class:`~ray_saturn.runtime.driver.Driver` inside the cluster."""

        def __init__(self) -> None:
            self.driver = None
            self.storage_uri: str | None = None

        def folder(self) -> str | None:
            """The run folder this driver writes to (``None`` until it runs)."""
            return self.storage_uri

        def run(
            self,
            storage_uri: str,
            settings: RunSettings,
            profile: ProfileTable,
            tasks: Mapping[str, Task] | None,
            records: Mapping[str, Mapping[str, Any]] | None,
            resume_info: Mapping[str, Any] | None,
        ) -> dict[str, Any]:
            from ray_saturn.runtime.driver import Driver
            from ray_saturn.runtime.emulated import EmulatedLauncher
            from ray_saturn.runtime.pg_manager import PlacementGroupManager
            from ray_saturn.runtime.train_launcher import TrainLauncher

            self.storage_uri = storage_uri
            storage = RunStorage(storage_uri)
            live = ClusterSpec.from_ray()
            recorded = (settings.emulated_cluster or {}).get("cluster") if settings.mode == "emulate" else None
            if recorded:  # the nodes of a cluster file, called by their names in it
                from ray_saturn.runtime.emulation import name_emulated_nodes

                live = name_emulated_nodes(live, [n["name"] for n in recorded["nodes"]])
            manager = PlacementGroupManager(
                live,
                cpus_per_worker=settings.cpus_per_worker,
                run_name=settings.name,
            )
            manager.reclaim_stale()
            if settings.mode == "emulate":
                from ray_saturn.sim.workload import true_step_times

                launcher = EmulatedLauncher(
                    manager,
                    time_scale=settings.time_scale,
                    truth=true_step_times(profile, noise=settings.noise, seed=settings.driver.seed),
                    report_interval_s=min(settings.report_interval_s, 0.25),
                )
            else:
                if not tasks:
                    raise SaturnError("a training run needs its tasks")
                launcher = TrainLauncher(manager, storage, tasks, report_interval_s=settings.report_interval_s,
                                         reuse_workers=settings.driver.reuse_workers)
            info = dict(resume_info or {})
            self.driver = Driver(
                profile,
                manager,
                launcher,
                storage,
                settings.driver,
                records={t: TaskRecord.from_dict(r) for t, r in (records or {}).items()},
                clock_offset_s=float(info.get("time_s", 0.0)),
                planned_makespan_s=info.get("planned_makespan_s"),
                counters={
                    "replans": int(info.get("replans", 0)),
                    "moves": int(info.get("moves", 0)),
                },
                arrivals=settings.arrivals,
            )
            return self.driver.run().to_dict()

        def status(self) -> dict[str, Any]:
            if self.driver is None:
                return {"driver_state": "starting"}
            d = self.driver
            return {
                "driver_state": d.state.name,
                "time_s": d.now(),
                "tasks": {t: r.to_dict(d.now()) for t, r in d.records.items()},
            }

    DriverActor.__qualname__ = DRIVER_CLASS  # what Ray records, and what reclaim and the dashboard see
    return ray.remote(num_cpus=0, max_concurrency=4, max_restarts=0)(DriverActor)


_ACTOR = None


def DriverActor():
    """The Ray actor class of the driver (built lazily so Ray is imported lazily)."""
    global _ACTOR
    if _ACTOR is None:
        _ACTOR = _actor_cls()
    return _ACTOR


def driver_name(run_name: str) -> str:
    return f"{DRIVER_PREFIX}{run_name}"


@contextlib.contextmanager
def connected() -> Iterator[None]:
    """Join the running Ray cluster, or start a local one private to this process when none runs."""
    from ray_saturn.runtime.local import joined_or_private_ray

    with joined_or_private_ray():
        yield


def check_new_run_folder(storage: RunStorage, *, ours: RunLease | None = None) -> None:
    """Refuse a folder that already holds a run (its settings, state or events), in one line
    (naming its owner while that run is live and ``ours`` is not the lease it holds)."""
    if Journal(storage).holds_run():
        owner = live_owner(storage)
        if owner is not None and (ours is None or owner.owner != ours.info.owner):
            raise locked_error(storage, owner)
        raise StorageError(
            f"{storage.display} already holds a run; resume it with `ray-saturn resume {storage.display}` "
            "or choose another folder"
        )
    outer = enclosing_run(storage)
    if outer is not None:
        raise StorageError(
            f"{storage.display} is inside the folder of another run ({outer}); a new run there would mix its "
            "files with that run's (its task folders, its resume): give a folder outside every run folder"
        )
    tasks, files = _left_by_a_run(storage)
    if tasks or files:
        held = ([f"{TASKS_DIR}/ ({', '.join(tasks[:3])}{', ...' if len(tasks) > 3 else ''})"] if tasks else []) + files
        harm = " and ".join((["start its tasks from the checkpoints there"] if tasks else [])
                            + ([f"overwrite {', '.join(files)}"] if files else []))
        raise StorageError(
            f"{storage.display} holds {', '.join(held)} but no run to resume (no {RUN_FILE}); a new run here "
            f"would {harm}: give a new or empty folder, or move them away"
        )


def enclosing_run(storage: RunStorage) -> str | None:
    """The nearest folder above ``storage`` that holds a run, as said in messages (a URI with secrets
    redacted); ``None`` if none does. A folder holds a run when its ``run.json`` reads as a run's settings
    (a name and a mode): a stray ``state.json`` or ``events.jsonl`` of another program (in ``/tmp``, say)
    does not make every folder below it a run's. A folder above that cannot be read (no rights on a
    bucket's parent prefix) counts as holding none."""
    import posixpath
    from urllib.parse import urlsplit, urlunsplit


    path = os.path.realpath(storage.path) if storage.local else storage.path.rstrip("/")
    up = 0
    while True:
        parent = os.path.dirname(path) if storage.local else posixpath.dirname(path)
        if not parent or parent == path or (not storage.local and parent == "/"):
            return None
        path, up = parent, up + 1
        if not _holds_run_settings(storage.fs, posixpath.join(path, RUN_FILE)):
            continue
        if storage.local:
            return path
        s = urlsplit(storage.uri)
        above = s.path.rstrip("/")
        for _ in range(up):
            above = posixpath.dirname(above)
        return redact_uri(urlunsplit((s.scheme, s.netloc, above, s.query, s.fragment)))


def _holds_run_settings(fs: Any, path: str) -> bool:
    """Whether ``path`` is a small JSON object with a run's ``name`` and ``mode`` (never raises)."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    try:
        info = fs.get_file_info(path)
        if info.type != pafs.FileType.File or info.size > _MAX_RUN_FILE_BYTES:
            return False
        with fs.open_input_stream(path) as f:
            data = json.loads(f.read())
    except (OSError, ValueError, RecursionError, pa.ArrowException):
        return False
    return isinstance(data, dict) and isinstance(data.get("name"), str) and data.get("mode") in ("train", "emulate")


#: A run's ``run.json`` is a few KB; a larger file of that name is not one.
_MAX_RUN_FILE_BYTES = 1 << 20


def _left_by_a_run(storage: RunStorage) -> tuple[list[str], list[str]]:
    """The task folders and the files a run writes that a folder without a run holds (an earlier run's
    checkpoints and plan, or the user's own files of those names)."""
    files = [name for name in (PROFILE_FILE, PLAN_FILE, GANTT_FILE) if storage.exists(name)]
    return [e.name for e in storage.list(TASKS_DIR)], files


def _same_folder(uri: str, storage: RunStorage) -> bool:
    """Whether a driver's folder ``uri`` is ``storage`` (a local path however it was spelled)."""
    if uri == storage.uri:
        return True
    if storage.local and "://" not in uri:
        return os.path.realpath(uri) == os.path.realpath(storage.uri)
    return uri.rstrip("/") == storage.uri.rstrip("/")


def end_orphaned_driver(run_name: str, storage: RunStorage, *, budget_s: float = 120.0) -> bool:
    """End a driver of ``run_name`` that still runs although its run folder's lock is ours now.

    Its job is being torn down (the CLI that owned it was killed a moment ago), or its owner
    lost the lock (paused past the stale limit): either way it must not write to the folder
    any more, and its name must be free for the resumed driver. Waits until Ray has ended it.
    Returns whether there was one.

    A live driver of that name that says it runs another folder is not ours to end (two folders
    whose runs were given one name, or a ``run.json`` edited to another run's name): a one-line
    :class:`SaturnError`, and that run goes on.
    """
    import time

    import ray

    try:
        actor = ray.get_actor(driver_name(run_name), namespace=DRIVER_NAMESPACE)
    except ValueError:
        return False
    try:  # a driver being torn down may not answer: then it is the orphan this is for
        folder = ray.get(actor.folder.remote(), timeout=10)
    except Exception:
        folder = None
    if folder is not None and not _same_folder(folder, storage):
        raise SaturnError(
            f"a live run named {run_name!r} on this Ray cluster writes to {redact_uri(folder)}, not to "
            f"{storage.display}; it was left running: resume {storage.display} once that run has ended, "
            "or on another cluster"
        )
    logger.warning("ending the driver of run %s that outlived its run's lock", run_name)
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < budget_s:
        try:
            ray.get_actor(driver_name(run_name), namespace=DRIVER_NAMESPACE)
        except ValueError:
            return True
        time.sleep(0.2)
    raise SaturnError(
        f"the earlier driver of run {run_name} did not end within {budget_s:.0f} s of being killed; "
        "try again in a minute"
    )


def prepare_run(storage: RunStorage, settings: RunSettings, profile: ProfileTable) -> None:
    """Write a new run's settings and profile into its folder (refusing a folder that holds a run)."""
    check_new_run_folder(storage)
    journal = Journal(storage)
    journal.write_settings(settings.to_dict())
    journal.write_profile(profile)


class DriverLost(SaturnError):
    """The driver actor died before the run ended (the run folder stays resumable)."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C while a run went: its driver is stopped and the run folder stays resumable (the message
    names it). A ``KeyboardInterrupt``, so an interrupt still ends whatever called the run."""


@contextlib.contextmanager
def interrupts_named(storage: RunStorage, command: str) -> Iterator[None]:
    """Ctrl-C before the driver runs (joining Ray, profiling, starting the cluster or the driver)
    becomes a :class:`RunInterrupted` that says what the folder holds and how to go on: nothing
    when the run's settings were not written yet (run the command again), else ``resume``. Once
    the driver runs, :func:`wait_for_driver` says it."""
    try:
        yield
    except RunInterrupted:
        raise
    except KeyboardInterrupt:
        uri = storage.display
        try:
            started = Journal(storage).has_settings()
        except Exception:  # a storage error here must not hide the interrupt
            started = False
        if command == "resume":
            raise RunInterrupted(
                f"interrupted before the run went on; {uri} keeps what it did: `ray-saturn resume {uri}` continues it"
            ) from None
        if started:
            raise RunInterrupted(
                f"interrupted before the run's driver started; nothing was trained yet: "
                f"`ray-saturn resume {uri}` starts it"
            ) from None
        raise RunInterrupted(
            f"interrupted before the run started; nothing was written to {uri}: "
            f"run `ray-saturn {command}` again to start it"
        ) from None


def wait_for_driver(actor: Any, ref: Any, *, lease: RunLease, journal: Journal) -> DriverResult:
    """The driver's result. While waiting, the run folder's lease is watched: if another run took
    it over, the driver is stopped. A driver that dies is one line (:class:`DriverLost`), and an
    event that says when (``resume`` reads it to keep the run's clock)."""
    import time

    import ray
    from ray.exceptions import RayError

    try:
        while not ray.wait([ref], timeout=lease.heartbeat_s)[0]:
            if lease.lost is not None:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)  # another run owns the folder now: stop writing to it
                lease.check()
    except KeyboardInterrupt:
        # Ctrl-C: the run stops here (in a notebook the process, and so the driver, would live on), and
        # the user is told where it is and how to go on.
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        with contextlib.suppress(Exception):
            journal.event({"kind": "interrupted", "wall": round(time.time(), 3)})
        uri = journal.storage.display
        raise RunInterrupted(
            f"interrupted; {uri} keeps what the run did (finished tasks, checkpoints): "
            f"`ray-saturn resume {uri}` continues it"
        ) from None
    try:
        return DriverResult.from_dict(ray.get(ref))
    except RayError as exc:
        lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
        why = (lines[0] if lines else type(exc).__name__)[:300]
        with contextlib.suppress(StorageError):
            journal.event({"kind": "driver_lost", "wall": round(time.time(), 3), "reason": why})
        raise DriverLost(
            f"the driver of {journal.storage.display} died ({type(exc).__name__}: {why}); "
            f"`ray-saturn resume {journal.storage.display}` continues the run"
        ) from None


def start_driver(
    storage: RunStorage,
    settings: RunSettings,
    profile: ProfileTable,
    tasks: Mapping[str, Task] | None = None,
    *,
    resume_state: Mapping[str, Any] | None = None,
) -> Any:
    """Start the driver actor of a run (Ray connected); returns (actor, ref to its result)."""

    records = None
    if resume_state:
        records = resume_state.get("tasks", {})
    try:
        actor = (
            DriverActor()
            .options(
                name=driver_name(settings.name),
                namespace=DRIVER_NAMESPACE,
                # The driver runs on the head node: losing a GPU node must not take it.
                scheduling_strategy=on_head_node(),
            )
            .remote()
        )
    except ValueError as exc:
        if "already taken" not in str(exc):
            raise
        raise SaturnError(
            f"a run named {settings.name!r} is already running on this Ray cluster; "
            "give this run another name (runs on one cluster need distinct names)"
        ) from None
    ref = actor.run.remote(storage.uri, settings, profile, tasks, records, resume_state)
    return actor, ref
