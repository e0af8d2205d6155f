"""The placement-group manager: the plan's GPUs, reserved per decision, handed to Ray Train.

Design
------
The manager owns a :class:`~ray_saturn.runtime.ledger.GpuLedger` (GPU
bundles per node, per task) and, for every reservation, a Ray placement
group that *holds* those GPUs on exactly the planned nodes:

- one node: one bundle ``{"GPU": g}``, ``STRICT_PACK``;
- ``k`` nodes: ``k`` bundles of ``g / k`` GPUs, ``STRICT_SPREAD``;
- a share 1/k of one GPU: one bundle ``{"GPU": 1/k}`` (Ray's fractional
  GPU resource: up to k such bundles share one device);
- every bundle carries ``bundle_label_selector={"ray.io/node-id": <id>}``,
  so Ray places it on the planned node and nowhere else (for a row of a GPU
  type, a node of that type: the ledger refuses any other).

The hold becomes *ready* only when the GPUs are physically free on those
nodes (a previous task's trainer has let go of them), so launching waits on
it; no other task can be given those GPUs meanwhile, because the ledger
refuses any reservation that does not fit.

Hand-over to Ray Train V2. ``TorchTrainer.fit()`` starts a controller that
creates its *own* placement group; it cannot be given ours. So, at launch,
:meth:`PlacementGroupManager.hand_over` removes the hold and returns a
:class:`TrainerPlacement` that pins the trainer's workers to the same GPUs:
``ScalingConfig(num_workers=g, resources_per_worker={"GPU": 1, ...},
label_selector=[{"ray.io/node-id": <node of worker i>}, ...],
placement_strategy="STRICT_PACK")`` (``"SPREAD"`` over several nodes, with
the per-worker selectors fixing how many workers land on each node). Ray
Train turns the per-worker selectors into per-bundle selectors of its
placement group, so its bundles can only be placed on the planned nodes,
on GPUs the hold has just freed. The ledger entry stays until the task
finishes, fails or moves, so the run never launches anything else onto
those GPUs: the ledger is the single owner, the hold PG enforces it against
other Ray work until launch, and the trainer's own PG from launch on.

Reused workers. A task launched onto the parked workers of a finished
segment of the same shape (:meth:`~ray_saturn.runtime.launcher.Launcher.claim_parked`)
is booked with ``hold=False``: the ledger entry only, ready at once, since
those workers' own placement group still holds the GPUs.

Lighter runs (the emulated workload of ``ray-saturn emulate``) need no
hand-over: they are scheduled straight into the hold's bundles with
:meth:`PlacementGroupManager.bundle_strategy`.

Example:
    >>> # on a Ray cluster with GPUs (ClusterSpec.from_ray() carries node ids)
    >>> # mgr = PlacementGroupManager(ClusterSpec.from_ray())
    >>> # mgr.reserve("bert-0", ("node-1a2b3c4d",), 4); mgr.wait_ready("bert-0", 30)
    >>> # placement = mgr.hand_over("bert-0"); placement.scaling_config()
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.errors import SaturnError
from ray_saturn.runtime.ledger import GpuLedger, LedgerError, Reservation
from ray_saturn.spec import ClusterSpec, NodeSpec, ray_node_gpu_type

__all__ = ["NodeChanges", "PlacementGroupManager", "TrainerPlacement"]

logger = logging.getLogger(__name__)

NODE_LABEL = "ray.io/node-id"


@dataclass(frozen=True)
class TrainerPlacement:
    """How a TorchTrainer is pinned to the GPUs the plan gave a task."""

    task: str
    num_workers: int
    label_selector: tuple[dict[str, str], ...]
    placement_strategy: str
    cpus_per_worker: float = 0.0
    #: GPUs per worker: 1, or the share 1/k of one GPU the plan gave a single worker.
    gpus_per_worker: float = 1.0

    def scaling_config(self) -> Any:
        """The ``ray.train.ScalingConfig`` that pins the workers (one GPU, or a share of one, each)."""
        from ray.train import ScalingConfig

        resources: dict[str, float] = {"GPU": self.gpus_per_worker if self.gpus_per_worker < 1 else 1}
        if self.cpus_per_worker:
            resources["CPU"] = self.cpus_per_worker
        return ScalingConfig(
            num_workers=self.num_workers,
            use_gpu=True,
            resources_per_worker=resources,
            label_selector=[dict(s) for s in self.label_selector],
            placement_strategy=self.placement_strategy,
        )


@dataclass
class NodeChanges:
    """What :meth:`PlacementGroupManager.sync_nodes` found."""

    lost: list[str] = field(default_factory=list)
    added: list[NodeSpec] = field(default_factory=list)
    dropped: list[Reservation] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.lost or self.added)


class PlacementGroupManager:
    """Ledger of GPU bundles per node plus the Ray placement groups that hold them."""

    def __init__(self, cluster: ClusterSpec, *, cpus_per_worker: float = 0.0, run_name: str = "default") -> None:
        missing = [n.name for n in cluster.nodes if not n.node_id]
        if missing:
            raise SaturnError(
                f"node(s) {', '.join(missing)} have no Ray node id; build the cluster with "
                "ClusterSpec.from_ray() on the running Ray cluster"
            )
        self.ledger = GpuLedger(cluster)
        self.cpus_per_worker = float(cpus_per_worker)
        self.prefix = f"ray_saturn:{run_name}:"
        self._holds: dict[str, Any] = {}
        self._ready: dict[str, Any] = {}
        self._unheld: set[str] = set()  # booked with hold=False (parked workers hold the GPUs)

    # --------------------------------------------------------- reserving
    def reserve(
        self, task: str, nodes: Iterable[str], gpus_per_node: int | float, *, devices: Any = None,
        gpu_type: str | None = None, hold: bool = True,
    ) -> Reservation:
        """Book the GPUs (or a share of one: ``gpus_per_node`` = 1/k, on the ``devices`` the plan
        named) in the ledger and hold them with a placement group pinned to the planned nodes
        (``hold=False``: the ledger only; the parked workers the task reuses hold them)."""
        from ray.util.placement_group import placement_group

        res = self.ledger.reserve(task, nodes, gpus_per_node, devices=devices, gpu_type=gpu_type)
        if not hold:
            self._unheld.add(task)
            logger.debug("booked %s on the parked workers of %s", task, ",".join(res.nodes))
            return res
        ids = [self.ledger.node_id(n) for n in res.nodes]
        bundles = [{"GPU": float(gpus_per_node)} for _ in res.nodes]
        strategy = "STRICT_PACK" if len(res.nodes) == 1 else "STRICT_SPREAD"
        try:
            pg = placement_group(
                bundles,
                strategy=strategy,
                name=f"{self.prefix}{task}",
                bundle_label_selector=[{NODE_LABEL: i} for i in ids],
            )
        except Exception:
            self.ledger.release(task)
            raise
        self._holds[task] = pg
        logger.debug("reserved %s: %d GPU(s) on %s (%s)", task, res.gpus, ",".join(res.nodes), strategy)
        return res

    def ready(self, task: str) -> Any:
        """An ObjectRef that resolves when the hold is placed (the GPUs are free)."""
        ref = self._ready.get(task)
        if ref is None:
            ref = self._ready[task] = self._hold(task).ready()
        return ref

    def wait_ready(self, task: str, timeout_s: float) -> bool:
        return bool(self._hold(task).wait(timeout_s))

    def is_ready(self, task: str) -> bool:
        """Whether the hold is placed now (asks the GCS; does not wait)."""
        from ray.util import placement_group_table

        if task in self._unheld:
            return self.ledger.holder(task) is not None

        return placement_group_table(self._hold(task)).get("state") == "CREATED"

    def bundle_strategy(self, task: str, bundle: int = 0) -> Any:
        """Scheduling strategy that runs a Ray task or actor inside the hold's bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(placement_group=self._hold(task), placement_group_bundle_index=bundle)

    def hand_over(self, task: str) -> TrainerPlacement:
        """Free the hold and return how to pin a TorchTrainer onto the same GPUs.

        The ledger entry stays: the GPUs remain the task's until :meth:`release`.
        """
        res = self.ledger.holder(task)
        if res is None:
            raise LedgerError(f"task {task!r} holds no GPUs; reserve them before the hand-over")
        self._remove_hold(task)
        selectors: list[dict[str, str]] = []
        for n in res.nodes:
            selectors += [{NODE_LABEL: str(self.ledger.node_id(n))}] * (1 if res.is_share else int(res.gpus_per_node))
        return TrainerPlacement(
            task=task,
            num_workers=len(selectors),
            label_selector=tuple(selectors),
            placement_strategy="STRICT_PACK" if len(res.nodes) == 1 else "SPREAD",
            cpus_per_worker=self.cpus_per_worker,
            gpus_per_worker=float(res.gpus_per_node) if res.is_share else 1.0,
        )

    def release(self, task: str) -> Reservation | None:
        """Give a task's GPUs back (task finished, failed or moving)."""
        self._remove_hold(task)
        return self.ledger.release(task)

    def release_all(self) -> None:
        for r in self.ledger.reservations():
            self.release(r.task)

    def reclaim_stale(self) -> list[str]:
        """Remove holds left by an earlier driver of the same run (it was killed).

        Ray ties a placement group to the job, not to the actor that made
        it, so the holds of a killed driver actor outlive it while the job
        runs. They carry this run's name, so a resumed driver removes them
        before it reserves anything. Returns the names removed.
        """
        from ray.util import placement_group_table
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        removed = []
        for pg_id, info in placement_group_table().items():
            name = info.get("name") or ""
            if name.startswith(self.prefix) and info.get("state") != "REMOVED":
                import ray

                remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
                removed.append(name)
        if removed:
            logger.warning("removed %d placement group(s) left by an earlier driver of this run", len(removed))
        return removed

    # ------------------------------------------------------------- nodes
    def sync_nodes(self) -> NodeChanges:
        """Compare the ledger with the live Ray nodes; drop lost ones, add new ones."""
        import ray

        alive: dict[str, NodeSpec] = {}
        for info in ray.nodes():
            gpus = int(info.get("Resources", {}).get("GPU", 0))
            if info.get("Alive") and gpus >= 1:
                nid = info["NodeID"]
                alive[nid] = NodeSpec(f"node-{nid[:8]}", gpus, nid, ray_node_gpu_type(info))
        changes = NodeChanges()
        known = {self.ledger.node_id(n): n for n in self.ledger.nodes}
        for nid, name in known.items():
            if nid not in alive:
                dropped = self.ledger.remove_node(name)
                for r in dropped:
                    self._remove_hold(r.task)
                changes.lost.append(name)
                changes.dropped += dropped
                logger.warning("node %s is gone; %d reservation(s) dropped", name, len(dropped))
        for nid, spec in alive.items():
            if nid not in known:
                self.ledger.add_node(spec)
                changes.added.append(spec)
                logger.info("node %s joined with %d GPU(s)", spec.name, spec.gpus)
        return changes

    # ----------------------------------------------------------- helpers
    def _hold(self, task: str) -> Any:
        try:
            return self._holds[task]
        except KeyError:
            raise LedgerError(
                f"task {task!r} has no placement group hold (not reserved, or already handed over)"
            ) from None

    def _remove_hold(self, task: str) -> None:
        self._unheld.discard(task)
        pg = self._holds.pop(task, None)
        self._ready.pop(task, None)
        if pg is None:
            return
        from ray.util.placement_group import remove_placement_group

        try:
            remove_placement_group(pg)
        except Exception as exc:  # the PG may already be gone with its node
            logger.debug("removing the hold of %s: %s", task, exc)
