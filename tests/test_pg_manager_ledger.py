"""The GPU ledger (no Ray): reservations never overbook a node."""

from __future__ import annotations

import pytest

from ray_saturn import ClusterSpec, NodeSpec
from ray_saturn.errors import SaturnError
from ray_saturn.runtime.ledger import GpuLedger, LedgerError
from ray_saturn.runtime.pg_manager import PlacementGroupManager


def test_reserve_and_release():
    ledger = GpuLedger(ClusterSpec.uniform(2, 4))
    ledger.reserve("a", ("node-0",), 3)
    ledger.reserve("b", ("node-0", "node-1"), 1)
    assert ledger.free("node-0") == 0 and ledger.free("node-1") == 3
    assert ledger.holder("b").gpus == 2
    assert ledger.release("a").gpus == 3
    assert ledger.free("node-0") == 3
    assert ledger.release("a") is None


def test_overbooking_is_refused_with_the_arithmetic():
    ledger = GpuLedger(ClusterSpec.uniform(1, 4))
    ledger.reserve("a", ("node-0",), 3)
    with pytest.raises(LedgerError, match="needs 2 GPUs on node 'node-0', which has 1 free of 4"):
        ledger.reserve("b", ("node-0",), 2)
    assert not ledger.fits(("node-0",), 2)
    assert ledger.free("node-0") == 1  # the refused reservation took nothing


def test_double_reservation_and_bad_nodes():
    ledger = GpuLedger(ClusterSpec.uniform(2, 2))
    ledger.reserve("a", ("node-0",), 1)
    with pytest.raises(LedgerError, match="already holds"):
        ledger.reserve("a", ("node-1",), 1)
    with pytest.raises(LedgerError, match="not in the ledger"):
        ledger.reserve("b", ("node-9",), 1)
    with pytest.raises(LedgerError, match="distinct"):
        ledger.reserve("b", ("node-1", "node-1"), 1)


def test_node_loss_drops_its_reservations_and_nodes_can_join():
    ledger = GpuLedger(ClusterSpec.uniform(2, 2))
    ledger.reserve("a", ("node-0", "node-1"), 1)
    ledger.reserve("b", ("node-1",), 1)
    dropped = ledger.remove_node("node-1")
    assert sorted(r.task for r in dropped) == ["a", "b"]
    assert ledger.nodes == ("node-0",) and ledger.free("node-0") == 2
    ledger.add_node(NodeSpec("node-2", 4))
    assert ledger.cluster().total_gpus == 6
    with pytest.raises(LedgerError):
        ledger.add_node(NodeSpec("node-2", 4))


def test_manager_needs_ray_node_ids():
    with pytest.raises(SaturnError, match=r"ClusterSpec\.from_ray"):
        PlacementGroupManager(ClusterSpec.uniform(1, 1))
