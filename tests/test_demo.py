"""Demo pieces: the shipped workloads train for real, plans against the baseline, report and Gantt chart."""

from __future__ import annotations

import io
import json
import threading

import pytest
import torch

from ray_saturn import ClusterSpec, ProfileTable
from ray_saturn.demo import (
    DEMO_MEMORY_GB,
    DEMO_STRATEGIES,
    DemoResult,
    DemoSetup,
    demo_setup,
    demo_tasks,
    plan_with_baseline,
    watch_progress,
)
from ray_saturn.report import ReportError, RunReport, explain, gantt_png, render
from ray_saturn.runtime.journal import STATE_FILE
from ray_saturn.solver import build_problem, lower_bound
from ray_saturn.workloads.text import corpus, gpt_task, vocabulary
from ray_saturn.workloads.vision import cnn_task


def _train(task, steps):
    torch.manual_seed(0)
    model = task.model(task.hparams)
    opt = task.optimizer(model.parameters(), task.hparams)
    data = task.data(task.hparams)
    losses = []
    for s in range(steps):
        batch = data[s % len(data)]
        opt.zero_grad()
        loss = task.loss(model(batch[0]), batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_corpus_is_shipped_and_small():
    text = corpus()
    assert 5_000 < len(text.encode()) < 400_000
    assert "Four score and seven years ago" in text
    assert len(vocabulary()) < 100


@pytest.mark.parametrize(
    "task",
    [gpt_task(width=32, lr=3e-3, context=32, max_steps=40), cnn_task(channels=8, lr=1e-2, max_steps=40)],
    ids=lambda t: t.name,
)
def test_workloads_learn(task):
    losses = _train(task, 40)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.85 * first, (first, last)


def test_demo_tasks_are_two_families_of_different_lengths():
    tasks = demo_tasks(steps=10)
    names = [t.name for t in tasks]
    assert len(set(names)) == len(names) == 4
    assert {n.split("-")[0] for n in names} == {"gpt", "cnn"}
    assert all(t.total_steps == 10 for t in tasks)
    lengths = [t.total_steps for t in demo_tasks()]
    assert len(set(lengths)) == 4, lengths
    assert all(set(t.strategies) == set(DEMO_STRATEGIES) for t in demo_tasks())
    assert [t.total_steps for t in demo_tasks(0.5)] == [round(n / 2) for n in lengths]


def _profile():
    rows = []
    for i in range(6):
        for gpus, st in ((1, 1.0), (2, 0.6), (4, 0.4)):  # sub-linear: whole-node wastes GPUs
            rows.append({"task": f"t{i}", "strategy": "ddp" if gpus > 1 else "single", "gpus": gpus,
                         "step_time_s": st, "steps": 10})
    return ProfileTable.from_rows(rows)


def test_saturn_plan_beats_the_whole_node_baseline():
    cluster = ClusterSpec.uniform(1, 4)
    planned, baseline = plan_with_baseline(_profile(), cluster, time_limit_s=2)
    assert planned.policy == "saturn" and baseline.policy == "fifo-whole-node"
    bound = lower_bound(build_problem(_profile(), cluster)).value
    # 6 tasks x 10 steps on 4 GPUs: the best area is 1 GPU-s a step (1-GPU rows), 60 GPU-s / 4 GPUs
    assert bound == pytest.approx(15.0)
    assert bound <= planned.lower_bound_s <= planned.makespan_s < baseline.makespan_s
    assert baseline.makespan_s == pytest.approx(6 * 10 * 0.4)


def _state():
    def seg(strategy, gpus, start, end):
        return {"attempt": 0, "strategy": strategy, "gpus": gpus, "nodes": ["node-0"], "start_s": start,
                "first_step_s": start + 1, "end_s": end, "status": "finished", "steps_start": 0}

    return {
        "driver_state": "finished", "replans": 2, "moves": 1, "planned_makespan_s": 20.0,
        "tasks": {
            "t0": {"task": "t0", "state": "finished", "loss": 1.5, "steps_done": 10, "total_steps": 10,
                   "strategy": "single", "gpus": 1, "segments": [seg("ddp", 2, 0.0, 4.0), seg("single", 1, 5.0, 12.0)]},
            "t1": {"task": "t1", "state": "finished", "loss": 0.25, "steps_done": 10, "total_steps": 10,
                   "segments": [seg("ddp", 2, 0.0, 9.0)]},
        },
    }


def test_report_table_and_gantt(tmp_path):
    (tmp_path / STATE_FILE).write_text(json.dumps(_state()))
    planned, baseline = plan_with_baseline(
        ProfileTable.from_rows([{"task": t, "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 9}
                                for t in ("t0", "t1")]), ClusterSpec.uniform(1, 4), time_limit_s=1)
    report = RunReport.from_run_dir(tmp_path, planned=planned, baseline=baseline)
    assert report.realised_makespan_s == 12.0 and report.moves == 1
    t0 = next(t for t in report.tasks if t.task == "t0")
    assert (t0.strategy, t0.gpus, t0.start_s, t0.end_s, t0.final_loss) == ("single", 1, 0.0, 12.0, 1.5)
    from rich.console import Console

    buf = io.StringIO()
    render(report, Console(file=buf, width=140))
    text = buf.getvalue()
    for needle in ("t0", "t1", "single (2 segments)", "lower bound", "fifo-whole-node", "1.500", "12.0s"):
        assert needle in text, needle
    png = gantt_png(report, tmp_path / "gantt.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert json.loads(json.dumps(report.to_dict()))["tasks"][0]["segments"]


def test_report_errors_are_one_line(tmp_path):
    with pytest.raises(ReportError, match="no such file"):
        RunReport.from_run_dir(tmp_path)
    bad = {"driver_state": "running", "tasks": {"a": {"task": "a", "total_steps": 1, "segments": [{"gpus": 1}]}}}
    (tmp_path / STATE_FILE).write_text(json.dumps(bad))
    with pytest.raises(ReportError, match=r"task 'a' is not a task record") as err:
        RunReport.from_run_dir(tmp_path)
    assert "\n" not in str(err.value)


def test_progress_display_follows_the_state_file(tmp_path):
    from rich.console import Console

    (tmp_path / STATE_FILE).write_text(json.dumps(_state()))
    buf = io.StringIO()
    stop = threading.Event()
    stop.set()  # one refresh, then return
    watch_progress(tmp_path, {"t0": 10, "t1": 10}, stop, Console(file=buf, width=120), interval_s=0.01)
    out = buf.getvalue()
    assert "t0 finished singlex1" in out and "10/10" in out


def test_demo_json_has_the_fields_and_says_why_realised_differs(tmp_path):
    (tmp_path / STATE_FILE).write_text(json.dumps(_state()))
    prof = ProfileTable.from_rows(
        [{"task": t, "strategy": s, "gpus": g, "step_time_s": 0.5, "steps": 10, "startup_s": 0.5}
         for t in ("t0", "t1") for s, g in (("single", 1), ("ddp", 2))]
    )
    planned, baseline = plan_with_baseline(prof, ClusterSpec.uniform(1, 4), time_limit_s=1)
    report = RunReport.from_run_dir(tmp_path, planned=planned, baseline=baseline)
    why = explain(report, prof)
    # Every segment started up in 1 s against 0.5 s planned: the line says so, with the ratio.
    assert why.startswith(f"realised 12.0 s = {12.0 / planned.makespan_s:.2f}x planned")
    assert "start-ups took 3 s in all against 2 s planned" in why
    from dataclasses import replace

    report = replace(report, baselines={"fifo-whole-node": baseline.makespan_s}, explanation=why)
    out = DemoResult(report, tmp_path, tmp_path / "g.png", 1.0, True, "2 logical GPUs").to_json()
    for key in ("planned_makespan_s", "realised_makespan_s", "lower_bound_s", "baselines", "replans", "moves"):
        assert key in out, key
    assert out["baselines"] == {"fifo-whole-node": baseline.makespan_s} and out["replans"] == 2
    t0 = next(t for t in out["tasks"] if t["task"] == "t0")
    assert {k: t0[k] for k in ("strategy", "gpus", "start_s", "end_s", "final_loss")} == {
        "strategy": "single", "gpus": 1, "start_s": 0.0, "end_s": 12.0, "final_loss": 1.5}
    assert json.loads(json.dumps(out)) == out


def test_demo_setup_lets_one_gpu_run_the_demo():
    """One GPU per node (CUDA or logical): nothing can shard the GPTs, so the budget is lifted and the note
    says so, and only the strategies that run on one GPU are tried; more GPUs: as before."""
    one = demo_setup(gpus_per_node=1)
    assert one.memory_gb is None and "budget is lifted" in one.note
    assert one.strategies == ("single",)  # ddp and fsdp need 2 GPUs: not tried, not warned about
    assert demo_setup(gpus_per_node=2) == DemoSetup(DEMO_STRATEGIES, DEMO_MEMORY_GB)
    assert all(t.strategies == ("single",) for t in demo_tasks(strategies=one.strategies))
