"""A profiling trial spanning two nodes of a local multi-node Ray cluster (logical GPUs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

import ray_saturn
from ray_saturn.profiler import Profiler, gpu_ladder
from ray_saturn.spec import ClusterSpec
from ray_saturn.toy import mlp_task

# (the start-up probe: tests/test_segment_costs.py)
FAST = {"warmup": 1, "steps": 2, "min_measure_s": 0.0, "segment_costs": False}


@pytest.mark.ray
def test_a_trial_spans_two_nodes():
    """2 GPUs over 2 one-GPU nodes: one bundle per node, workers rendezvous across raylets."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1})
    try:
        cluster.add_node(num_cpus=1, num_gpus=1)
        root = str(Path(ray_saturn.__file__).resolve().parents[1])
        ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": root}})
        cluster.wait_for_nodes()
        spec = ClusterSpec.from_ray()
        assert gpu_ladder(spec) == [(1, 1), (2, 2)]
        result = Profiler(spec, strategies=["ddp"], **FAST).run([mlp_task("two-nodes")])
        row = result.table.get("two-nodes", "ddp", 2, nodes=2)
        assert row.feasible and row.step_time_s > 0
    finally:
        ray.shutdown()
        cluster.shutdown()
