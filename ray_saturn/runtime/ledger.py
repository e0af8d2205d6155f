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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ray_saturn.errors import SaturnError
from ray_saturn.spec import ClusterSpec, NodeSpec

__all__ = ["GpuLedger", "LedgerError", "Reservation"]


class LedgerError(SaturnError, ValueError):
    """A reservation does not fit, names an unknown node, or is held twice."""


@dataclass(frozen=True)
class Reservation:
    """``gpus_per_node`` GPUs on each of ``nodes`` held by ``task``."""

    task: str
    nodes: tuple[str, ...]
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * len(self.nodes)


class GpuLedger:
    """GPU bundles per node, reserved per task."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self._capacity: dict[str, int] = {n.name: n.gpus for n in cluster.nodes}
        self._node_ids: dict[str, str | None] = {n.name: n.node_id for n in cluster.nodes}
        self._held: dict[str, Reservation] = {}

    # ------------------------------------------------------------ queries
    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self._capacity)

    def capacity(self, node: str) -> int:
        self._check_node(node)
        return self._capacity[node]

    def used(self, node: str) -> int:
        self._check_node(node)
        return sum(r.gpus_per_node for r in self._held.values() if node in r.nodes)

    def free(self, node: str) -> int:
        return self.capacity(node) - self.used(node)

    def node_id(self, node: str) -> str | None:
        self._check_node(node)
        return self._node_ids[node]

    def holder(self, task: str) -> Reservation | None:
        return self._held.get(task)

    def reservations(self) -> list[Reservation]:
        return list(self._held.values())

    def fits(self, nodes: Iterable[str], gpus_per_node: int) -> bool:
        nodes = tuple(nodes)
        return all(n in self._capacity and self.free(n) >= gpus_per_node for n in nodes)

    def cluster(self) -> ClusterSpec:
        """The nodes the ledger knows now, as a ClusterSpec (for re-planning)."""
        return ClusterSpec(tuple(NodeSpec(n, g, self._node_ids[n]) for n, g in self._capacity.items()))

    # ------------------------------------------------------------ changes
    def reserve(self, task: str, nodes: Iterable[str], gpus_per_node: int) -> Reservation:
        nodes = tuple(nodes)
        if task in self._held:
            raise LedgerError(
                f"task {task!r} already holds GPUs on {', '.join(self._held[task].nodes)}; release them first"
            )
        if not nodes or len(set(nodes)) != len(nodes):
            raise LedgerError(f"task {task!r}: nodes {list(nodes)} must be distinct and non-empty")
        if gpus_per_node < 1:
            raise LedgerError(f"task {task!r}: gpus_per_node is {gpus_per_node}; it must be at least 1")
        for n in nodes:
            self._check_node(n)
            if self.free(n) < gpus_per_node:
                raise LedgerError(
                    f"task {task!r} needs {gpus_per_node} GPUs on node {n!r}, which has "
                    f"{self.free(n)} free of {self._capacity[n]}"
                )
        res = Reservation(task, nodes, gpus_per_node)
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
        return lost

    def add_node(self, node: NodeSpec) -> None:
        if node.name in self._capacity:
            raise LedgerError(f"node {node.name!r} is already in the ledger")
        self._capacity[node.name] = node.gpus
        self._node_ids[node.name] = node.node_id

    def _check_node(self, node: str) -> None:
        if node not in self._capacity:
            raise LedgerError(f"node {node!r} is not in the ledger (nodes: {', '.join(self._capacity) or 'none'})")
