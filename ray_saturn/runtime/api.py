"""Entry points: ``ray_saturn.run``, ``ray_saturn.resume``, ``ray_saturn.emulate``, ``status``.

All of them go through the same driver actor (:class:`DriverActor`), which
builds the placement-group manager, the launcher and the
:class:`~ray_saturn.runtime.driver.Driver` inside the cluster and steps it
to the end. Library code never starts Ray with special settings: it joins
the running cluster (``RAY_ADDRESS``, ``ray job submit``) and only starts a
plain local one when none is running. ``emulate`` is the exception by
design: it starts its own local multi-node ``ray.cluster_utils.Cluster``
with logical GPUs (contract 3).

Example:
    >>> # import ray_saturn
    >>> # result = ray_saturn.run(tasks, storage="/tmp/runs/sweep-1")
    >>> # result.state, result.realised_makespan_s
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ray_saturn.errors import SaturnError
from ray_saturn.profile_table import ProfileTable
from ray_saturn.runtime.driver import (
    STATE_FILE,
    DriverConfig,
    DriverResult,
    TaskRecord,
)
from ray_saturn.runtime.launcher import head_node_id
from ray_saturn.runtime.storage import RunStorage, StorageError
from ray_saturn.spec import ClusterSpec, Task, check_name, check_unique_names

__all__ = [
    "RUN_FILE",
    "RunSettings",
    "emulate",
    "emulated_cluster",
    "resume",
    "run",
    "run_status",
    "start_driver",
]

logger = logging.getLogger(__name__)

RUN_FILE = "run.json"
PROFILE_FILE = "profile.parquet"
DRIVER_NAMESPACE = "ray_saturn"


@dataclass(frozen=True)
class RunSettings:
    """What a run was asked to do (persisted in ``run.json`` so it can be resumed)."""

    name: str
    mode: str  # "train" or "emulate"
    driver: DriverConfig = field(default_factory=DriverConfig)
    time_scale: float = 1.0
    noise: float = 0.0
    workload: str | None = None
    report_interval_s: float = 0.5
    cpus_per_worker: float = 0.0
    emulated_cluster: dict[str, int] | None = None  # {"nodes": N, "gpus_per_node": G}
    arrivals: dict[str, float] = field(default_factory=dict)  # task -> arrival (profile s)

    def __post_init__(self) -> None:
        check_name(self.name, "run name")
        if self.mode not in ("train", "emulate"):
            raise SaturnError(f"run mode {self.mode!r} must be train or emulate")
        if not self.time_scale > 0:
            raise SaturnError(f"time scale is {self.time_scale}; it must be > 0")
        if self.noise < 0:
            raise SaturnError(f"noise is {self.noise}; it must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["driver"] = asdict(self.driver)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSettings:
        d = dict(d)
        d["driver"] = DriverConfig(**d.get("driver", {}))
        return cls(**d)


# ---------------------------------------------------------------- actor
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
    global _ACTOR
    if _ACTOR is None:
        _ACTOR = _actor_cls()
    return _ACTOR


def driver_name(run_name: str) -> str:
    return f"driver:{run_name}"


# ---------------------------------------------------------------- ray
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


def start_driver(
    storage: RunStorage,
    settings: RunSettings,
    profile: ProfileTable,
    tasks: Mapping[str, Task] | None = None,
    *,
    resume_state: Mapping[str, Any] | None = None,
) -> Any:
    """Start the driver actor of a run (Ray connected); returns (actor, ref to its result)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    records = None
    if resume_state:
        records = resume_state.get("tasks", {})
    actor = (
        DriverActor()
        .options(
            name=driver_name(settings.name),
            namespace=DRIVER_NAMESPACE,
            # The driver runs on the head node: losing a GPU node must not take it.
            scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id(), soft=True),
        )
        .remote()
    )
    ref = actor.run.remote(storage.uri, settings, profile, tasks, records, resume_state)
    return actor, ref


def _result(d: Mapping[str, Any]) -> DriverResult:
    tasks = {r["task"]: TaskRecord.from_dict(r) for r in d["tasks"]}
    return DriverResult(
        state=d["state"],
        planned_makespan_s=d["planned_makespan_s"],
        realised_makespan_s=float(d["realised_makespan_s"]),
        replans=int(d["replans"]),
        moves=int(d["moves"]),
        tasks=tasks,
        reason=d.get("reason", ""),
    )


def _prepare(storage: RunStorage, settings: RunSettings, profile: ProfileTable) -> None:
    if storage.exists(STATE_FILE):
        raise StorageError(
            f"{storage.uri} already holds a run; resume it with `ray-saturn resume {storage.uri}` "
            "or choose another folder"
        )
    storage.write_json(RUN_FILE, settings.to_dict())
    storage.write_bytes(PROFILE_FILE, _parquet_bytes(profile))


