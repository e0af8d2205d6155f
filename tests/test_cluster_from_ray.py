"""ClusterSpec.from_ray reads the GPUs of a live (local, logical-GPU) Ray cluster."""

from __future__ import annotations

import pytest
import ray

from ray_saturn import ClusterSpec, SpecError


def test_not_initialised_is_a_clear_error():
    if ray.is_initialized():
        pytest.skip("another test left Ray running")
    with pytest.raises(SpecError, match="Ray is not initialised"):
        ClusterSpec.from_ray()


@pytest.mark.ray
def test_two_node_cluster_with_logical_gpus():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 2})
    try:
        cluster.add_node(num_cpus=1, num_gpus=3, resources={"accelerator_type:T4": 1})
        cluster.add_node(num_cpus=1, num_gpus=0)  # a CPU-only node is not part of the plan
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        spec = ClusterSpec.from_ray()
        assert sorted(n.gpus for n in spec.nodes) == [2, 3]
        assert all(n.node_id and n.name == f"node-{n.node_id[:8]}" for n in spec.nodes)
        assert spec.total_gpus == 5
        assert {n.gpus: n.gpu_type for n in spec.nodes} == {2: None, 3: "T4"}  # Ray's accelerator_type resource
    finally:
        ray.shutdown()
        cluster.shutdown()
