"""Placement-group manager, TorchTrainer hand-over and emulation on a local Ray cluster.

One ``ray.cluster_utils.Cluster`` for the module: a GPU-less head and two
nodes of two logical GPUs each.
"""

from __future__ import annotations

import json
import time

import pytest
import ray

from ray_saturn import ClusterSpec, ProfileTable
from ray_saturn.runtime.api import emulate, emulated_cluster
from ray_saturn.runtime.journal import EVENTS_FILE
from ray_saturn.runtime.ledger import LedgerError
from ray_saturn.runtime.pg_manager import PlacementGroupManager

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    with emulated_cluster(2, 2) as c:
        yield c


def _bundle_nodes(pg) -> set[str]:
    from ray.util import placement_group_table

    return set(placement_group_table(pg)["bundles_to_node_id"].values())


def test_reservation_is_pinned_to_the_planned_node_and_never_overbooked(cluster):
    spec = ClusterSpec.from_ray()
    assert [n.gpus for n in spec.nodes] == [2, 2]
    mgr = PlacementGroupManager(spec)
    a, b = spec.nodes
    try:
        mgr.reserve("t1", (b.name,), 2)
        assert mgr.wait_ready("t1", 20)
        assert _bundle_nodes(mgr._holds["t1"]) == {b.node_id}
        with pytest.raises(LedgerError, match="which has 0 free of 2"):
            mgr.reserve("t2", (b.name,), 1)
        mgr.release("t1")
        mgr.reserve("t3", (a.name, b.name), 1)
        assert mgr.wait_ready("t3", 20)
        assert _bundle_nodes(mgr._holds["t3"]) == {a.node_id, b.node_id}
    finally:
        mgr.release_all()


def test_hold_waits_until_the_gpus_are_really_free(cluster):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    spec = ClusterSpec.from_ray()
    node = spec.nodes[0]

    @ray.remote(num_gpus=2, num_cpus=0)
    class Squatter:
        def ping(self):
            return True

    squatter = Squatter.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)
    ).remote()
    ray.get(squatter.ping.remote())
    mgr = PlacementGroupManager(spec)
    try:
        mgr.reserve("t", (node.name,), 1)
        assert not mgr.wait_ready("t", 1.0), "another holder still has the GPUs"
        ray.kill(squatter)
        assert mgr.wait_ready("t", 20)
        assert mgr.is_ready("t")
    finally:
        mgr.release_all()


def test_torch_trainer_runs_on_the_gpus_the_plan_gave(cluster, tmp_path):
    """The hand-over: hold released, TorchTrainer pinned by label selector to the planned node."""
    from ray.train import RunConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    spec = ClusterSpec.from_ray()
    target = spec.nodes[1]
    mgr = PlacementGroupManager(spec)
    mgr.reserve("pinned", (target.name,), 2)
    assert mgr.wait_ready("pinned", 20)
    placement = mgr.hand_over("pinned")
    assert "pinned" not in mgr._holds and mgr.ledger.free(target.name) == 0
    out = tmp_path / "where"
    out.mkdir()

    def loop(config):
        import os

        import ray.train
        import torch.distributed as dist

        rank = ray.train.get_context().get_world_rank()
        assert dist.is_initialized() and dist.get_world_size() == 2
        with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
            node = ray.get_runtime_context().get_node_id()
            json.dump({"node": node, "gpus": ray.get_gpu_ids()}, f)

    trainer = TorchTrainer(
        loop,
        train_loop_config={"out": str(out)},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=placement.scaling_config(),
        run_config=RunConfig(name="pinned", storage_path=str(tmp_path / "train")),
    )
    trainer.fit()
    mgr.release("pinned")
    where = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert {w["node"] for w in where} == {target.node_id}
    assert sorted(int(w["gpus"][0]) for w in where) == [0, 1]


def _profile(n=4, steps=400):
    rows = []
    for i in range(n):
        for g in (1, 2):
            rows.append(
                {
                    "task": f"job-{i}",
                    "strategy": "ddp",
                    "gpus": g,
                    "step_time_s": round(1.0 / g**0.8, 4),
                    "steps": steps * (1 + i % 2),
                }
            )
    return ProfileTable.from_rows(rows)


def test_emulation_reports_contract_3(cluster, tmp_path):
    t0 = time.time()
    out = emulate(
        _profile(),
        2,
        2,
        time_scale=0.02,
        storage=tmp_path / "run",
        use_running_ray=True,
        policy="saturn-static",
    )
    assert time.time() - t0 < 60
    assert out["state"] == "finished"
    for key in ("planned_makespan_s", "realised_makespan_s", "moves", "replans", "tasks"):
        assert key in out
    assert out["realised_makespan_s"] <= 1.25 * out["planned_makespan_s"]
    assert out["moves"] == 0  # the static policy never moves
    names = {n.name for n in ClusterSpec.from_ray().nodes}
    for t in out["tasks"]:
        assert t["state"] == "finished" and t["steps_done"] == t["total_steps"]
        for s in t["segments"]:
            assert set(s["nodes"]) <= names and s["end_s"] > s["start_s"] >= 0
    events = [json.loads(x) for x in (tmp_path / "run" / EVENTS_FILE).read_text().splitlines()]
    assert any(e["kind"] == "replan" and e["reasons"] for e in events)
    # Checkpoints went through the task folders of the run.
    assert list((tmp_path / "run" / "tasks").glob("*/emulated/step-*.json"))


