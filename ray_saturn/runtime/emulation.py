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
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from ray_saturn import defaults
from ray_saturn.errors import SaturnError
from ray_saturn.profile_table import ProfileTable
from ray_saturn.runtime.actor import prepare_run, start_driver
from ray_saturn.runtime.config import DriverConfig, RunSettings, check_policy, emulation_config
from ray_saturn.runtime.journal import Journal
from ray_saturn.runtime.records import DriverResult
from ray_saturn.runtime.storage import RunStorage

__all__ = ["emulate", "emulated_cluster", "emulated_context", "emulation_report"]

logger = logging.getLogger(__name__)


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
def emulated_context(journal: Journal) -> Iterator[None]:
    """The emulated cluster a resumed emulation ran on (nothing new when Ray is connected)."""
    import ray

    if ray.is_initialized():
        yield
        return
    info = journal.read_settings().get("emulated_cluster") or {}
    with emulated_cluster(int(info.get("nodes", 1)), int(info.get("gpus_per_node", 1))):
        yield


def emulate(
    profile: ProfileTable | str | os.PathLike[str],
    nodes: int,
    gpus_per_node: int,
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
) -> dict[str, Any]:
    """Run the real runtime on emulated tasks (contract 3); times in profile seconds.

    Starts a local multi-node cluster (unless ``use_running_ray``: then the
    connected cluster, e.g. a test's ``Cluster``, is used) and returns
    ``{"planned_makespan_s", "realised_makespan_s", "moves", "replans",
    "tasks": [{"task", "state", "steps_done", "segments": [...]}]}``.

    ``config`` defaults to :func:`~ray_saturn.runtime.config.emulation_config`;
    ``policy`` and ``seed``, when given, must agree with ``config``'s (or
    set them when there is no ``config``).
    """
    import ray

    table = profile if isinstance(profile, ProfileTable) else ProfileTable.read(profile)
    table.check_feasible()
    if config is None:
        cfg = emulation_config(time_scale, policy=policy or defaults.POLICY, seed=seed or 0)
    else:
        for what, given, have in (("policy", policy, config.policy), ("seed", seed, config.seed)):
            if given is not None and given != have:
                raise SaturnError(f"{what} is {given!r} but config.{what} is {have!r}; give it once")
        if not time_scale > 0:
            raise SaturnError(f"--time-scale is {time_scale}; give a factor > 0 (wall seconds per profile second)")
        cfg = replace(config)
    check_policy(cfg.policy)
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
    if storage is None:
        import tempfile

        storage = tempfile.mkdtemp(prefix="ray-saturn-emulate-")
    store = RunStorage(storage)
    prepare_run(store, settings, table)
    ctx = contextlib.nullcontext() if use_running_ray else emulated_cluster(nodes, gpus_per_node)
    with ctx:
        t0 = time.time()
        _, ref = start_driver(store, settings, table)
        result = DriverResult.from_dict(ray.get(ref))
        wall = time.time() - t0
    out = emulation_report(result)
    out["wall_s"] = round(wall, 3)
    out["run_dir"] = store.uri
    return out


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
