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
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from ray_saturn.errors import SaturnError
from ray_saturn.profile_table import ProfileTable
from ray_saturn.runtime.config import RunSettings
from ray_saturn.runtime.journal import Journal
from ray_saturn.runtime.launcher import on_head_node
from ray_saturn.runtime.records import TaskRecord
from ray_saturn.runtime.storage import RunStorage, StorageError
from ray_saturn.spec import ClusterSpec, Task

__all__ = ["DRIVER_NAMESPACE", "DriverActor", "connected", "driver_name", "prepare_run", "start_driver"]

logger = logging.getLogger(__name__)

DRIVER_NAMESPACE = "ray_saturn"


def _actor_cls():
    import ray

    @ray.remote(num_cpus=0, max_concurrency=4, max_restarts=0)
    class DriverActor:
        """Runs one :class:`~ray_saturn.runtime.driver.Driver` inside the cluster."""

        def __init__(self) -> None:
            self.driver = None

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

            storage = RunStorage(storage_uri)
            manager = PlacementGroupManager(
                ClusterSpec.from_ray(),
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
                launcher = TrainLauncher(manager, storage, tasks, report_interval_s=settings.report_interval_s)
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

    return DriverActor


_ACTOR = None


def DriverActor():
    """The Ray actor class of the driver (built lazily so Ray is imported lazily)."""
    global _ACTOR
    if _ACTOR is None:
        _ACTOR = _actor_cls()
    return _ACTOR


def driver_name(run_name: str) -> str:
    return f"driver:{run_name}"


@contextlib.contextmanager
def connected() -> Iterator[None]:
    """Join the running Ray cluster, or start a plain local one when none runs."""
    import ray

    if ray.is_initialized():
        yield
        return
    ray.init()  # RAY_ADDRESS / a running cluster is picked up; otherwise a local one starts
    try:
        yield
    finally:
        ray.shutdown()


def prepare_run(storage: RunStorage, settings: RunSettings, profile: ProfileTable) -> None:
    """Write a new run's settings and profile into its folder (refusing a folder that holds a run)."""
    journal = Journal(storage)
    if journal.has_state():
        raise StorageError(
            f"{storage.uri} already holds a run; resume it with `ray-saturn resume {storage.uri}` "
            "or choose another folder"
        )
    journal.write_settings(settings.to_dict())
    journal.write_profile(profile)


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
    ref = actor.run.remote(storage.uri, settings, profile, tasks, records, resume_state)
    return actor, ref
