"""Tasks trained for real: ``ray_saturn.run`` with TorchTrainer segments on logical GPUs.

One trainer start costs 10-20 s here, so this is one
short run: a task that trains to its step count, and a task whose model
cannot be built, which is marked failed with the reason while the other
finishes.
"""

from __future__ import annotations

import contextlib
import sys

import pytest
import ray
import torch

import ray_saturn
from ray_saturn import ProfileTable, Task, strategies
from ray_saturn.runtime.api import emulated_cluster
from ray_saturn.runtime.driver import DriverConfig

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def emulated():
    """``emulated(nodes, gpus)``: an emulated cluster of that shape, kept for the module's next test that
    asks the same shape (the two tests on one GPU share one Ray start); another shape replaces it."""
    stack = contextlib.ExitStack()
    shape: list[tuple[int, int]] = []

    def start(nodes: int, gpus: int) -> None:
        if shape != [(nodes, gpus)]:
            stack.close()
            shape.clear()
            stack.enter_context(emulated_cluster(nodes, gpus))
            shape.append((nodes, gpus))

    with stack:
        yield start


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


def test_run_trains_and_marks_a_task_whose_model_cannot_be_built_failed(emulated, tmp_path):
    # Both start at once on the 2 logical GPUs; one failure gives the task up (max_failures=0). Moving a
    # failed task to its other configurations and giving up after max_failures is the fake driver's test.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    good = Task("good", _model, _data, _loss, _opt, {"lr": 0.1}, max_steps=30)
    bad = Task("bad", _broken_model, _data, _loss, _opt, {"lr": 0.1}, max_steps=30)
    profile = ProfileTable.from_rows(
        [{"task": t, "strategy": "single", "gpus": 1, "step_time_s": 0.08, "steps": 30} for t in ("good", "bad")]
    )
    cfg = DriverConfig(checkpoint_interval_s=0.5, solver_time_limit_s=1.0, max_failures=0, restart_s=5.0)
    emulated(1, 2)
    result = ray_saturn.run([good, bad], storage=tmp_path / "run", profile=profile, config=cfg, policy="saturn-replan")
    assert result.state == "finished"
    assert result.tasks["good"].state == "finished" and result.tasks["good"].steps_done == 30
    assert result.tasks["bad"].state == "failed"
    assert "cannot be built" in result.tasks["bad"].reason
    assert strategies.latest_step(str(tmp_path / "run" / "tasks" / "good" / "checkpoints")) == 30


def test_a_finished_segments_workers_train_the_next_task_and_a_failure_there_is_that_tasks(emulated, tmp_path):
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
    emulated(1, 1)
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


def test_a_segment_on_reused_workers_stops_at_a_checkpoint_when_the_driver_moves_it(emulated, tmp_path):
    # The launcher as the driver uses it: a's workers park after its last step, b claims them, and a
    # move's stop ends b at a checkpoint, named as b's; the workers end with it.
    import time

    from ray_saturn import ClusterSpec
    from ray_saturn.runtime.launcher import Exited, LaunchSpec, Started
    from ray_saturn.runtime.pg_manager import PlacementGroupManager
    from ray_saturn.runtime.storage import RunStorage
    from ray_saturn.runtime.train_launcher import TrainLauncher

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    emulated(1, 1)
    cluster = ClusterSpec.from_ray()
    node = cluster.nodes[0].name
    mgr = PlacementGroupManager(cluster)
    storage = RunStorage(tmp_path / "run")
    tasks = {n: Task(n, _model, _data, _loss, _opt, {"lr": 0.1}, max_steps=100_000) for n in ("a", "b")}
    launcher = TrainLauncher(mgr, storage, tasks, backend="gloo", report_interval_s=0.1)

    def spec(name, target):
        return LaunchSpec(name, 0, "single", 1, (node,), target, storage.task_dir(name), 5)

    def wait_for(kind, task, deadline_s=240.0):
        t0 = time.monotonic()
        while time.monotonic() - t0 < deadline_s:
            for ev in launcher.poll(0.5):
                if isinstance(ev, kind) and ev.task == task:
                    return ev
        raise AssertionError(f"no {kind.__name__} of {task} within {deadline_s} s")

    try:
        mgr.reserve("a", (node,), 1)
        assert mgr.wait_ready("a", 60)
        launcher.launch(spec("a", 10))
        done = wait_for(Exited, "a")
        assert (done.status, done.step) == ("finished", 10)
        mgr.release("a")
        assert launcher.claim_parked("b", (node,), 1)
        mgr.reserve("b", (node,), 1, hold=False)
        assert mgr.is_ready("b")
        launcher.launch(spec("b", 100_000))
        wait_for(Started, "b", 60.0)
        launcher.stop("b")
        stopped = wait_for(Exited, "b")
        assert stopped.status == "stopped" and 0 < stopped.step < 100_000 and stopped.step % 5 == 0
        assert strategies.latest_step(str(tmp_path / "run" / "tasks" / "b" / "checkpoints")) == stopped.step
        assert not launcher._groups and not launcher.claim_parked("a", (node,), 1)
    finally:
        launcher.shutdown()
        mgr.release_all()
