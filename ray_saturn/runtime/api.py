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
from dataclasses import replace
from typing import Any

from ray_saturn.errors import SaturnError, SpecError
from ray_saturn.profile_table import ProfileTable
from ray_saturn.runtime.actor import (
    DRIVER_NAMESPACE,
    check_new_run_folder,
    connected,
    driver_name,
    end_orphaned_driver,
    interrupts_named,
    prepare_run,
    start_driver,
    wait_for_driver,
)
from ray_saturn.runtime.config import DriverConfig, RunSettings, check_policy
from ray_saturn.runtime.emulation import emulate, emulated_cluster, emulated_context
from ray_saturn.runtime.journal import EVENTS_FILE, RUN_FILE, Journal
from ray_saturn.runtime.lease import RunLease
from ray_saturn.runtime.reclaim import reclaim_dead_runs
from ray_saturn.runtime.records import DriverResult
from ray_saturn.runtime.status import run_status
from ray_saturn.runtime.storage import RunStorage, StorageError
from ray_saturn.spec import ClusterSpec, Task, check_unique_names

__all__ = [
    "DRIVER_NAMESPACE",
    "RunSettings",
    "check_profile",
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
            One run at a time: the folder is locked while the run goes
            (:mod:`~ray_saturn.runtime.lease`), and a folder that holds a run is refused.
        profile: a ProfileTable or a profile file; default: ``ray_saturn.profile(tasks, cluster)``.
        policy: re-planning policy (``saturn-replan``, ``saturn-static``, ``saturn-periodic``,
            or a baseline planner); default: ``config.policy``, else ``saturn-replan``.
            Given together with ``config``, it must agree with ``config.policy``.
        config: driver settings (checkpoint interval, solver time limit, ...).
        workload: the workload file the tasks came from; its path and SHA-256 are recorded,
            so that ``resume`` reloads it (and only while its bytes are unchanged).

    Example:
        >>> # result = ray_saturn.run(tasks, storage="/tmp/runs/lr-sweep")
        >>> # [(t, r.state) for t, r in result.tasks.items()]
    """
    task_list = check_unique_names(tasks)
    from ray_saturn.strategies.introspect import check_trainable

    for t in task_list:  # before anything is profiled or started: every attempt would fail on the workers
        check_trainable(t)
    if config is not None and policy is not None and policy != config.policy:
        raise SaturnError(f"policy is {policy!r} but config.policy is {config.policy!r}; give it once")
    cfg = (config or DriverConfig()).with_policy(policy)
    check_policy(cfg.policy)  # before anything is profiled or started
    digest = None
    if workload is not None:
        from ray_saturn.workload_file import workload_digest

        workload = os.path.abspath(workload)
        digest = workload_digest(workload)
    table = None
    if profile is not None:  # checked before the folder is locked or Ray joined
        table = profile if isinstance(profile, ProfileTable) else ProfileTable.read(profile)
        check_profile(table, task_list)
    settings = RunSettings(
        name=name or f"run-{uuid.uuid4().hex[:8]}",
        mode="train",
        driver=cfg,
        workload=workload,
        workload_digest=digest,
    )
    store = RunStorage(storage)
    with store.removed_if_refused():  # a refused run leaves no empty folder
        store.check()  # a wrong endpoint or missing credentials: one line, before any GPU is held
        check_new_run_folder(store)  # a folder that holds a run: refused before its lock is touched
    with RunLease(store, command="run", run_name=settings.name).held() as lease, interrupts_named(store, "run"):
        check_new_run_folder(store, ours=lease)  # before profiling, not after
        with connected():
            live = ClusterSpec.from_ray()
            if cluster is not None:
                _check_cluster(cluster, live)
            if table is None:
                from ray_saturn.profiler import profile as profile_fn

                table = profile_fn(task_list, live)
                check_profile(table, task_list)
            prepare_run(store, settings, table)
            reclaim_dead_runs()
            actor, ref = start_driver(store, settings, table, {t.name: t for t in task_list})
            return wait_for_driver(actor, ref, lease=lease, journal=Journal(store))


def resume(
    storage: str | os.PathLike[str],
    tasks: Iterable[Task] | None = None,
    *,
    workload: str | os.PathLike[str] | None = None,
) -> DriverResult:
    """Continue a run whose driver stopped (killed, machine lost) from its run folder.

    Finished tasks are not run again; the others restart from their latest
    checkpoint. A training run needs its tasks: pass them, or the run must
    have been started from a workload file (``ray-saturn run WORKLOAD``),
    which is reloaded only while its SHA-256 is the one recorded at ``run``;
    pass ``workload`` to run a file you vouch for (it becomes the recorded one).
    An emulated run has no tasks to pass: ``tasks`` or ``workload`` is a
    one-line :class:`SpecError`. A run that already finished is not started
    again: its result is returned as persisted, nothing started or written.

    A folder whose lock is held by a live run is refused; a lock whose owner
    is dead is taken over (with a warning that says whose it was). What a
    dead driver of this run left on the cluster (placement groups, Ray
    Train controllers and their cleaner actors) is ended first. When
    ``state.json`` and its backup are both unusable, the state is rebuilt
    from ``events.jsonl`` (finished tasks stay finished, the run's clock and
    history are kept) and a warning says what could not be.

    Example:
        >>> # ray_saturn.resume("/tmp/runs/lr-sweep")
    """
    import contextlib

    store = RunStorage(storage, create=False)
    store.check()  # before any GPU is held
    journal = Journal(store)
    settings = _read_settings(journal)
    if settings.mode != "train" and (tasks is not None or workload is not None):
        raise SpecError(
            f"{store.display} is an emulated run: it has no workload file or tasks; "
            "resume it without --workload (or tasks=)"
        )
    done = _finished_result(journal)
    if done is not None:  # before the lock, the workload check and any cluster: nothing is left to run
        logger.warning("%s: the run already finished; nothing to resume", store.display)
        return done
    # Refusals before taking the lock touch nothing (taking a dead run's lock and releasing it would hide
    # from the next resume whose it was), and come before any cluster: a damaged profile, a task folder
    # linked out of the run folder (the driver opens them as it starts), an untrusted workload file.
    profile = journal.read_profile()
    for name in profile.tasks:
        store.task_dir(name)
    task_map: dict[str, Task] | None = None
    recorded = settings
    if settings.mode == "train":
        if tasks is None:
            tasks, settings = _trusted_workload(journal, settings, workload)
        task_list = check_unique_names(tasks)
        try:  # the run's own profile: the tasks, steps and strategies it started with
            check_profile(profile, task_list)
        except SaturnError as exc:
            what = str(exc).rsplit("; ", 1)[0]  # its fix is for a new run's profile
            raise SpecError(f"{what}; a resumed run trains the tasks it started with, as its profile says: pass "
                            "the workload it started with (or start a new run)") from None
        task_map = {t.name: t for t in task_list}
    with RunLease(store, command="resume", run_name=settings.name).held() as lease, interrupts_named(store, "resume"):
        state = _resume_state(journal, settings, lease)
        if settings is not recorded:  # a workload file passed explicitly: the run's workload from now on
            journal.write_settings(settings.to_dict())
        journal.event({"kind": "resume", "wall": round(time.time(), 3), "time_s": state.get("time_s", 0.0)})
        ctx: contextlib.AbstractContextManager[Any] = (
            connected() if settings.mode == "train" else emulated_context(journal)
        )
        with ctx:
            end_orphaned_driver(settings.name, store)
            reclaim_dead_runs([settings.name])
            actor, ref = start_driver(store, settings, profile, task_map, resume_state=state)
            return wait_for_driver(actor, ref, lease=lease, journal=journal)


def _read_settings(journal: Journal) -> RunSettings:
    return journal.load_settings()


def _finished_result(journal: Journal) -> DriverResult | None:
    """The persisted result of a run whose driver finished, read from its state (``None`` otherwise)."""
    from ray_saturn.runtime.records import TaskRecord

    state = journal.load_state().state
    if state is None or state.get("driver_state") != "finished":
        return None
    planned = state.get("planned_makespan_s")
    return DriverResult(
        state="finished",
        planned_makespan_s=float(planned) if isinstance(planned, (int, float)) else None,
        realised_makespan_s=float(state.get("time_s", 0.0)),
        replans=int(state.get("replans", 0)),
        moves=int(state.get("moves", 0)),
        tasks={t: TaskRecord.from_dict(r) for t, r in state["tasks"].items()},
        reason=str(state.get("reason") or ""),
    )


def _resume_state(journal: Journal, settings: RunSettings, lease: RunLease) -> dict[str, Any]:
    """The state to resume from: ``state.json``, its backup, or one rebuilt from the events."""
    from ray_saturn.runtime.rebuild import rebuild_state

    loaded = journal.load_state()
    if loaded.state is not None:
        if loaded.fell_back:
            journal.event({"kind": "state_fallback", "wall": round(time.time(), 3), "problems": loaded.problems})
        return loaded.state
    if not journal.storage.exists(EVENTS_FILE) and not journal.has_state():
        return {}  # the driver never started: a fresh start of the same run
    dead = lease.taken_over
    rebuilt = rebuild_state(
        journal.events(),
        journal.read_profile(),
        time_scale=settings.time_scale if settings.mode == "emulate" else 1.0,
        last_seen_wall=dead.heartbeat_wall if dead is not None else None,
    )
    logger.warning("%s: %s; %s", journal.storage.display, "; ".join(loaded.problems), rebuilt.summary())
    journal.event({"kind": "state_rebuilt", "wall": round(time.time(), 3), "problems": loaded.problems,
                   "finished": rebuilt.finished, "resumable": rebuilt.resumable, "given_up": rebuilt.given_up,
                   "notes": rebuilt.notes})
    return rebuilt.state


def _trusted_workload(
    journal: Journal, settings: RunSettings, workload: str | os.PathLike[str] | None
) -> tuple[list[Task], RunSettings]:
    """The tasks of the run's workload file, loaded only if it is the file the run started with, and the
    run's settings (naming a file passed explicitly, for the caller to record once it holds the folder).

    ``run.json`` is in the run folder, which others may be able to write (a
    shared bucket): the file it names runs only while its SHA-256 is the one
    recorded at ``run``. A file passed explicitly is the user's word, and is
    recorded as the run's workload from then on.
    """
    from ray_saturn.workload_file import load_workload, workload_digest

    if workload is not None:
        path = os.path.abspath(workload)
        digest = workload_digest(path)
        if settings.workload_digest and digest != settings.workload_digest:
            logger.warning("%s differs from the workload file the run started with; running it because it was "
                           "passed explicitly", path)
        tasks = load_workload(path)
        return tasks, replace(settings, workload=path, workload_digest=digest)
    digest = _check_recorded_workload(journal, settings)
    tasks = load_workload(settings.workload)
    if workload_digest(settings.workload) != digest:  # changed while it loaded
        raise SaturnError(f"{settings.workload} changed while it was loaded; try again")
    return tasks, settings


def _check_recorded_workload(journal: Journal, settings: RunSettings) -> str:
    """The SHA-256 of the run's recorded workload file; raises unless it is the one recorded at ``run``."""
    from ray_saturn.workload_file import workload_digest

    uri = journal.storage.display
    if not settings.workload:
        raise SaturnError(
            f"{uri}: the run was started from Python; pass its tasks to "
            "ray_saturn.resume(run_dir, tasks=...)"
        )
    if not isinstance(settings.workload, str):
        raise StorageError(
            f"{uri}/{RUN_FILE}: workload is {settings.workload!r}, not the path of a workload file; check the "
            f"file the run started with and pass it explicitly: `ray-saturn resume {uri} --workload FILE`"
        )
    explicit = f"`ray-saturn resume {uri} --workload {settings.workload}`"
    if not isinstance(settings.workload_digest, str) or not settings.workload_digest:
        raise SaturnError(
            f"{uri}/{RUN_FILE} records no SHA-256 of the workload file {settings.workload}, so resume cannot "
            f"tell it is the file the run started with; check it and pass it explicitly: {explicit}"
        )
    digest = workload_digest(settings.workload)
    if digest != settings.workload_digest:
        raise SaturnError(
            f"{settings.workload} changed since the run started (SHA-256 {digest[7:19]}..., recorded "
            f"{settings.workload_digest[7:19]}...); resume does not run a changed workload file: check it, "
            f"then pass it explicitly: {explicit}"
        )
    return digest


def _check_cluster(cluster: ClusterSpec, live: ClusterSpec) -> None:
    by_id = {n.node_id: n for n in live.nodes}
    for n in cluster.nodes:
        if not n.node_id or n.node_id not in by_id:
            raise SaturnError(
                f"node {n.name!r} is not a node of the connected Ray cluster; "
                "pass ClusterSpec.from_ray() (or leave cluster=None)"
            )
    # Running uses the live nodes; an explicit cluster must describe them.


def check_profile(profile: ProfileTable, tasks: list[Task]) -> None:
    """Raise unless ``profile`` covers exactly ``tasks``, with registered strategies and a feasible row each."""
    names = {t.name for t in tasks}
    missing = [t for t in names if t not in set(profile.tasks)]
    if missing:
        raise SaturnError(f"{profile.source}: the profile has no rows for task(s) {', '.join(sorted(missing)[:5])}; "
                          "profile them")
    extra = [t for t in profile.tasks if t not in names]
    if extra:
        raise SaturnError(f"{profile.source}: the profile has task(s) {', '.join(extra[:5])} that are not in the "
                          "workload")
    from ray_saturn.strategies import strategy_names

    profile.check_strategies(strategy_names())
    _check_rows_fit_tasks(profile, {t.name: t for t in tasks})
    profile.check_feasible()


def _check_rows_fit_tasks(profile: ProfileTable, tasks: dict[str, Task]) -> None:
    """Raise unless every row trains its task as the workload says: the task's steps, a strategy the
    task allows, and (for a feasible row) a GPU count the strategy can run the task on.

    The run trains each task to its rows' ``steps`` with the rows' strategies, so a row that disagrees
    with the workload would train another number of steps (the run still says finished) or a strategy
    the task ruled out, or fail on the workers only after the run has started.
    """
    from ray_saturn.errors import ProfileError
    from ray_saturn.strategies.registry import get_strategy

    checked: dict[tuple[str, str, int], str | None] = {}
    for i, c in enumerate(profile, start=1):
        task = tasks[c.task]
        where = f"{profile.source} row {i} (task {c.task!r}, {c.strategy} on {c.gpus:g} GPU(s))"
        if c.steps != task.total_steps:
            raise ProfileError(
                f"{where}: steps is {c.steps}, but the workload trains {c.task!r} for {task.total_steps} steps; "
                f"set steps to {task.total_steps} (or profile the workload again)"
            )
        if task.strategies is not None and c.strategy not in task.strategies:
            raise ProfileError(
                f"{where}: task {c.task!r} allows only {', '.join(task.strategies)} (its strategies=); "
                "drop the row or allow the strategy"
            )
        if not c.feasible:
            continue
        workers = 1 if c.is_share else int(c.gpus)
        key = (c.task, c.strategy, workers)
        if key not in checked:
            try:
                checked[key] = get_strategy(c.strategy).applies(task, workers)
            except Exception as exc:  # the model cannot be built here (it may need the workers' GPUs)
                logger.debug("cannot check %s for %s here: %s", c.strategy, c.task, exc)
                checked[key] = None
        if checked[key]:
            raise ProfileError(f"{where}: {checked[key]}; mark the row infeasible or drop it")