def _parquet_bytes(profile: ProfileTable) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(profile.to_arrow(), sink)
    return sink.getvalue().to_pybytes()


def _read_profile(storage: RunStorage) -> ProfileTable:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(pa.BufferReader(storage.read_bytes(PROFILE_FILE)))
    return ProfileTable(table, source=f"{storage.uri}/{PROFILE_FILE}")


# ---------------------------------------------------------------- public API
def run(
    tasks: Iterable[Task],
    cluster: ClusterSpec | None = None,
    *,
    storage: str | os.PathLike[str],
    profile: ProfileTable | str | os.PathLike[str] | None = None,
    policy: str = "saturn-replan",
    name: str | None = None,
    config: DriverConfig | None = None,
    workload: str | None = None,
) -> DriverResult:
    """Profile (or load a profile), plan, execute and report a model-selection workload.

    Args:
        tasks: the tasks to train.
        cluster: the GPUs to use; default: every GPU node of the connected Ray cluster.
        storage: the run folder (local path or pyarrow URI): state, events, checkpoints.
        profile: a ProfileTable or a profile file; default: ``ray_saturn.profile(tasks, cluster)``.
        policy: re-planning policy (``saturn-replan``, ``saturn-static``, ``saturn-periodic``, ...).
        config: driver settings (checkpoint interval, solver time limit, ...).

    Example:
        >>> # result = ray_saturn.run(tasks, storage="/tmp/runs/lr-sweep")
        >>> # [(t, r.state) for t, r in result.tasks.items()]
    """
    import ray

    task_list = check_unique_names(tasks)
    store = RunStorage(storage)
    cfg = config or DriverConfig(policy=policy)
    if config is not None and policy != cfg.policy:
        cfg = DriverConfig(**{**asdict(cfg), "policy": policy})
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
        _prepare(store, settings, table)
        _, ref = start_driver(store, settings, table, {t.name: t for t in task_list})
        return _result(ray.get(ref))


def resume(storage: str | os.PathLike[str], tasks: Iterable[Task] | None = None) -> DriverResult:
    """Continue a run whose driver stopped (killed, machine lost) from its run folder.

    Finished tasks are not run again; the others restart from their latest
    checkpoint. A training run needs its tasks: pass them, or the run must
    have been started from a workload file (``ray-saturn run WORKLOAD``).

    Example:
        >>> # ray_saturn.resume("/tmp/runs/lr-sweep")
    """
    import ray

    store = RunStorage(storage, create=False)
    settings = RunSettings.from_dict(store.read_json(RUN_FILE))
    state = store.read_json(STATE_FILE) if store.exists(STATE_FILE) else {}
    if state.get("driver_state") in ("finished",):
        logger.info("%s: the run already finished; nothing to resume", store.uri)
    profile = _read_profile(store)
    task_map: dict[str, Task] | None = None
    if settings.mode == "train":
        if tasks is None:
            if not settings.workload:
                raise SaturnError(
                    f"{store.uri}: the run was started from Python; pass its tasks to "
                    "ray_saturn.resume(run_dir, tasks=...)"
                )
            from ray_saturn.cli.run import load_workload

            tasks = load_workload(settings.workload)
        task_map = {t.name: t for t in check_unique_names(tasks)}
    store.append_jsonl(
        "events.jsonl",
        {"kind": "resume", "wall": round(time.time(), 3), "time_s": state.get("time_s", 0.0)},
    )
    ctx = connected() if settings.mode == "train" else _emulated_context(store)
    with ctx:
        _, ref = start_driver(store, settings, profile, task_map, resume_state=state)
        return _result(ray.get(ref))


def run_status(storage: str | os.PathLike[str]) -> dict[str, Any]:
    """A run's persisted state: driver state; per task state, strategy, GPUs, progress, ETA.

    Example:
        >>> # ray_saturn.runtime.api.run_status("/tmp/runs/lr-sweep")["tasks"]["bert-0"]["state"]
    """
    store = RunStorage(storage, create=False)
    if not store.exists(STATE_FILE):
        if store.exists(RUN_FILE):
            return {"driver_state": "starting", "tasks": {}}
        raise StorageError(f"{store.uri}: no ray_saturn run here (no {RUN_FILE})")
    return store.read_json(STATE_FILE)


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


# ---------------------------------------------------------------- emulation
@contextlib.contextmanager
def emulated_cluster(nodes: int, gpus_per_node: int, *, cpus_per_node: int | None = None) -> Iterator[Any]:
    """A local ``ray.cluster_utils.Cluster``: a GPU-less head and ``nodes`` nodes of logical GPUs.

    Each node gets as many logical CPUs as GPUs (default), so Ray keeps that
    many idle worker processes per node and relaunches reuse them.
    """
    if cpus_per_node is None:
        cpus_per_node = gpus_per_node
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        raise SaturnError("Ray is already initialised in this process; emulation starts its own local cluster")
    # A placement group that waits for GPUs a finished task is still handing back is
    # retried by the GCS with back-off up to 1 s by default; 100 ms suits time-scaled runs.
    system_config = {
        "gcs_create_placement_group_retry_min_interval_ms": 20,
        "gcs_create_placement_group_retry_max_interval_ms": 100,
    }
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 0, "_system_config": system_config},
    )
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=cpus_per_node, num_gpus=gpus_per_node)
        ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@contextlib.contextmanager
