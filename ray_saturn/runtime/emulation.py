"""Emulation entry points: ``ray_saturn.emulate`` and the local multi-node cluster it runs on.

``emulate`` runs the real runtime (driver actor, placement groups, launch,
progress, checkpoints, re-planning) on a local ``ray.cluster_utils.Cluster``
with logical GPUs, where each task's step is a sleep of ``step_time_s x
time_scale`` (contract 3). It is the one entry point that starts its own
Ray cluster by design.

Example:
    >>> # emulate("profile.csv", 2, 4, time_scale=0.01)["realised_makespan_s"]
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ray_saturn import defaults
from ray_saturn.errors import SaturnError, SpecError
from ray_saturn.limits import MAX_RUNTIME_S, number
from ray_saturn.profile_table import ProfileTable
from ray_saturn.runtime.actor import (
    check_new_run_folder,
    interrupts_named,
    prepare_run,
    start_driver,
    wait_for_driver,
)
from ray_saturn.runtime.config import DriverConfig, RunSettings, check_policy, emulation_config
from ray_saturn.runtime.journal import RUN_FILE, Journal
from ray_saturn.runtime.lease import RunLease
from ray_saturn.runtime.local import LOCALHOST, private_ray_environment
from ray_saturn.runtime.reclaim import reclaim_dead_runs
from ray_saturn.runtime.records import DriverResult
from ray_saturn.runtime.storage import RunStorage
from ray_saturn.spec import ClusterSpec, NodeSpec

__all__ = [
    "MAX_EMULATED_NODES",
    "MAX_EMULATED_WORKERS",
    "check_emulated_nodes",
    "check_emulated_types",
    "checked_emulated_spec",
    "emulate",
    "emulated_cluster",
    "emulated_context",
    "emulation_report",
    "name_emulated_nodes",
    "private_ray_environment",
]

logger = logging.getLogger(__name__)

#: The most nodes an emulated cluster may have, whatever the machine.
MAX_EMULATED_NODES = 64
#: The most worker slots (logical CPUs, one per logical GPU) of all emulated nodes together: Ray starts
#: about one idle worker process per slot, so more than this is hundreds of processes on one machine.
MAX_EMULATED_WORKERS = 128
#: Memory one emulated node costs (its raylet, agents and idle workers), measured on Ray 2.60.
EMULATED_NODE_GB = 0.3
#: Memory one idle Ray worker process costs.
EMULATED_WORKER_GB = 0.1


def _machine_memory_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def check_emulated_nodes(
    nodes: int, gpus_per_node: int = 1, *, recorded_in: str | None = None, workers: int | None = None
) -> int:
    """``nodes`` if this machine can run that many emulated nodes of ``gpus_per_node`` worker slots
    each (every node gets as many logical CPUs as GPUs), else a one-line :class:`SpecError`.

    Checked before any process starts: each node is a raylet with its
    agents (about :data:`EMULATED_NODE_GB` GB) and each slot an idle worker
    (about :data:`EMULATED_WORKER_GB` GB); at most half of the machine's
    memory, never more than :data:`MAX_EMULATED_NODES` nodes nor
    :data:`MAX_EMULATED_WORKERS` slots. ``recorded_in``: the ``run.json``
    the sizes come from (a resume), named instead of the flags.
    ``workers``: the slots of all nodes together when their sizes differ
    (a cluster file; ``gpus_per_node`` is then the largest node's).

    Example:
        >>> check_emulated_nodes(2, 4)
        2
    """
    flags = ("--nodes", "--gpus-per-node") if recorded_in is None else (
        f"{recorded_in}: emulated_cluster.nodes", f"{recorded_in}: emulated_cluster.gpus_per_node")
    fix = "" if recorded_in is None else " (the run's emulated cluster is recorded there)"
    if _whole(nodes) is None:
        raise SpecError(f"{flags[0]} is {nodes!r}; give a whole number of emulated nodes >= 1{fix}")
    if _whole(gpus_per_node) is None:
        raise SpecError(f"{flags[1]} is {gpus_per_node!r}; give a whole number of GPUs per node >= 1{fix}")
    sizes = f"{nodes} emulated nodes x {gpus_per_node} GPUs" if workers is None else \
        f"{nodes} emulated nodes of {workers} GPUs in all"
    flag = "--nodes x --gpus-per-node" if workers is None else "the GPUs of all nodes"
    workers = nodes * gpus_per_node if workers is None else workers
    mem = _machine_memory_gb()
    node_limit, worker_limit = MAX_EMULATED_NODES, MAX_EMULATED_WORKERS
    if mem is not None:
        node_limit = max(1, min(node_limit, int(0.5 * mem / EMULATED_NODE_GB)))
        worker_limit = max(1, min(worker_limit, int(0.5 * mem / EMULATED_WORKER_GB)))
    mem_text = f" and half of this machine's {mem:.0f} GiB of memory" if mem is not None else ""
    todo = "resume it on a larger machine" if recorded_in is not None else None
    if nodes > node_limit:
        raise SpecError(
            f"{flags[0]} {nodes} is more than this machine can emulate: each emulated node is a raylet with its "
            f"agents (about {EMULATED_NODE_GB} GB); the limit ({MAX_EMULATED_NODES} nodes{mem_text}) allows "
            f"{node_limit}; {todo or f'give --nodes <= {node_limit}'}"
        )
    if workers > worker_limit:
        raise SpecError(
            f"{recorded_in + ': ' if recorded_in else ''}{sizes} = {workers} "
            "worker slots are more than this "
            f"machine can emulate: each GPU of an emulated node is a CPU slot, and Ray starts an idle worker "
            f"process (about {EMULATED_WORKER_GB} GB) per slot; the limit ({MAX_EMULATED_WORKERS} slots{mem_text}) "
            f"allows {worker_limit}; {todo or f'give {flag} <= {worker_limit}'}"
        )
    return nodes


def check_emulated_types(nodes: int, gpu_types: Sequence[str | None] | None) -> list[str | None]:
    """One GPU type (or ``None``) per emulated node, or a one-line :class:`SpecError`.

    Example:
        >>> check_emulated_types(2, ["fast", None]), check_emulated_types(2, None)
        (['fast', None], [None, None])
    """
    from ray_saturn.spec import check_gpu_type

    if gpu_types is None:
        return [None] * nodes
    if isinstance(gpu_types, (str, bytes)):
        raise SpecError(f"gpu_types is the text {gpu_types!r}; give a list of one GPU type per emulated node, "
                        f"e.g. {[gpu_types] * nodes!r} (the CLI's --gpu-types takes them comma-separated)")
    types = [check_gpu_type(t, f"GPU type of emulated node {i}") for i, t in enumerate(gpu_types)]
    if len(types) != nodes:
        raise SpecError(
            f"{len(types)} GPU type(s) for {nodes} emulated node(s); give one per node, e.g. "
            f"--gpu-types {','.join(['A100'] * nodes)}"
        )
    return types


#: The label an emulated node of a cluster file carries: its position in the file (Ray's label values
#: cannot hold every node name, e.g. ``a,b``).
NODE_INDEX_LABEL = "ray-saturn.io/emulated-node"


def checked_emulated_spec(cluster: Any, *, recorded_in: str | None = None) -> ClusterSpec:
    """``cluster`` (a :class:`ClusterSpec`, or its dict as in a cluster file) if this machine can emulate it,
    else a one-line :class:`SpecError`."""
    if isinstance(cluster, Mapping):
        try:
            cluster = ClusterSpec.from_dict(cluster)
        except SpecError as exc:
            raise SpecError(f"{recorded_in}: emulated_cluster.cluster: {exc}" if recorded_in else str(exc)) from None
    if not isinstance(cluster, ClusterSpec):
        raise SpecError(f"the cluster is a {type(cluster).__name__}; give a ClusterSpec (ClusterSpec.from_json(path) "
                        "reads a cluster file)")
    check_emulated_nodes(len(cluster.nodes), max(n.gpus for n in cluster.nodes), recorded_in=recorded_in,
                         workers=cluster.total_gpus)
    return ClusterSpec(tuple(NodeSpec(n.name, n.gpus, gpu_type=n.gpu_type) for n in cluster.nodes))


def name_emulated_nodes(live: ClusterSpec, names: Sequence[str]) -> ClusterSpec:
    """``live`` (read from Ray) with each emulated node of a cluster file called by its name in the file
    (``names``, in file order; found by :data:`NODE_INDEX_LABEL`); other nodes keep their names."""
    import ray

    index = {i["NodeID"]: (i.get("Labels") or {}).get(NODE_INDEX_LABEL) for i in ray.nodes()}
    out = []
    for n in live.nodes:
        at = index.get(n.node_id)
        if isinstance(at, str) and at.isascii() and at.isdigit() and int(at) < len(names):
            n = NodeSpec(names[int(at)], n.gpus, n.node_id, n.gpu_type)
        out.append(n)
    return ClusterSpec(tuple(sorted(out, key=lambda n: n.name)))


@contextlib.contextmanager
def emulated_cluster(
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    *,
    cpus_per_node: int | None = None,
    gpu_types: Sequence[str | None] | None = None,
    cluster: ClusterSpec | None = None,
) -> Iterator[Any]:
    """A local ``ray.cluster_utils.Cluster``: a GPU-less head and ``nodes`` nodes of logical GPUs.

    ``cluster`` instead: one emulated node per node of that spec, with its
    GPUs and GPU type, labelled with its position (:data:`NODE_INDEX_LABEL`)
    so that the driver calls it by its name (:func:`name_emulated_nodes`).

    ``gpu_types``, one per node (``None``: untyped), gives node i Ray's
    ``accelerator_type:<T>`` resource, which :meth:`ClusterSpec.from_ray` reads
    as its ``gpu_type``.

    Each node gets as many logical CPUs as GPUs (default), so Ray keeps that
    many idle worker processes per node and relaunches reuse them. The
    cluster has token auth on (a fresh token), listens on 127.0.0.1 only,
    and leaves no address file where other Ray users look
    (:func:`private_ray_environment`); ``nodes`` is checked
    (:func:`check_emulated_nodes`) before any process starts.
    """
    if cluster is not None:
        if nodes is not None or gpus_per_node is not None or gpu_types is not None or cpus_per_node is not None:
            raise SpecError("give either cluster or nodes, gpus_per_node and gpu_types, not both")
        cluster = checked_emulated_spec(cluster)
        shapes = [(n.gpus, n.gpus, n.gpu_type, {NODE_INDEX_LABEL: str(i)}) for i, n in enumerate(cluster.nodes)]
    else:
        if cpus_per_node is None:
            cpus_per_node = gpus_per_node
        check_emulated_nodes(nodes, cpus_per_node)  # type: ignore[arg-type]
        shapes = [(cpus_per_node, gpus_per_node, t, None) for t in check_emulated_types(nodes, gpu_types)]
    import ray
    from ray.cluster_utils import Cluster

    class LocalCluster(Cluster):
        """A ``Cluster`` whose nodes (also those a test adds) listen on 127.0.0.1."""

        def add_node(self, wait: bool = True, **node_args: Any) -> Any:
            node_args.setdefault("node_ip_address", LOCALHOST)
            return super().add_node(wait, **node_args)

    if ray.is_initialized():
        raise SaturnError("Ray is already initialised in this process; emulation starts its own local cluster")
    # A placement group that waits for GPUs a finished task is still handing back is
    # retried by the GCS with back-off up to 1 s by default; 100 ms suits time-scaled runs.
    system_config = {
        "gcs_create_placement_group_retry_min_interval_ms": 20,
        "gcs_create_placement_group_retry_max_interval_ms": 100,
    }
    with private_ray_environment():
        local = None
        try:
            local = LocalCluster(
                initialize_head=True,
                head_node_args={"num_cpus": 1, "num_gpus": 0, "_system_config": system_config},
            )
            for cpus, gpus, t, labels in shapes:
                extra: dict[str, Any] = {"resources": {f"accelerator_type:{t}": 1.0}} if t else {}
                if labels:
                    extra["labels"] = labels
                local.add_node(num_cpus=cpus, num_gpus=gpus, **extra)
            ray.init(address=local.address, logging_level=logging.WARNING, log_to_driver=False)
            local.wait_for_nodes()
            yield local
        finally:
            ray.shutdown()
            if local is not None:
                local.shutdown()


@contextlib.contextmanager
def emulated_context(journal: Journal) -> Iterator[None]:
    """The emulated cluster a resumed emulation ran on (nothing new when Ray is connected)."""
    import ray

    if ray.is_initialized():
        yield
        return
    info = journal.read_settings().get("emulated_cluster") or {}
    recorded_in = f"{journal.storage.display}/{RUN_FILE}"
    if not isinstance(info, Mapping):
        raise SpecError(f"{recorded_in}: emulated_cluster is {info!r}; it must be an object "
                        '{"nodes": N, "gpus_per_node": G} (the run\'s emulated cluster is recorded there)')
    if info.get("cluster") is not None:  # a cluster file's nodes
        with emulated_cluster(cluster=checked_emulated_spec(info["cluster"], recorded_in=recorded_in)):
            yield
        return
    nodes, gpus = info.get("nodes", 1), info.get("gpus_per_node", 1)
    check_emulated_nodes(nodes, gpus, recorded_in=recorded_in)
    with emulated_cluster(nodes, gpus, gpu_types=info.get("gpu_types")):
        yield


def emulate(
    profile: ProfileTable | str | os.PathLike[str],
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    *,
    time_scale: float,
    noise: float = 0.0,
    seed: int | None = None,
    policy: str | None = None,
    storage: str | os.PathLike[str] | None = None,
    config: DriverConfig | None = None,
    use_running_ray: bool = False,
    name: str | None = None,
    arrivals: Mapping[str, float] | None = None,
    gpu_types: Sequence[str | None] | None = None,
    cluster: ClusterSpec | str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Run the real runtime on emulated tasks (contract 3); times in profile seconds.

    Starts a local multi-node cluster (unless ``use_running_ray``: then the
    connected cluster, e.g. a test's ``Cluster``, is used) and returns
    ``{"planned_makespan_s", "realised_makespan_s", "moves", "replans",
    "tasks": [{"task", "state", "steps_done", "segments": [...]}]}``.

    ``gpu_types``: one GPU type per emulated node (see :func:`emulated_cluster`).
    ``cluster`` (a :class:`ClusterSpec` or a cluster JSON file, as ``plan
    --cluster`` takes) instead of ``nodes``/``gpus_per_node``/``gpu_types``:
    nodes of different sizes and types, called by their names in it.
    ``config`` defaults to :func:`~ray_saturn.runtime.config.emulation_config`;
    ``policy`` and ``seed``, when given, must agree with ``config``'s (or
    set them when there is no ``config``). ``arrivals``: profile seconds
    per task (a task not named arrives at 0).

    Refused in one line before anything is written or started: a time
    scale that is not a finite factor > 0, arrivals of tasks the profile
    does not have (or not finite and >= 0), a cluster this machine cannot
    emulate, a task that fits none of its nodes, and ``use_running_ray``
    with Ray not initialised.
    """
    table = profile if isinstance(profile, ProfileTable) else ProfileTable.read(profile)
    table.check_feasible()
    time_scale = _time_scale(time_scale)
    arrivals = _checked_arrivals(arrivals, table)
    if config is None:
        cfg = emulation_config(time_scale, policy=policy or defaults.POLICY, seed=seed or 0)
    else:
        for what, given, have in (("policy", policy, config.policy), ("seed", seed, config.seed)):
            if given is not None and given != have:
                raise SaturnError(f"{what} is {given!r} but config.{what} is {have!r}; give it once")
        cfg = replace(config)
    check_policy(cfg.policy)
    name = name or f"emulate-{uuid.uuid4().hex[:8]}"
    spec = None
    if cluster is not None:
        if nodes is not None or gpus_per_node is not None or gpu_types is not None:
            raise SpecError("give either cluster or nodes and gpus_per_node (and gpu_types), not both")
        spec = checked_emulated_spec(cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.from_json(cluster))
        nodes, gpus_per_node = len(spec.nodes), max(n.gpus for n in spec.nodes)
        shape: dict[str, Any] = {"nodes": nodes, "gpus_per_node": gpus_per_node, "cluster": spec.to_dict()}
    elif nodes is None or gpus_per_node is None:
        raise SpecError("give nodes and gpus_per_node (the emulated cluster), or cluster (a ClusterSpec or a "
                        "cluster JSON file)")
    else:
        shape = {"nodes": nodes, "gpus_per_node": gpus_per_node,
                 **({"gpu_types": list(gpu_types)} if gpu_types else {})}
    settings = RunSettings(
        name=name,
        mode="emulate",
        driver=cfg,
        time_scale=time_scale,
        noise=noise,
        emulated_cluster=shape,
        arrivals=dict(arrivals or {}),
    )
    # Before anything is written or started: the cluster can be emulated and every task fits it.
    if use_running_ray:
        import ray

        if not ray.is_initialized():
            raise SpecError("use_running_ray=True but Ray is not initialised in this process; call ray.init() "
                            "(or start a ray.cluster_utils.Cluster) first, or leave use_running_ray out to start "
                            "an emulated cluster")
        _check_fits(table, ClusterSpec.from_ray())
    elif spec is not None:
        _check_fits(table, spec)
    else:
        check_emulated_nodes(nodes, gpus_per_node)
        types = check_emulated_types(nodes, gpu_types)
        _check_fits(table, ClusterSpec(tuple(NodeSpec(f"node-{i}", gpus_per_node, gpu_type=t)
                                             for i, t in enumerate(types))))
    if storage is None:
        import tempfile

        storage = tempfile.mkdtemp(prefix="ray-saturn-emulate-")
    store = RunStorage(storage)
    with store.removed_if_refused():
        check_new_run_folder(store)  # a folder that holds a run: refused before its lock is touched
    with RunLease(store, command="emulate", run_name=name).held() as lease, interrupts_named(store, "emulate"):
        prepare_run(store, settings, table)
        ctx = (contextlib.nullcontext() if use_running_ray
               else emulated_cluster(cluster=spec) if spec is not None
               else emulated_cluster(nodes, gpus_per_node, gpu_types=gpu_types))
        with ctx:
            reclaim_dead_runs()
            t0 = time.time()
            actor, ref = start_driver(store, settings, table)
            result = wait_for_driver(actor, ref, lease=lease, journal=Journal(store))
            wall = time.time() - t0
    out = emulation_report(result)
    out["wall_s"] = round(wall, 3)
    out["run_dir"] = store.uri
    return out


def _time_scale(value: Any) -> float:
    """``time_scale`` as a float: finite, > 0, and with a finite inverse (the profile seconds per wall second)."""
    f = number(value, "time_scale (wall seconds per profile second)", low=0, low_open=True, error=SaturnError)
    if not math.isfinite(1.0 / f):
        raise SaturnError(f"time_scale (wall seconds per profile second) is {value!r}; give a finite factor > 0 "
                          "whose inverse is finite too, e.g. 0.001")
    return f


def _checked_arrivals(arrivals: Mapping[str, float] | None, table: ProfileTable) -> dict[str, float]:
    """``arrivals`` (task -> profile seconds; a task not named arrives at 0) with every name a task of the
    profile and every time a finite number >= 0, else a one-line :class:`SpecError`."""
    if arrivals is None:
        return {}
    if not isinstance(arrivals, Mapping):
        raise SpecError(f"arrivals is a {type(arrivals).__name__}; give a mapping of task name -> arrival (s)")
    tasks = set(table.tasks)
    unknown = [t for t in arrivals if t not in tasks]
    if unknown:
        raise SpecError(f"arrivals: task(s) {', '.join(repr(t) for t in unknown[:5])} are not in the profile; "
                        "drop them or fix their names")
    return {t: number(a, f"arrivals[{t!r}]", low=0, high=MAX_RUNTIME_S) for t, a in arrivals.items()}


def _check_fits(table: ProfileTable, cluster: ClusterSpec) -> None:
    """A one-line :class:`SpecError` naming a task that fits no node (or set of nodes) of ``cluster``."""
    from ray_saturn.solver import build_problem

    build_problem(table, cluster)


def emulation_report(result: DriverResult) -> dict[str, Any]:
    """The contract-3 JSON object for a finished emulation."""
    tasks = []
    for rec in result.tasks.values():
        segs = [
            {
                "strategy": s.strategy,
                "gpus": s.gpus,
                "nodes": list(s.nodes),
                "start_s": round(s.start_s, 3),
                "first_step_s": None if s.first_step_s is None else round(s.first_step_s, 3),
                "end_s": None if s.end_s is None else round(s.end_s, 3),
                "status": s.status,
                **{k: v for k, v in s.placement.to_dict().items() if k in ("devices", "gpu_type")},
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
        s.first_step_s - s.start_s for r in result.tasks.values() for s in r.segments if s.first_step_s is not None
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
