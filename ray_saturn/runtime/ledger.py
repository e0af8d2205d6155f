"""The GPU ledger: who holds how many GPUs on which node. No Ray in here.

The ledger is the single owner of the cluster's GPUs for a run. Every launch
goes through :meth:`GpuLedger.reserve` first, and the GPUs come back with
:meth:`GpuLedger.release` when the task finishes, fails or is moved. Nodes
can disappear (their reservations are dropped and reported) and appear.

Example:
    >>> from ray_saturn import ClusterSpec
    >>> ledger = GpuLedger(ClusterSpec.uniform(2, 4))
    >>> r = ledger.reserve("a", ("node-0",), 4)
    >>> ledger.free("node-0"), ledger.free("node-1")
    (0, 4)
    >>> ledger.release("a").gpus
    4

Shares of one GPU (``gpus_per_node`` < 1) and plans that name devices hold
those devices (``devices``: node -> ``((device, share), ...)``), counted as
the controller counts them (:class:`~ray_saturn.control.occupancy.Occupancy`):
no device over one GPU, the devices in use plus the whole GPUs held without
devices never more than a node's GPUs. A reservation of a GPU type's row
goes only to nodes of that type.

    >>> q = {"node-1": [(0, 0.25)]}
    >>> [ledger.reserve(f"s{i}", ("node-1",), 0.25, devices=q).gpus for i in range(4)]
    [0.25, 0.25, 0.25, 0.25]
    >>> ledger.fits(("node-1",), 0.25, devices=q), ledger.free("node-1")
    (False, 3)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ray_saturn.errors import SaturnError
from ray_saturn.spec import ClusterSpec, NodeSpec

__all__ = ["GpuLedger", "LedgerError", "Reservation"]


class LedgerError(SaturnError, ValueError):
    """A reservation does not fit, names an unknown node, or is held twice."""


Devices = Mapping[str, Iterable[tuple[int, float]]]


@dataclass(frozen=True)
class Reservation:
    """``gpus_per_node`` GPUs (or a share of one) on each of ``nodes`` held by ``task``, on
    ``devices`` when named, of ``gpu_type`` when its row was measured on one."""

    task: str
    nodes: tuple[str, ...]
    gpus_per_node: int | float
    devices: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] | None = None
    gpu_type: str | None = None

    @property
    def gpus(self) -> int | float:
        return self.gpus_per_node * len(self.nodes)

    @property
    def is_share(self) -> bool:
        return self.gpus_per_node < 1

    def placement(self):
        """As a :class:`~ray_saturn.control.state.Placement` (for the device count)."""
        from ray_saturn.control.state import Placement

        g = self.gpus_per_node if self.is_share else int(self.gpus_per_node) * len(self.nodes)
        return Placement("", g, self.nodes, self.gpu_type, self.devices)


class GpuLedger:
    """GPU bundles per node, reserved per task."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self._capacity: dict[str, int] = {n.name: n.gpus for n in cluster.nodes}
        self._node_ids: dict[str, str | None] = {n.name: n.node_id for n in cluster.nodes}
        self._types: dict[str, str | None] = {n.name: n.gpu_type for n in cluster.nodes}
        self._held: dict[str, Reservation] = {}

    # ------------------------------------------------------------ queries
    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self._capacity)

    def capacity(self, node: str) -> int:
        self._check_node(node)
        return self._capacity[node]

    def _occupancy(self):
        from ray_saturn.control.occupancy import Occupancy

        return Occupancy(self._capacity, [r.placement() for r in self._held.values()])

    def used(self, node: str) -> int:
        """GPUs of ``node`` in use: whole GPUs held, and devices holding any share."""
        return self.capacity(node) - self.free(node)

    def free(self, node: str) -> int:
        """Whole GPUs of ``node`` that nothing holds any share of."""
        self._check_node(node)
        return self._occupancy().free_gpus()[node]

    def gpu_type(self, node: str) -> str | None:
        self._check_node(node)
        return self._types[node]

    def node_id(self, node: str) -> str | None:
        self._check_node(node)
        return self._node_ids[node]

    def holder(self, task: str) -> Reservation | None:
        return self._held.get(task)

    def reservations(self) -> list[Reservation]:
        return list(self._held.values())

    def fits(
        self, nodes: Iterable[str], gpus_per_node: int | float, *, devices: Devices | None = None,
        gpu_type: str | None = None,
    ) -> bool:
        """Whether :meth:`reserve` would take this now."""
        nodes = tuple(nodes)
        if not all(n in self._capacity for n in nodes):
            return False
        if gpu_type is not None and any(self._types[n] != gpu_type for n in nodes):
            return False
        if devices is None and gpus_per_node >= 1:
            return all(self.free(n) >= gpus_per_node for n in nodes)
        want = Reservation("", nodes, gpus_per_node, _devices(devices), gpu_type).placement()
        return (got := self._occupancy().fit(want)) is not None and got.devices == want.devices

    def cluster(self) -> ClusterSpec:
        """The nodes the ledger knows now, as a ClusterSpec (for re-planning)."""
        return ClusterSpec(
            tuple(NodeSpec(n, g, self._node_ids[n], self._types[n]) for n, g in self._capacity.items())
        )

    # ------------------------------------------------------------ changes
    def reserve(
        self, task: str, nodes: Iterable[str], gpus_per_node: int | float, *, devices: Devices | None = None,
        gpu_type: str | None = None,
    ) -> Reservation:
        """Hold ``gpus_per_node`` on each of ``nodes`` (on ``devices`` when given: a share must name
        its device) for ``task``; raise :class:`LedgerError` if it does not fit now."""
        nodes = tuple(nodes)
        if task in self._held:
            raise LedgerError(
                f"task {task!r} already holds GPUs on {', '.join(self._held[task].nodes)}; release them first"
            )
        if not nodes or len(set(nodes)) != len(nodes):
            raise LedgerError(f"task {task!r}: nodes {list(nodes)} must be distinct and non-empty")
        share = 0 < gpus_per_node < 1 and abs(1 / gpus_per_node - round(1 / gpus_per_node)) < 1e-9
        if not share and (gpus_per_node < 1 or gpus_per_node != int(gpus_per_node)):
            raise LedgerError(
                f"task {task!r}: gpus_per_node is {gpus_per_node}; give a whole number >= 1 or a share 1/k"
            )
        if share and (len(nodes) != 1 or devices is None):
            raise LedgerError(
                f"task {task!r}: a {gpus_per_node} share of one GPU holds one device of one node; "
                f"give one node and its device, e.g. devices={{{nodes[0]!r}: [(0, {gpus_per_node})]}}"
            )
        for n in nodes:
            self._check_node(n)
            if gpu_type is not None and self._types[n] != gpu_type:
                raise LedgerError(
                    f"task {task!r} runs a row measured on {gpu_type}, but node {n!r} is of type {self._types[n]}"
                )
            if devices is None and self.free(n) < gpus_per_node:
                raise LedgerError(
                    f"task {task!r} needs {gpus_per_node} GPUs on node {n!r}, which has "
                    f"{self.free(n)} free of {self._capacity[n]}"
                )
        res = Reservation(task, nodes, gpus_per_node if share else int(gpus_per_node), _devices(devices), gpu_type)
        if devices is not None:
            occ = self._occupancy()
            try:
                occ.take(res.placement())
            except SaturnError as exc:
                raise LedgerError(f"task {task!r}: {exc}") from None
            named = sorted(dict(res.devices or ()))
            if set(named) != set(nodes):
                raise LedgerError(f"task {task!r}: devices name nodes {named}, but it runs on {list(nodes)}")
            if any(occ.free_gpus()[n] < 0 for n in nodes):
                raise LedgerError(f"task {task!r}: node(s) {', '.join(nodes)} have no free device for it")
        self._held[task] = res
        return res

    def release(self, task: str) -> Reservation | None:
        """Give back ``task``'s GPUs; returns what it held (None if nothing)."""
        return self._held.pop(task, None)

    def remove_node(self, node: str) -> list[Reservation]:
        """Forget a lost node; returns the reservations that used it (now dropped)."""
        self._check_node(node)
        lost = [r for r in self._held.values() if node in r.nodes]
        for r in lost:
            del self._held[r.task]
        del self._capacity[node]
        del self._node_ids[node]
        del self._types[node]
        return lost

    def add_node(self, node: NodeSpec) -> None:
        if node.name in self._capacity:
            raise LedgerError(f"node {node.name!r} is already in the ledger")
        self._capacity[node.name] = node.gpus
        self._node_ids[node.name] = node.node_id
        self._types[node.name] = node.gpu_type

    def _check_node(self, node: str) -> None:
        if node not in self._capacity:
            raise LedgerError(f"node {node!r} is not in the ledger (nodes: {', '.join(self._capacity) or 'none'})")


def _devices(devices: Devices | None) -> tuple[tuple[str, tuple[tuple[int, float], ...]], ...] | None:
    if devices is None:
        return None
    return tuple(sorted((str(n), tuple((int(d), float(x)) for d, x in v)) for n, v in devices.items()))
