"""release/online_benchmark.py: where a run's GPU time went (``waste``), on segments checked by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ray_saturn.control.state import Placement, Segment
from ray_saturn.sim import TaskRecord

RELEASE = Path(__file__).resolve().parents[1] / "release"
sys.path.insert(0, str(RELEASE))

import online_benchmark as ob  # noqa: E402


def _tasks() -> list[TaskRecord]:
    # a: 100 steps, least 400 GPU-s (1 GPU x 400 s); half on 2 GPUs (400 GPU-s stepping: 200 wasted),
    # then stopped and finished on 1 GPU; each segment pays 10 s of set-up.
    a = TaskRecord("a", 0.0, 420.0, [
        Segment(Placement("ddp", 2, ("n0",)), 0.0, setup_s=10.0, end_s=210.0, steps_start=0, steps_end=50),
        Segment(Placement("ddp", 1, ("n1",)), 210.0, setup_s=10.0, end_s=420.0, steps_start=50, steps_end=100),
    ])
    # b: 10 steps, least 100 GPU-s, run at its least area on 2 GPUs from 100 s to 150 s.
    b = TaskRecord("b", 100.0, 150.0, [
        Segment(Placement("ddp", 2, ("n1",)), 100.0, end_s=150.0, steps_start=0, steps_end=10),
    ])
    return [a, b]


def test_the_parts_add_up_to_the_makespan_and_name_the_waste():
    least, steps, app = {"a": 400.0, "b": 100.0}, {"a": 100, "b": 10}, {"a": "x", "b": "y"}
    w = ob.waste(_tasks(), least, steps, app, gpus=4, upto=420.0)
    # Of 4 GPUs x 420 s: 730 GPU-s held, 30 of them in set-up, 200 beyond a's least area.
    assert w.work_s == pytest.approx(125.0) and w.idle_s == pytest.approx(237.5)
    assert w.setup_s == pytest.approx(7.5) and w.inefficiency_s == {"x": pytest.approx(50.0), "y": pytest.approx(0.0)}
    assert w.work_s + w.idle_s + w.setup_s + sum(w.inefficiency_s.values()) == pytest.approx(420.0)


def test_a_prefix_counts_the_steps_made_by_then():
    least, steps, app = {"a": 400.0, "b": 100.0}, {"a": 100, "b": 10}, {"a": "x", "b": "y"}
    w = ob.waste(_tasks(), least, steps, app, gpus=4, upto=110.0)
    # By 110 s: a has made 25 steps (100 of its 200 s stepping), b 2 (10 of 50 s).
    assert w.work_s == pytest.approx((100.0 + 20.0) / 4)
    assert w.idle_s == pytest.approx(110.0 - 240.0 / 4) and w.setup_s == pytest.approx(20.0 / 4)
    assert w.inefficiency_s["x"] == pytest.approx((220.0 - 20.0 - 100.0) / 4)
    assert w.work_s + w.idle_s + w.setup_s + sum(w.inefficiency_s.values()) == pytest.approx(110.0)
    assert w.to_dict()["inefficiency_s"] == {"x": 25.0, "y": 0.0}


def test_recording_some_workloads_keeps_the_baselines_recorded_before(tmp_path):
    root = tmp_path / "pollux"
    (root / "workloads").mkdir(parents=True)
    (root / "workloads" / "workload-8.csv").write_text(
        "name,time,application,num_replicas,batch_size\nncf-0,10,ncf,1,256\ncifar10-1,50,cifar10,2,128\n")
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "optimus-workload-8.txt").write_text(
        "Completed jobs:\n{'ncf-0': 100, 'cifar10-1': 400}\nAverage JCT: 250\n")
    recorded = ob.record_pollux(runs, root)
    assert recorded["results"] == {"8": {"optimus": {"mean_jct_s": 250.0, "makespan_s": 450.0}}}
    before = tmp_path / "baselines.json"
    before.write_text(json.dumps({"results": {"1": {"tiresias": {"mean_jct_s": 1.0, "makespan_s": 2.0}},
                                              "8": {"tiresias": {"mean_jct_s": 3.0, "makespan_s": 4.0},
                                                    "optimus": {"mean_jct_s": 9.0, "makespan_s": 9.0}}}}))
    merged = ob.merged_baselines(recorded, before)["results"]
    assert merged == {"1": {"tiresias": {"mean_jct_s": 1.0, "makespan_s": 2.0}},
                      "8": {"optimus": {"mean_jct_s": 250.0, "makespan_s": 450.0},
                            "tiresias": {"mean_jct_s": 3.0, "makespan_s": 4.0}}}
    (runs / "tiresias-workload-8.txt").write_text("{'ncf-0': 100}\nAverage JCT: 100\n")  # a run cut short
    with pytest.raises(SystemExit, match="1 of 2 jobs completed"):
        ob.record_pollux(runs, root)
