"""Find and end what a dead run of ours left on the Ray cluster.

A run's driver actor (named ``driver:<run>`` in the ``ray_saturn``
namespace) creates the GPU holds (placement groups named
``ray_saturn:<run>:<task>``) and, per segment, a Ray Train V2 controller,
which creates its own placement group and a *detached*
``PlacementGroupCleaner`` actor. When the driver dies (its process killed,
the CLI that owned its job killed), Ray ends what is fate-shared with it,
but not everything: placement groups live as long as their job, and the
detached cleaner outlives everything (it polls the state API for its
controller, and waits forever when that API does not answer).

:func:`reclaim_dead_runs` walks the GCS tables from each *dead* driver actor
of the given runs: every actor it owned, every actor those owned (the
controller's cleaner), and so on; it kills the live ones and removes every
placement group one of them created, plus the run's named holds. Nothing
that descends from a live driver is touched.

The GCS tables are read through Ray's global state accessor (the same one
``ray.util.placement_group_table`` uses) because the public state API needs
the dashboard, which a cluster may not run.

Example:
    >>> # with Ray connected, before resuming run "sweep-1":
    >>> # reclaim_dead_runs(["sweep-1"])
    >>> # Reclaimed(placement_groups=['ray_saturn:sweep-1:bert-0'], actors=['PlacementGroupCleaner 1a2b3c4d'])
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.runtime.actor import DRIVER_CLASS, DRIVER_NAMESPACE, DRIVER_PREFIX, is_driver_class

__all__ = ["DRIVER_CLASS", "Reclaimed", "reclaim_dead_runs"]

logger = logging.getLogger(__name__)

_HOLD_PREFIX = "ray_saturn:"


@dataclass
class Reclaimed:
    """What :func:`reclaim_dead_runs` ended: placement groups (name or id) and actors (class and id)."""

    placement_groups: list[str] = field(default_factory=list)
    actors: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.placement_groups or self.actors)

    def summary(self) -> str:
        return f"{len(self.placement_groups)} placement group(s) and {len(self.actors)} actor(s)"


@dataclass(frozen=True)
class _Actor:
    actor_id: str
    class_name: str
    name: str
    namespace: str
    state: str
    worker_id: str
    owner_worker_id: str


def _accessor() -> Any:
    import ray._private.state as ray_state

    return ray_state.state._connect_and_get_accessor()


def _actors() -> list[_Actor]:
    from ray.core.generated import gcs_pb2

    out = []
    for raw in _accessor().get_actor_table(None, None):
        a = gcs_pb2.ActorTableData.FromString(raw)
        out.append(
            _Actor(
                actor_id=a.actor_id.hex(),
                class_name=a.class_name,
                name=a.name,
                namespace=a.ray_namespace,
                state=gcs_pb2.ActorTableData.ActorState.Name(a.state),
                worker_id=a.address.worker_id.hex(),
                owner_worker_id=a.owner_address.worker_id.hex(),
            )
        )
    return out


def _placement_groups() -> list[Any]:
    from ray.core.generated import gcs_pb2

    return [gcs_pb2.PlacementGroupTableData.FromString(raw) for raw in _accessor().get_placement_group_table()]


def _kill(actor_id: str) -> None:
    """Kill an actor by its id through the GCS, the call ``ray.kill`` makes.

    ``ray.kill`` needs a handle, and this process holds none to an actor a dead driver created
    (asking the core worker for one it does not hold aborts the process).
    """
    import ray
    from ray._private.grpc_utils import init_grpc_channel  # token auth and TLS as the cluster has them
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    channel = init_grpc_channel(ray.get_runtime_context().gcs_address)
    try:
        request = gcs_service_pb2.KillActorViaGcsRequest(
            actor_id=bytes.fromhex(actor_id), force_kill=True, no_restart=True
        )
        reply = gcs_service_pb2_grpc.ActorInfoGcsServiceStub(channel).KillActorViaGcs(request, timeout=30)
    finally:
        channel.close()
    if reply.status.code != 0:
        raise RuntimeError(f"the GCS answered {reply.status.code}: {reply.status.message}")


def _remove_pg(pg_id: bytes) -> None:
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    remove_placement_group(PlacementGroup(ray.PlacementGroupID(pg_id)))


def reclaim_dead_runs(run_names: Iterable[str] | None = None, *, namespace: str = DRIVER_NAMESPACE) -> Reclaimed:
    """End the actors and placement groups that dead drivers of ``run_names`` left (all dead drivers: None).

    Ray must be connected. Never raises for a table it cannot read or an
    actor already gone: what it could not end is logged.
    """
    wanted = None if run_names is None else {str(n) for n in run_names}
    out = Reclaimed()
    try:
        actors = _actors()
        pgs = _placement_groups()
    except Exception as exc:  # a Ray without these tables: say so, never block a resume on it
        logger.warning("cannot read the Ray cluster's actor and placement-group tables (%s); "
                       "nothing left by a dead run was reclaimed", exc)
        return out

    def ours(a: _Actor) -> bool:
        return is_driver_class(a.class_name) and a.namespace == namespace and a.name.startswith(DRIVER_PREFIX)

    live_runs = {a.name[len(DRIVER_PREFIX):] for a in actors if ours(a) and a.state != "DEAD"}
    dead_drivers = [
        a for a in actors
        if ours(a) and a.state == "DEAD"
        and (wanted is None or a.name[len(DRIVER_PREFIX):] in wanted)
        and a.name[len(DRIVER_PREFIX):] not in live_runs
    ]
    dead_runs = {a.name[len(DRIVER_PREFIX):] for a in dead_drivers}
    if wanted is not None:
        # A run whose driver record Ray has already dropped still has named holds to remove.
        dead_runs |= wanted - live_runs
    # Everything owned, directly or through other actors, by a dead driver's worker.
    by_owner: dict[str, list[_Actor]] = {}
    for a in actors:
        if a.owner_worker_id:
            by_owner.setdefault(a.owner_worker_id, []).append(a)
    family: dict[str, _Actor] = {a.actor_id: a for a in dead_drivers}
    frontier = [a.worker_id for a in dead_drivers if a.worker_id.strip("0")]
    seen_workers = set(frontier)
    while frontier:
        worker = frontier.pop()
        for child in by_owner.get(worker, []):
            if child.actor_id in family:
                continue
            family[child.actor_id] = child
            if child.worker_id.strip("0") and child.worker_id not in seen_workers:
                seen_workers.add(child.worker_id)
                frontier.append(child.worker_id)
    for a in family.values():
        if a.state == "DEAD" or ours(a):
            continue
        try:
            _kill(a.actor_id)
            out.actors.append(f"{a.class_name} {a.actor_id[:8]}")
        except Exception as exc:
            logger.warning("could not end actor %s %s left by a dead run: %s", a.class_name, a.actor_id[:8], exc)
    from ray.core.generated import gcs_pb2

    removed_state = gcs_pb2.PlacementGroupTableData.REMOVED
    for pg in pgs:
        if pg.state == removed_state:
            continue
        creator = pg.creator_actor_id.hex()
        named = pg.name.startswith(_HOLD_PREFIX) and pg.name[len(_HOLD_PREFIX):].split(":")[0] in dead_runs
        if creator in family or named:
            try:
                _remove_pg(pg.placement_group_id)
                out.placement_groups.append(pg.name or pg.placement_group_id.hex()[:8])
            except Exception as exc:
                logger.warning("could not remove placement group %s left by a dead run: %s",
                               pg.name or pg.placement_group_id.hex()[:8], exc)
    if out:
        logger.warning("ended what a dead run left on the cluster: %s (%s)", out.summary(),
                       ", ".join(out.placement_groups + out.actors)[:300])
    return out
