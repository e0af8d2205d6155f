"""Shares of one GPU executed on Ray: fractional-GPU bundles pinned to the planned node, emulated
segments and real TorchTrainer segments (``resources_per_worker={"GPU": share}``) sharing device 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ray_saturn import ClusterSpec, ProfileTable
from ray_saturn.runtime.api import emulate, emulated_cluster
from ray_saturn.runtime.ledger import LedgerError
from ray_saturn.runtime.pg_manager import PlacementGroupManager

pytestmark = pytest.mark.ray


def _overlap(segs) -> bool:
    """True when every pair of segments ran at the same time at some instant."""
    start = max(s["start_s"] if isinstance(s, dict) else s.start_s for s in segs)
    end = min(s["end_s"] if isinstance(s, dict) else s.end_s for s in segs)
    return start < end


def test_quarter_shares_share_one_logical_gpu_and_typed_rows_stay_on_their_type_in_emulation(tmp_path):
    """One emulated cluster of a fast and a slow node (one logical GPU each): the bundles of four quarter
    shares on the fast node's device, then two emulated runs on it (one Ray start for both)."""
    quarters = [{"task": f"q{i}", "strategy": "single", "gpus": 0.25, "step_time_s": 1.0, "steps": 300,
                 "gpu_type": "fast"} for i in range(4)]
    typed = [
        {"task": "fast-only", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 200, "gpu_type": "fast"},
        {"task": "either", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 200, "gpu_type": "fast"},
        {"task": "either", "strategy": "ddp", "gpus": 1, "step_time_s": 1.5, "steps": 200, "gpu_type": "slow"},
        {"task": "slow-share", "strategy": "single", "gpus": 0.5, "step_time_s": 1.0, "steps": 200,
         "gpu_type": "slow"},
    ]
    with emulated_cluster(2, 1, gpu_types=["fast", "slow"]):
        spec = ClusterSpec.from_ray()
        types = {n.name: n.gpu_type for n in spec.nodes}
        assert sorted(types.values()) == ["fast", "slow"]
        node = next(n for n in spec.nodes if n.gpu_type == "fast")
        mgr = PlacementGroupManager(spec, run_name="bundles")
        try:  # the bundles: {"GPU": 0.25} pinned to the node; a fifth quarter does not fit device 0
            dev = {node.name: [(0, 0.25)]}
            for i in range(4):
                mgr.reserve(f"b{i}", (node.name,), 0.25, devices=dev, gpu_type="fast")
            assert all(mgr.wait_ready(f"b{i}", 20) for i in range(4))
            from ray.util import placement_group_table

            table = placement_group_table(mgr._holds["b0"])
            assert table["bundles"] == {0: {"GPU": 0.25}} and set(table["bundles_to_node_id"].values()) == {
                node.node_id
            }
            with pytest.raises(LedgerError, match=r"device 0 of node .* would hold more than one GPU"):
                mgr.reserve("b4", (node.name,), 0.25, devices=dev)
            with pytest.raises(LedgerError, match=r"runs a row measured on slow, but node .* is of type fast"):
                mgr.reserve("b5", (node.name,), 0.25, devices=dev, gpu_type="slow")
            assert mgr.hand_over("b0").scaling_config().resources_per_worker == {"GPU": 0.25}
        finally:
            mgr.release_all()
        shared = emulate(ProfileTable.from_rows(quarters), 2, 1, time_scale=0.02, storage=tmp_path / "shared",
                         use_running_ray=True, policy="saturn-static")
        out = emulate(ProfileTable.from_rows(typed), 2, 1, time_scale=0.02, storage=tmp_path / "typed",
                      use_running_ray=True, policy="saturn-static")
    assert shared["state"] == "finished", shared
    segs = [s for t in shared["tasks"] for s in t["segments"]]
    assert len(segs) == 4 and all(s["devices"] == {node.name: [[0, 0.25]]} for s in segs)
    assert _overlap(segs), segs  # all four ran at once on device 0
    # The plan: all four start at 0, each a quarter of device 0; one after another they would take 1,200
    # profile seconds and more (start-ups at time scale 0.02 add 100-200 each on a loaded 2-core machine).
    assert shared["realised_makespan_s"] < 4 * 300
    assert out["state"] == "finished", out
    where = {t["task"]: [(s["gpu_type"], types[n]) for s in t["segments"] for n in s["nodes"]] for t in out["tasks"]}
    assert where["fast-only"] == [("fast", "fast")]
    assert where["slow-share"] == [("slow", "slow")]
    assert all(row_type == node_type for w in where.values() for row_type, node_type in w)


WORKLOAD = """
import torch
from ray_saturn import Task

def model(hp):
    return torch.nn.Linear(4, 1)

def data(hp):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)) for _ in range(4)]

def loss(out, batch):
    return torch.nn.functional.mse_loss(out, batch[1])

def opt(params, hp):
    return torch.optim.SGD(params, lr=hp["lr"])

tasks = [Task(f"h{i}", model, data, loss, opt, {"lr": 0.1}, max_steps=40) for i in range(2)]
"""


def test_run_trains_two_half_shares_on_one_logical_gpu(tmp_path):
    """``ray-saturn run --num-gpus 1`` (a local Ray of one logical GPU): two TorchTrainer segments (one
    worker of {"GPU": 0.5} each) run at once on device 0: two training processes, what two cores hold."""
    (tmp_path / "w.py").write_text(WORKLOAD)
    ProfileTable.from_rows(
        [{"task": f"h{i}", "strategy": "single", "gpus": 0.5, "step_time_s": 0.1, "steps": 40} for i in range(2)]
    ).write(tmp_path / "p.csv")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ray-saturn"), "run", str(tmp_path / "w.py"), "--profile",
         str(tmp_path / "p.csv"), "--storage", str(tmp_path / "run"), "--num-gpus", "1", "--policy", "saturn-static",
         "--checkpoint-interval", "1", "--solver-time-limit", "1", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "1 logical GPUs on the CPU" in out.stderr  # the one line that says what local mode chose
    result = json.loads(out.stdout)
    assert result["state"] == "finished", result
    segs = []
    for rec in result["tasks"]:
        assert rec["state"] == "finished" and rec["steps_done"] == 40
        (seg,) = rec["segments"]
        assert seg["gpus"] == 0.5 and list(seg["devices"].values()) == [[[0, 0.5]]], seg
        segs.append(seg)
    assert _overlap(segs), [(s["start_s"], s["end_s"]) for s in segs]
