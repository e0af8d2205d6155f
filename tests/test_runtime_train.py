"""Tasks trained for real: ``ray_saturn.run`` with TorchTrainer segments on logical GPUs.

One trainer start costs 10-20 s here, so this is one
short run: a task that trains to its step count, and a task whose model
cannot be built, which is marked failed with the reason while the other
finishes.
"""

from __future__ import annotations

import sys

import pytest
import ray
import torch

import ray_saturn
from ray_saturn import ProfileTable, Task, strategies
from ray_saturn.runtime.api import emulated_cluster
from ray_saturn.runtime.driver import DriverConfig

pytestmark = pytest.mark.ray


def _model(hp):
    return torch.nn.Linear(4, 1)


def _broken_model(hp):
    raise RuntimeError("this model cannot be built")


def _data(hp):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)) for _ in range(4)]


def _loss(out, batch):
    return torch.nn.functional.mse_loss(out, batch[1])


def _opt(params, hp):
    return torch.optim.SGD(params, lr=hp["lr"])


def test_run_trains_and_marks_a_task_whose_model_cannot_be_built_failed(tmp_path):
    # Both start at once on the 2 logical GPUs; one failure gives the task up (max_failures=0). Moving a
    # failed task to its other configurations and giving up after max_failures is the fake driver's test.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    good = Task("good", _model, _data, _loss, _opt, {"lr": 0.1}, max_steps=30)
    bad = Task("bad", _broken_model, _data, _loss, _opt, {"lr": 0.1}, max_steps=30)
    profile = ProfileTable.from_rows(
        [{"task": t, "strategy": "single", "gpus": 1, "step_time_s": 0.08, "steps": 30} for t in ("good", "bad")]
    )
    cfg = DriverConfig(checkpoint_interval_s=0.5, solver_time_limit_s=1.0, max_failures=0, restart_s=5.0)
    with emulated_cluster(1, 2):
        result = ray_saturn.run(
            [good, bad], storage=tmp_path / "run", profile=profile, config=cfg, policy="saturn-replan"
        )
    assert result.state == "finished"
    assert result.tasks["good"].state == "finished" and result.tasks["good"].steps_done == 30
    assert result.tasks["bad"].state == "failed"
    assert "cannot be built" in result.tasks["bad"].reason
    assert strategies.latest_step(str(tmp_path / "run" / "tasks" / "good" / "checkpoints")) == 30


def test_a_finished_segments_workers_train_the_next_task_and_a_failure_there_is_that_tasks(tmp_path):
    # One GPU, three 1-GPU tasks: each one after the first runs on the workers of the one before (no new
    # trainer) unless that one failed. The task whose model cannot be built fails with its own reason,
    # wherever it runs, and the others train to their step counts.
    import json

    from ray_saturn.runtime.journal import EVENTS_FILE

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    tasks = [Task(n, _model, _data, _loss, _opt, {"lr": 0.1}, max_steps=30) for n in ("first", "second")]
    tasks.append(Task("bad", _broken_model, _data, _loss, _opt, {"lr": 0.1}, max_steps=30))
    profile = ProfileTable.from_rows(
        [{"task": t.name, "strategy": "single", "gpus": 1, "step_time_s": 0.08, "steps": 30, "startup_s": 10.0}
         for t in tasks]
    )
    cfg = DriverConfig(checkpoint_interval_s=0.5, solver_time_limit_s=1.0, max_failures=0, restart_s=5.0)
    with emulated_cluster(1, 1):
        result = ray_saturn.run(tasks, storage=tmp_path / "run", profile=profile, config=cfg)
    assert result.state == "finished"
    for name in ("first", "second"):
        assert result.tasks[name].state == "finished" and result.tasks[name].steps_done == 30
        assert strategies.latest_step(str(tmp_path / "run" / "tasks" / name / "checkpoints")) == 30
    assert result.tasks["bad"].state == "failed" and "cannot be built" in result.tasks["bad"].reason
    events = [json.loads(line) for line in (tmp_path / "run" / EVENTS_FILE).read_text().splitlines()]
    launches = [e for e in events if e["kind"] == "launch"]
    assert len(launches) == 3 and any(e.get("reused_workers") for e in launches)
    started = {e["task"]: e["launch_latency_s"] for e in events if e["kind"] == "started"}
    for e in launches:
        if e.get("reused_workers") and e["task"] in started:
            assert started[e["task"]] < 5.0, "a reused launch starts without a new trainer"