def _emulated_context(store: RunStorage) -> Iterator[None]:
    import ray

    if ray.is_initialized():
        yield
        return
    info = store.read_json(RUN_FILE).get("emulated_cluster") or {}
    with emulated_cluster(int(info.get("nodes", 1)), int(info.get("gpus_per_node", 1))):
        yield


def emulate(
    profile: ProfileTable | str | os.PathLike[str],
    nodes: int,
    gpus_per_node: int,
    *,
    time_scale: float,
    noise: float = 0.0,
    seed: int = 0,
    policy: str = "saturn-replan",
    storage: str | os.PathLike[str] | None = None,
    config: DriverConfig | None = None,
    use_running_ray: bool = False,
    name: str | None = None,
    arrivals: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Run the real runtime on emulated tasks (contract 3); times in profile seconds.

    Starts a local multi-node cluster (unless ``use_running_ray``: then the
    connected cluster, e.g. a test's ``Cluster``, is used) and returns
    ``{"planned_makespan_s", "realised_makespan_s", "moves", "replans",
    "tasks": [{"task", "state", "steps_done", "segments": [...]}]}``.

    Example:
        >>> # emulate("profile.csv", 2, 4, time_scale=0.01)["realised_makespan_s"]
    """
    import ray

    table = profile if isinstance(profile, ProfileTable) else ProfileTable.read(profile)
    table.check_feasible()
    if not time_scale > 0:
        raise SaturnError(f"--time-scale is {time_scale}; give a factor > 0 (wall seconds per profile second)")
    cfg = config or DriverConfig(
        policy=policy,
        seed=seed,
        checkpoint_interval_s=1.0 / time_scale,
        restart_s=1.0 / time_scale,
        solver_time_limit_s=2.0,
        poll_wall_s=0.1,
    )
    if config is not None:
        cfg = DriverConfig(**{**asdict(config), "policy": policy, "seed": seed})
    name = name or f"emulate-{uuid.uuid4().hex[:8]}"
    settings = RunSettings(
        name=name,
        mode="emulate",
        driver=cfg,
        time_scale=time_scale,
        noise=noise,
        emulated_cluster={"nodes": nodes, "gpus_per_node": gpus_per_node},
        arrivals=dict(arrivals or {}),
    )
    tmp = None
    if storage is None:
        import tempfile

        tmp = tempfile.mkdtemp(prefix="ray-saturn-emulate-")
        storage = tmp
    store = RunStorage(storage)
    _prepare(store, settings, table)
    ctx = contextlib.nullcontext() if use_running_ray else emulated_cluster(nodes, gpus_per_node)
    with ctx:
        t0 = time.time()
        _, ref = start_driver(store, settings, table)
        result = _result(ray.get(ref))
        wall = time.time() - t0
    out = emulation_report(result, store)
    out["wall_s"] = round(wall, 3)
    out["run_dir"] = store.uri
    return out


def emulation_report(result: DriverResult, store: RunStorage | None = None) -> dict[str, Any]:
    """The contract-3 JSON object for a finished emulation."""
    tasks = []
    for rec in result.tasks.values():
        segs = [
            {
                "strategy": s.strategy,
                "gpus": s.gpus,
                "nodes": list(s.nodes),
                "start_s": round(s.launch_s, 3),
                "first_step_s": None if s.first_step_s is None else round(s.first_step_s, 3),
                "end_s": None if s.end_s is None else round(s.end_s, 3),
                "status": s.status,
            }
            for s in rec.segments
        ]
        entry: dict[str, Any] = {
            "task": rec.task,
            "state": rec.state,
            "steps_done": rec.steps_done,
            "total_steps": rec.total_steps,
            "segments": segs,
        }
        if rec.reason and rec.state == "failed":
            entry["reason"] = rec.reason
        tasks.append(entry)
    latencies = [
        s.first_step_s - s.launch_s for r in result.tasks.values() for s in r.segments if s.first_step_s is not None
    ]
    out: dict[str, Any] = {
        "state": result.state,
        "planned_makespan_s": None if result.planned_makespan_s is None else round(result.planned_makespan_s, 3),
        "realised_makespan_s": round(result.realised_makespan_s, 3),
        "moves": result.moves,
        "replans": result.replans,
        "launch_latency_s": _median(latencies),
        "tasks": tasks,
    }
    if result.reason:
        out["reason"] = result.reason
    return out


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    n = len(xs)
    return round(xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2]), 3)
