"""Entry points of a training run: ``ray_saturn.run``, ``ray_saturn.resume`` and ``run_status``.

All of them go through the same driver actor
(:mod:`~ray_saturn.runtime.actor`), which builds the placement-group
manager, the launcher and the :class:`~ray_saturn.runtime.driver.Driver`
inside the cluster and steps it to the end. The emulation entry points
(``ray_saturn.emulate``) live in :mod:`~ray_saturn.runtime.emulation`.

Example:
    >>> # import ray_saturn
    >>> # result = ray_saturn.run(tasks, storage="/tmp/runs/sweep-1")
    >>> # result.state, result.realised_makespan_s
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterable
from typing import Any

from ray_saturn.errors import SaturnError
from ray_saturn.profile_table import ProfileTable
from ray_saturn.runtime.actor import DRIVER_NAMESPACE, connected, driver_name, prepare_run, start_driver
from ray_saturn.runtime.config import DriverConfig, RunSettings, check_policy
from ray_saturn.runtime.emulation import emulate, emulated_cluster, emulated_context
from ray_saturn.runtime.journal import RUN_FILE, Journal
from ray_saturn.runtime.records import DriverResult
from ray_saturn.runtime.storage import RunStorage, StorageError
from ray_saturn.spec import ClusterSpec, Task, check_unique_names

__all__ = [
    "DRIVER_NAMESPACE",
    "RunSettings",
    "driver_name",
    "emulate",
    "emulated_cluster",
    "resume",
    "run",
    "run_status",
]

logger = logging.getLogger(__name__)


def run(
    tasks: Iterable[Task],
    cluster: ClusterSpec | None = None,
    *,
    storage: str | os.PathLike[str],
    profile: ProfileTable | str | os.PathLike[str] | None = None,
    policy: str | None = None,
    name: str | None = None,
    config: DriverConfig | None = None,
    workload: str | None = None,
) -> DriverResult:
    """Profile (or load a profile), plan, execute and report a model-selection workload.

    Args:
        tasks: the tasks to train.
        cluster: the GPUs to use; default: every GPU node of the connected Ray cluster.
        storage: where the run lives: its folder and every checkpoint; a local path that every
            node sees, or a URI (``s3://bucket/run?endpoint_override=...``, ``gs://``, any
            pyarrow or fsspec URI). See :mod:`ray_saturn.runtime.storage`.
        profile: a ProfileTable or a profile file; default: ``ray_saturn.profile(tasks, cluster)``.
        policy: re-planning policy (``saturn-replan``, ``saturn-static``, ``saturn-periodic``,
            or a baseline planner); default: ``config.policy``, else ``saturn-replan``.
            Given together with ``config``, it must agree with ``config.policy``.
        config: driver settings (checkpoint interval, solver time limit, ...).

    Example:
        >>> # result = ray_saturn.run(tasks, storage="/tmp/runs/lr-sweep")
        >>> # [(t, r.state) for t, r in result.tasks.items()]
    """
    import ray

    task_list = check_unique_names(tasks)
    if config is not None and policy is not None and policy != config.policy:
        raise SaturnError(f"policy is {policy!r} but config.policy is {config.policy!r}; give it once")
    cfg = (config or DriverConfig()).with_policy(policy)
    check_policy(cfg.policy)  # before anything is profiled or started
    store = RunStorage(storage)
    store.check()  # a wrong endpoint or missing credentials: one line, before any GPU is held
    settings = RunSettings(name=name or f"run-{uuid.uuid4().hex[:8]}", mode="train", driver=cfg, workload=workload)
    with connected():
        live = ClusterSpec.from_ray()
        if cluster is not None:
            _check_cluster(cluster, live)
        if profile is None:
            from ray_saturn.profiler import profile as profile_fn

            table = profile_fn(task_list, live)
        elif isinstance(profile, ProfileTable):
            table = profile
        else:
            table = ProfileTable.read(profile)
        _check_profile(table, task_list)
        prepare_run(store, settings, table)
        _, ref = start_driver(store, settings, table, {t.name: t for t in task_list})
        return DriverResult.from_dict(ray.get(ref))


def resume(storage: str | os.PathLike[str], tasks: Iterable[Task] | None = None) -> DriverResult:
    """Continue a run whose driver stopped (killed, machine lost) from its run folder.

    Finished tasks are not run again; the others restart from their latest
    checkpoint. A training run needs its tasks: pass them, or the run must
    have been started from a workload file (``ray-saturn run WORKLOAD``).

    Example:
        >>> # ray_saturn.resume("/tmp/runs/lr-sweep")
    """
    import contextlib

    import ray

    store = RunStorage(storage, create=False)
    store.check()  # before any GPU is held
    journal = Journal(store)
    settings = RunSettings.from_dict(journal.read_settings())
    state = journal.read_state() if journal.has_state() else {}
    if state.get("driver_state") in ("finished",):
        logger.info("%s: the run already finished; nothing to resume", store.uri)
    profile = journal.read_profile()
    task_map: dict[str, Task] | None = None
    if settings.mode == "train":
        if tasks is None:
            if not settings.workload:
                raise SaturnError(
                    f"{store.uri}: the run was started from Python; pass its tasks to "
                    "ray_saturn.resume(run_dir, tasks=...)"
                )
            from ray_saturn.workload_file import load_workload

            tasks = load_workload(settings.workload)
        task_map = {t.name: t for t in check_unique_names(tasks)}
    journal.event({"kind": "resume", "wall": round(time.time(), 3), "time_s": state.get("time_s", 0.0)})
    ctx: contextlib.AbstractContextManager[Any] = (
        connected() if settings.mode == "train" else emulated_context(journal)
    )
    with ctx:
        _, ref = start_driver(store, settings, profile, task_map, resume_state=state)
        return DriverResult.from_dict(ray.get(ref))


def run_status(storage: str | os.PathLike[str]) -> dict[str, Any]:
    """A run's persisted state: driver state; per task state, strategy, GPUs, progress, ETA.

    Example:
        >>> # ray_saturn.runtime.api.run_status("/tmp/runs/lr-sweep")["tasks"]["bert-0"]["state"]
    """
    journal = Journal(RunStorage(storage, create=False))
    if not journal.has_state():
        if journal.has_settings():
            return {"driver_state": "starting", "tasks": {}}
        raise StorageError(f"{journal.uri}: no ray_saturn run here (no {RUN_FILE})")
    return journal.read_state()


def _check_cluster(cluster: ClusterSpec, live: ClusterSpec) -> None:
    by_id = {n.node_id: n for n in live.nodes}
    for n in cluster.nodes:
        if not n.node_id or n.node_id not in by_id:
            raise SaturnError(
                f"node {n.name!r} is not a node of the connected Ray cluster; "
                "pass ClusterSpec.from_ray() (or leave cluster=None)"
            )
    # Running uses the live nodes; an explicit cluster must describe them.


def _check_profile(profile: ProfileTable, tasks: list[Task]) -> None:
    names = {t.name for t in tasks}
    missing = [t for t in names if t not in set(profile.tasks)]
    if missing:
        raise SaturnError(f"the profile has no rows for task(s) {', '.join(sorted(missing)[:5])}; profile them")
    extra = [t for t in profile.tasks if t not in names]
    if extra:
        raise SaturnError(f"the profile has task(s) {', '.join(extra[:5])} that are not in the workload")
    from ray_saturn.strategies import strategy_names

    profile.check_strategies(strategy_names())
    profile.check_feasible()
    from ray_saturn.devices import refuse_unexecuted

    refuse_unexecuted(profile, "ray_saturn.run")