def test_the_launcher_learns_the_backend_before_the_clock_and_gives_up_while_every_gpu_is_held(cluster, tmp_path,
                                                                                               monkeypatch):
    from ray_saturn.runtime import train_launcher
    from ray_saturn.runtime.storage import RunStorage

    spec = ClusterSpec.from_ray()
    monkeypatch.setattr(train_launcher, "PREPARE_PROBE_S", 2.0)
    held = ray.util.placement_group([{"GPU": 2}, {"GPU": 2}], strategy="SPREAD")  # every GPU, by someone else
    assert held.wait(60)
    try:
        busy = train_launcher.TrainLauncher(PlacementGroupManager(spec), RunStorage(tmp_path / "a"), {})
        busy.prepare()
        assert busy._backend is None  # the first launch asks inside its hold instead
    finally:
        ray.util.remove_placement_group(held)
    monkeypatch.setattr(train_launcher, "PREPARE_PROBE_S", 120.0)  # a loaded CI machine starts a worker slowly
    free = train_launcher.TrainLauncher(PlacementGroupManager(spec), RunStorage(tmp_path / "b"), {})
    free.prepare()
    assert free._backend == "gloo"
    # The probe that gave up left nothing pending: all four GPUs can be reserved again.
    again = ray.util.placement_group([{"GPU": 2}, {"GPU": 2}], strategy="SPREAD")
    try:
        assert again.wait(60)
    finally:
        ray.util.remove_placement_group(again)


def test_the_board_hands_a_parked_group_to_one_claim_and_never_to_a_closed_one(cluster):
    from ray_saturn.runtime.launcher import drain_board, new_board

    board = new_board()
    ray.get(board.park.remote("g", "a", 0, 1.0, 30))
    ev = drain_board(board)
    assert [(type(e).__name__, e.task, e.status, e.step) for e in ev] == [("Exited", "a", "finished", 30)]
    assert ray.get(board.next_segment.remote("g", False)) == ("wait", None)
    assert ray.get(board.claim.remote("g")) and not ray.get(board.claim.remote("g")), "one claim only"
    assert ray.get(board.next_segment.remote("g", True)) == ("wait", None), "a claimed group waits past its linger"
    assert ray.get(board.offer.remote("g", ["seg"]))
    assert ray.get(board.decision.remote("g", 0)) == ("wait", None), "the other ranks follow rank 0"
    assert ray.get(board.next_segment.remote("g", False)) == ("run", ["seg"])
    assert ray.get(board.decision.remote("g", 0)) == ("run", ["seg"])
    # Parked again; nobody claims it within its linger: it closes, and a late claim or offer loses.
    ray.get(board.park.remote("g", "b", 0, 2.0, 30))
    assert ray.get(board.next_segment.remote("g", True)) == ("end", None)
    assert ray.get(board.decision.remote("g", 1)) == ("end", None)
    assert not ray.get(board.claim.remote("g")) and not ray.get(board.offer.remote("g", ["late"]))
    # A claim whose launch never comes: dismiss(force) ends it; a plain dismiss leaves a claimed group alone.
    ray.get(board.park.remote("h", "c", 0, 3.0, 30))
    assert ray.get(board.claim.remote("h"))
    ray.get(board.dismiss.remote("h"))
    assert ray.get(board.next_segment.remote("h", True)) == ("wait", None)
    ray.get(board.dismiss.remote("h", True))
    assert ray.get(board.next_segment.remote("h", False)) == ("end", None)
    ray.kill(board)


def test_a_backfilled_task_moves_onto_its_planned_row_on_ray(cluster, tmp_path):
    """Backfill through the real runtime: "big" waits in the plan for both nodes, runs on a GPU of the
    idle node meanwhile, is checkpointed and stopped when "a" ends, and finishes on 4 GPUs."""
    from dataclasses import replace

    from ray_saturn.runtime.config import emulation_config

    rows = [
        {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 4000},
        {"task": "big", "strategy": "ddp", "gpus": 4, "nodes": 2, "step_time_s": 1.0, "steps": 4000},
        {"task": "big", "strategy": "single", "gpus": 1, "step_time_s": 2.5, "steps": 4000},
    ]
    scale = 0.005
    cfg = replace(emulation_config(scale, policy="saturn-replan"), backfill=True, restart_s=1.0)
    # "big" arrives once "a" runs (both at once could plan "big" first, on all 4 GPUs, and "a" after it).
    out = emulate(ProfileTable.from_rows(rows), 2, 2, time_scale=scale, config=cfg, arrivals={"big": 200.0},
                  storage=tmp_path / "run", use_running_ray=True)
    assert out["state"] == "finished"
    big = next(t for t in out["tasks"] if t["task"] == "big")
    assert big["steps_done"] == 4000
    # (The driver sets the restart cost it measures on its launches; ~1,500 steps on 1 GPU repay it 10 times.)
    assert [(s["gpus"], s["status"]) for s in big["segments"]] == [(1, "stopped"), (4, "finished")]
    events = [json.loads(x) for x in (tmp_path / "run" / EVENTS_FILE).read_text().splitlines()]
    assert [e["task"] for e in events if e["kind"] == "backfill"] == ["big"]
