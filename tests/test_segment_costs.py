"""What a segment costs besides its steps, measured by the profiler: set-up, checkpoint save and
load in a trial's workers, and a TorchTrainer's start-up probed once per GPU count and hardware."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from ray_head import local_ray

import ray_saturn
from ray_saturn import ClusterSpec, ProfileError, ProfileTable
from ray_saturn.profiler import Profiler, knobs_for, parse_knobs
from ray_saturn.profiler.profiler import (
    CALIBRATION_BUDGET_S,
    STEP_FACTOR_RANGE,
    _calibrations,
    _row_factor,
    _sane_factor,
)
from ray_saturn.profiler.segment import Calibration, TrainerStartup, measure_segment_costs
from ray_saturn.profiler.store import ProfileStore, StoredStartup, StoredTrial
from ray_saturn.strategies import WorkerContext
from ray_saturn.toy import mlp_task


def test_a_single_worker_measures_setup_save_and_load():
    costs = measure_segment_costs(mlp_task("m"), "single", {}, WorkerContext(0, 1, torch.device("cpu")))
    assert costs.setup_s > 0 and costs.save_s > 0 and costs.load_s > 0 and costs.data_s > 0
    none = measure_segment_costs(mlp_task("m"), "single", {}, WorkerContext(0, 1, torch.device("cpu")),
                                 shared_folder=False)
    assert none.setup_s > 0 and none.save_s is None and none.load_s is None


def test_store_keeps_segment_costs_and_start_up_probes_and_reads_older_stores(tmp_path):
    path = tmp_path / "store.parquet"
    store = ProfileStore(path)
    store.put(StoredTrial("sig", "ddp", 2, 1, 0.5, True, 1.0, None, "{}", 3.0, 1.5, 0.2, 0.3))
    store.put_startup("cpu", 2, 1, 17.5, 1.0, step_factor=1.25, step_factors={"sig": 1.25, "other": 1.5})
    store.flush()
    again = ProfileStore(path)
    assert again.get("sig", "ddp", 2, 1).checkpoint_load_s == 0.3
    assert again.startup("cpu", 2, 1) == StoredStartup(17.5, 1.0, 1.25, {"sig": 1.25, "other": 1.5})
    assert again.startup("cpu", 1, 1) is None
    # A store written before the cost columns existed still reads (costs unknown).
    old = pq.read_table(path).drop_columns(["setup_s", "checkpoint_save_s", "checkpoint_load_s"])
    pq.write_table(old, path)
    assert ProfileStore(path).get("sig", "ddp", 2, 1).setup_s is None
    # Probes are kept per number of trainers started side by side; a file written before that reads as 1.
    store.put_startup("cpu", 1, 1, 25.0, 1.5, side_by_side=2)
    store.flush()
    again = ProfileStore(path)
    assert again.startup("cpu", 1, 1, 2) == StoredStartup(25.0, 1.5) and again.startup("cpu", 1, 1) is None
    rows = json.loads(Path(again.startup_path).read_text())
    assert {r["side_by_side"] for r in rows} == {1, 2}
    # A file written before probes calibrated each signature has no factors per signature (each is probed
    # again); one before probes ran side by side reads as 1; one before they calibrated, without a factor.
    two = [r for r in rows if r["gpus"] == 2]
    Path(again.startup_path).write_text(json.dumps([{k: v for k, v in r.items() if k != "step_factors"} for r in two]))
    assert ProfileStore(path).startup("cpu", 2, 1) == StoredStartup(17.5, 1.0, 1.25, {})
    Path(again.startup_path).write_text(json.dumps([{k: v for k, v in r.items() if k not in ("side_by_side",
                                                                                              "step_factor",
                                                                                              "step_factors")}
                                                    for r in two]))
    assert ProfileStore(path).startup("cpu", 2, 1) == StoredStartup(17.5, 1.0, None)
    Path(again.startup_path).write_text("not json")
    with pytest.raises(ProfileError, match="start-up store"):
        ProfileStore(path)


def test_start_up_probe_runs_as_many_trainers_side_by_side_as_the_run_starts():
    two = ClusterSpec.uniform(1, 2)
    p = Profiler(two)
    # A run's first plan starts one segment per free GPU: on 2 GPUs two 1-GPU trainers at once.
    assert p.side_by_side(two, 1) == 2 and p.side_by_side(two, 2) == 1
    assert p.side_by_side(ClusterSpec.uniform(4, 8), 1) == 8 and p.side_by_side(ClusterSpec.uniform(4, 8), 4) == 8
    assert p.side_by_side(ClusterSpec.uniform(1, 1), 2) == 1
    # ... and never more than the run has tasks: one task never starts two segments.
    assert p.side_by_side(ClusterSpec.uniform(4, 8), 1, tasks=3) == 3 and p.side_by_side(two, 1, tasks=1) == 1
    assert Profiler(two, startup_side_by_side=1).side_by_side(two, 1) == 1
    for bad in (0, 1.5, True):
        with pytest.raises(ray_saturn.SpecError, match="startup_side_by_side"):
            Profiler(two, startup_side_by_side=bad)


def test_the_probe_calibrates_each_signature_on_its_fastest_trial_of_each_gpu_count():
    tasks = [mlp_task("a"), mlp_task("b", width=48)]
    sigs = {"a": "sa", "b": "sb"}
    trials = [
        StoredTrial("sa", "single", 1, 1, 0.010, True, None, None, "{}", 1.0),
        StoredTrial("sb", "single", 1, 1, 0.100, True, None, None, "{}", 1.0),
        StoredTrial("sa", "ddp", 1, 1, 0.050, True, None, None, '{"bucket_cap_mb": 5}', 1.0),
        StoredTrial("sa", "ddp", 2, 1, 0.004, True, None, None, '{"bucket_cap_mb": 5}', 1.0),
        StoredTrial("sb", "fsdp", 2, 1, None, False, None, "out of memory", "{}", 1.0),
    ]
    cal = _calibrations(tasks, sigs, {t.key: t for t in trials})
    assert set(cal) == {(1, 1), (2, 1)}  # only GPU counts with a feasible trial
    # One per signature: its fastest trial of the shape, about 2 s of steps (3 to 50); most work first.
    assert [(c.signature, c.strategy, c.trial_step_s, c.steps) for c in cal[(1, 1)]] == [
        ("sb", "single", 0.1, 20), ("sa", "single", 0.01, 50)]
    (two,) = cal[(2, 1)]
    assert (two.task.name, two.strategy, two.knobs, two.steps) == ("a", "ddp", {"bucket_cap_mb": 5}, 50)
    # At most CALIBRATION_BUDGET_S of steps per shape: the tasks with the least work are left out.
    many = [mlp_task(f"t{i}", max_steps=100 + i) for i in range(12)]
    msigs = {t.name: f"s{i}" for i, t in enumerate(many)}
    cal = _calibrations(many, msigs, {(f"s{i}", "single", 1, 1): StoredTrial(f"s{i}", "single", 1, 1, 1.0, True, None,
                                                                              None, "{}", 1.0) for i in range(12)})
    kept = [c.signature for c in cal[(1, 1)]]
    assert len(kept) == int(CALIBRATION_BUDGET_S // 3) and kept == [f"s{i}" for i in range(11, 11 - len(kept), -1)]
    low, high = STEP_FACTOR_RANGE
    assert _sane_factor(1.4, 1, 1) == 1.4 and _sane_factor(100.0, 1, 1) == high and _sane_factor(0.01, 1, 1) == low


def test_a_kept_probe_calibrates_only_new_signatures_and_rows_take_their_signatures_factor(tmp_path, monkeypatch):
    """The probe is kept per hardware; a later profile with a signature it has no factor for probes again
    for that one only and keeps the others' factors; a row takes its signature's factor, else the median."""
    import ray_saturn.profiler.segment as segment

    calls = []

    def fake_probe(gpus, nodes=1, *, side_by_side=1, calibrate=None, backend=None):
        calls.append([c.signature for c in calibrate])
        factors = {c.signature: {"sa": 1.1, "sb": 1.6, "sc": 9.0}[c.signature] for c in calibrate}
        return TrainerStartup(gpus, nodes, 5.0 + len(calls), 0.5, side_by_side, 6.0, 1.0, factors)

    monkeypatch.setattr(segment, "probe_trainer_startup", fake_probe)
    store = str(tmp_path / "store.parquet")
    cluster = ClusterSpec.uniform(1, 2)
    task = {s: mlp_task(n) for s, n in (("sa", "a"), ("sb", "b"), ("sc", "c"))}

    def cals(*names):
        return {(1, 1): [Calibration(task[s], "single", {}, 3, 0.01, s) for s in names]}

    p = Profiler(cluster, store=store)
    got = p._trainer_startup("cpu", cals("sa", "sb"), cluster, 2)[(1, 1)]
    assert calls == [["sa", "sb"]] and got.step_factors == {"sa": 1.1, "sb": 1.6} and got.step_factor == 1.6
    p.store.flush()
    again = Profiler(cluster, store=store)
    assert again._trainer_startup("cpu", cals("sb", "sa"), cluster, 2)[(1, 1)].start_s == 6.0
    assert calls == [["sa", "sb"]]  # all kept: not probed again
    got = again._trainer_startup("cpu", cals("sa", "sc"), cluster, 2)[(1, 1)]
    assert calls[-1] == ["sc"] and got.start_s == 7.0  # only the new signature (its factor clamped)
    assert got.step_factors == {"sa": 1.1, "sb": 1.6, "sc": STEP_FACTOR_RANGE[1]}
    assert _row_factor(got, "sb") == 1.6 and _row_factor(got, "other") == got.step_factor == 1.6
    assert _row_factor(None, "sa") == 1.0 and _row_factor(StoredStartup(5.0, 0.5), "sa") == 1.0


def test_knobs_for_is_the_one_reader_of_the_knobs_column():
    good = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 1,
                                    "knobs": '{"bucket_cap_mb": 25}'}])
    assert knobs_for(good, "a", "ddp", 2) == {"bucket_cap_mb": 25}
    bad = ProfileTable(pa.table({"task": ["a"], "strategy": ["ddp"], "gpus": [2], "step_time_s": [1.0],
                                 "steps": [1], "knobs": ["{oops"]}))
    with pytest.raises(ProfileError, match="not JSON"):
        knobs_for(bad, "a", "ddp", 2)
    plain = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 1}])
    assert knobs_for(plain, "a", "ddp", 2) == {}
    # The parser it shares with every other reader of knob settings, with the caller's error type.
    assert parse_knobs({"a": 1}, "row 1") == {"a": 1} and parse_knobs("", "row 1") == {}
    with pytest.raises(ray_saturn.SpecError, match=r"row 1 must be a JSON object \(or a dict\), got '\[1\]'"):
        parse_knobs("[1]", "row 1", error=ray_saturn.SpecError)


@pytest.mark.ray
def test_profile_has_start_up_and_checkpoint_columns_probed_side_by_side(tmp_path):
    """Two tasks on 2 logical GPUs: two trainers started at once; the profile's start-up is theirs, kept
    under 2 (tasks differing only in learning rate: one trial measures both). One Ray start for all of it."""
    with local_ray(num_gpus=2, num_cpus=2):
        store = str(tmp_path / "store.parquet")
        kw = {"strategies": ["single"], "warmup": 1, "steps": 2, "min_measure_s": 0.0, "store": store}
        table = Profiler(ClusterSpec.from_ray(), **kw).run([mlp_task("m"), mlp_task("m2", lr=0.02)]).table
        row = table.get("m", "single", 1)
        # Ray Train's start (seconds on any machine) plus the model's set-up; a save and a load.
        assert row.startup_s > 1.0 and row.checkpoint_save_s > 0 and row.checkpoint_load_s > 0
        assert row.runtime_s == pytest.approx(row.startup_s + row.steps * row.step_time_s)
        # Step times as a segment steps: the trial's times the probe's step factor.
        cols = next(r for r in table.to_arrow().to_pylist() if r["task"] == "m")
        assert 0.5 <= cols["step_factor"] <= 3.0
        assert row.step_time_s == pytest.approx(cols["trial_step_time_s"] * cols["step_factor"])
        # The probe ran two trainers side by side (a run on 2 GPUs starts two 1-GPU segments at once).
        (kept,) = json.loads(Path(ProfileStore(store).startup_path).read_text())
        assert (kept["gpus"], kept["side_by_side"]) == (1, 2) and kept["start_s"] > 1.0 and kept["stop_s"] > 0
        assert table.get("m2", "single", 1).startup_s >= kept["start_s"]
        # The step factor is the task signature's, calibrated by the probe's trainers side by side.
        assert set(kept["step_factors"]) == {cols["signature"]}
        assert cols["step_factor"] == pytest.approx(kept["step_factors"][cols["signature"]])
        # The probe is kept in the store: a second profile of the same signatures (other learning rates)
        # skips it and reads the same start-up and factor.
        t0 = time.monotonic()
        again = Profiler(ClusterSpec.from_ray(), **kw).run([mlp_task("n", lr=0.05), mlp_task("n2", lr=0.03)]).table
        assert time.monotonic() - t0 < 30
        assert again.get("n", "single", 1).startup_s == pytest.approx(row.startup_s)
        assert again.get("n", "single", 1).step_time_s == pytest.approx(row.step_time_s)
        assert len(json.loads(Path(ProfileStore(store).startup_path).read_text())) == 1


def test_the_start_up_probes_of_one_profile_ask_the_cluster_for_its_backend_once(tmp_path, monkeypatch):
    """The first probe learns the backend (a new GPU worker); the next GPU counts' probes are given it."""
    import ray_saturn.profiler.segment as segment

    given = []

    def fake_probe(gpus, nodes=1, *, side_by_side=1, calibrate=None, backend=None):
        given.append(backend)
        factors = {c.signature: 1.2 for c in calibrate}
        return TrainerStartup(gpus, nodes, 5.0, 0.5, side_by_side, 6.0, 1.2, factors, backend or "gloo")

    monkeypatch.setattr(segment, "probe_trainer_startup", fake_probe)
    cluster = ClusterSpec.uniform(1, 2)
    task = mlp_task("a")
    cals = {(g, 1): [Calibration(task, "single" if g == 1 else "ddp", {}, 3, 0.01, "sa")] for g in (1, 2)}
    got = Profiler(cluster, store=str(tmp_path / "store.parquet"))._trainer_startup("cpu", cals, cluster, 2)
    assert set(got) == {(1, 1), (2, 1)} and given == [None, "gloo"]
