"""What a new user's own workload file, profile and run folder meet in `run`, `emulate`, `status`, `resume`
and `simulate`: unusual but plausible input is one line (exit 2) or runs as asked, never a traceback, a
silent wrong result or a lost checkpoint. None of these tests starts Ray.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import ray_saturn
from ray_saturn.cli import main
from ray_saturn.errors import SpecError
from ray_saturn.profile_table import ProfileTable
from ray_saturn.runtime.journal import RUN_FILE
from ray_saturn.runtime.storage import StorageError
from ray_saturn.toy import mlp_task

WORKLOAD = "from ray_saturn.toy import mlp_task\ntasks = [mlp_task('m', max_steps=20)]\n"
PROFILE = "task,strategy,gpus,step_time_s,steps\nm,single,1,0.01,20\n"


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("left", ["tasks/m/checkpoints/step-10/meta.json", "plan.json"])
@pytest.mark.parametrize("command", ["run", "emulate"])
def test_a_folder_with_an_earlier_runs_checkpoints_but_no_run_is_refused(tmp_path, capsys, no_ray, left, command):
    # The run's own files were removed (or the folder is the user's own), but tasks/<task>/checkpoints is still
    # there: a new run would have started task m at step 10 of the old weights and said "finished".
    (tmp_path / "w.py").write_text(WORKLOAD)
    (tmp_path / "p.csv").write_text(PROFILE)
    run = tmp_path / "run"
    (run / left).parent.mkdir(parents=True)
    (run / left).write_text("{}")
    args = (["run", str(tmp_path / "w.py"), "--profile", str(tmp_path / "p.csv")] if command == "run" else
            ["emulate", str(tmp_path / "p.csv"), "--nodes", "1", "--gpus-per-node", "1", "--time-scale", "0.01"])
    assert main([*args, "--storage", str(run)]) == 2
    err = one_line(capsys)
    held = "tasks/ (m)" if left.startswith("tasks") else "plan.json"
    assert f"{run} holds {held} but no run to resume (no run.json)" in err, err
    assert "give a new or empty folder, or move them away" in err
    assert sorted(p.name for p in run.iterdir()) == [left.split("/")[0]], "nothing was written to the folder"


def test_the_python_api_refuses_such_a_folder_too(tmp_path, no_ray):
    run = tmp_path / "run"
    (run / "tasks" / "m" / "checkpoints").mkdir(parents=True)
    with pytest.raises(StorageError, match=r"holds tasks/ \(m\) but no run to resume"):
        ray_saturn.run([mlp_task("m", max_steps=20)], storage=run, profile=ProfileTable.from_rows(
            [{"task": "m", "strategy": "single", "gpus": 1, "step_time_s": 0.01, "steps": 20}]))
    assert not (run / RUN_FILE).exists()


def test_ctrl_c_during_a_run_stops_its_driver_and_says_how_to_resume(tmp_path, capsys, monkeypatch):
    # Ctrl-C while `emulate` (or `run`, `resume`) waits for its driver: it said only "interrupted", and a
    # Python caller's driver (a notebook's interrupt) went on training after its folder's lock was released.
    import contextlib

    import ray

    from ray_saturn.runtime import emulation
    from ray_saturn.runtime.journal import Journal
    from ray_saturn.runtime.storage import RunStorage

    killed = []
    monkeypatch.setattr(emulation, "emulated_cluster", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(emulation, "reclaim_dead_runs", lambda *a, **k: None)
    monkeypatch.setattr(emulation, "start_driver", lambda *a, **k: ("driver", "result"))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ray, "wait", interrupted)
    monkeypatch.setattr(ray, "kill", lambda actor, **kw: killed.append(actor))
    (tmp_path / "p.csv").write_text(PROFILE)
    run = tmp_path / "run"
    code = main(["emulate", str(tmp_path / "p.csv"), "--nodes", "1", "--gpus-per-node", "1", "--time-scale", "0.01",
                 "--storage", str(run)])
    err = one_line(capsys)
    assert code == 130
    assert f"ray-saturn emulate: interrupted; {run} keeps what the run did (finished tasks, checkpoints): " \
           f"`ray-saturn resume {run}` continues it" in err, err
    assert killed == ["driver"]
    events = Journal(RunStorage(run, create=False)).events()
    assert events[-1]["kind"] == "interrupted" and events[-1]["wall"] > 0
    assert not (run / "lease.json").exists(), "the folder's lock is released for resume"


def test_ctrl_c_before_the_driver_starts_says_what_the_folder_holds(tmp_path, capsys, monkeypatch):
    # Ctrl-C while `run` joined Ray or profiled, while `emulate` started its cluster, or while `resume` started
    # the driver: each said only "interrupted", with no word of whether anything was written or how to go on.
    import contextlib

    from ray_saturn import profiler
    from ray_saturn.runtime import api, emulation
    from ray_saturn.spec import ClusterSpec

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "connected", contextlib.nullcontext)
    monkeypatch.setattr(ClusterSpec, "from_ray", classmethod(lambda cls, *a, **k: ClusterSpec.uniform(1, 1)))
    monkeypatch.setattr(profiler, "profile", interrupted)
    (tmp_path / "w.py").write_text(WORKLOAD)
    (tmp_path / "p.csv").write_text(PROFILE)
    run = tmp_path / "run"
    assert main(["run", str(tmp_path / "w.py"), "--storage", str(run)]) == 130
    err = one_line(capsys)
    assert f"ray-saturn run: interrupted before the run started; nothing was written to {run}: " \
           "run `ray-saturn run` again to start it" in err, err
    assert not (run / RUN_FILE).exists() and not (run / "lease.json").exists()

    monkeypatch.setattr(emulation, "emulated_cluster", interrupted)  # Ray's local cluster starting
    emulate = ["emulate", str(tmp_path / "p.csv"), "--nodes", "1", "--gpus-per-node", "1", "--time-scale", "0.01"]
    assert main([*emulate, "--storage", str(run)]) == 130
    err = one_line(capsys)
    assert f"ray-saturn emulate: interrupted before the run's driver started; nothing was trained yet: " \
           f"`ray-saturn resume {run}` starts it" in err, err
    assert (run / RUN_FILE).exists() and not (run / "lease.json").exists()

    monkeypatch.setattr(api, "emulated_context", interrupted)
    assert main(["resume", str(run)]) == 130
    err = one_line(capsys)
    assert f"ray-saturn resume: interrupted before the run went on; {run} keeps what it did: " \
           f"`ray-saturn resume {run}` continues it" in err, err
    assert not (run / "lease.json").exists()


class _Frozen(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 1).requires_grad_(False)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        return self.lin(x)


@pytest.mark.parametrize("model, message", [
    (lambda hp: torch.nn.Identity(), "task 'm': its model (Identity) has no parameters, so there is nothing to train"),
    (lambda hp: _Frozen(), "every parameter of its model (_Frozen, 2 tensors) is frozen (requires_grad=False)"),
    (lambda hp: "not a model", "task 'm': model factory returned str, not a torch.nn.Module"),
])
def test_a_task_with_nothing_to_train_is_refused_before_ray_starts(tmp_path, no_ray, model, message):
    # Every attempt failed on the workers (the optimizer's 'empty parameter list', backward's 'does not require
    # grad'), each after a trainer's start, max_failures + 1 times; profiling called the task infeasible.
    task = dataclasses.replace(mlp_task("m", max_steps=20), model=model)
    seed = torch.initial_seed()
    with pytest.raises(SpecError) as info:
        ray_saturn.run([task], storage=tmp_path / "run", profile=ProfileTable.from_rows(
            [{"task": "m", "strategy": "single", "gpus": 1, "step_time_s": 0.01, "steps": 20}]))
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "run").exists() and torch.initial_seed() == seed


def test_a_partly_frozen_model_or_one_the_meta_device_cannot_build_passes_the_check():
    from ray_saturn.strategies.introspect import check_trainable

    def numpy_init(hp):
        import numpy as np

        lin = torch.nn.Linear(2, 1)
        lin.weight.data = torch.from_numpy(np.ones((1, 2), dtype="float32"))  # fails on meta: left to the workers
        return lin

    partly = torch.nn.Sequential(torch.nn.Linear(2, 2).requires_grad_(False), torch.nn.Linear(2, 1))
    for model in (lambda hp: partly, numpy_init):
        check_trainable(dataclasses.replace(mlp_task("m"), model=model))


def _train_folder(tmp_path, workload):
    from ray_saturn.runtime.config import RunSettings
    from ray_saturn.runtime.journal import Journal
    from ray_saturn.runtime.storage import RunStorage
    from ray_saturn.workload_file import workload_digest

    store = RunStorage(tmp_path / "run")
    store.write_json(RUN_FILE, RunSettings(name="r", mode="train", workload=str(workload),
                                           workload_digest=workload_digest(workload)).to_dict())
    Journal(store).write_profile(ProfileTable.from_rows(
        [{"task": "m", "strategy": "single", "gpus": 1, "step_time_s": 0.01, "steps": 20}]))
    return store


@pytest.mark.parametrize("edited, message", [
    ("tasks = [mlp_task('m', max_steps=40)]\n",
     "row 1 (task 'm', single on 1 GPU(s)): steps is 20, but the workload trains 'm' for 40 steps"),
    ("tasks = [mlp_task('renamed', max_steps=20)]\n", "the profile has no rows for task(s) renamed"),
])
def test_resume_with_a_workload_that_is_not_the_runs_is_one_line_and_records_nothing(tmp_path, capsys, no_ray,
                                                                                     edited, message):
    # `resume DIR --workload FILE` with an edited file: a task renamed reached the driver ("not in the workload
    # given to the runtime", after the cluster started); more max_steps trained the run's 20 and said finished.
    wl = tmp_path / "w.py"
    wl.write_text(WORKLOAD)
    store = _train_folder(tmp_path, wl)
    before = store.read_json(RUN_FILE)
    edited_file = tmp_path / "edited.py"
    edited_file.write_text("from ray_saturn.toy import mlp_task\n" + edited)
    assert main(["resume", str(tmp_path / "run"), "--workload", str(edited_file)]) == 2
    err = one_line(capsys)
    assert message in err and "; a resumed run trains the tasks it started with, as its profile says: pass the " \
        "workload it started with (or start a new run)" in err, err
    assert store.read_json(RUN_FILE) == before, "the refused file is not recorded as the run's workload"
    assert not (tmp_path / "run" / "lease.json").exists()
    with pytest.raises(SpecError, match=r"no rows for task\(s\) extra; a resumed run trains the tasks it started"):
        ray_saturn.resume(tmp_path / "run", tasks=[mlp_task("m", max_steps=20), mlp_task("extra", max_steps=20)])


class _LiveDriver:
    """A live driver actor as `ray.get_actor` returns it, answering which folder it writes to."""

    def __init__(self, folder):
        self.folder = type("M", (), {"remote": staticmethod(lambda: folder)})()


def test_resume_does_not_end_a_live_run_of_the_same_name_in_another_folder(tmp_path, monkeypatch):
    # `resume` ended whichever live driver had the run's name, without asking which folder it wrote to: two
    # folders whose runs were given one name (the Python API's name=), or a run.json edited to another run's
    # name, made resume kill that other run.
    import ray

    from ray_saturn.errors import SaturnError
    from ray_saturn.runtime.actor import end_orphaned_driver
    from ray_saturn.runtime.storage import RunStorage

    killed = []
    other = str(tmp_path / "other")
    monkeypatch.setattr(ray, "get_actor", lambda name, namespace=None: _LiveDriver(other))
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)
    monkeypatch.setattr(ray, "kill", lambda actor, **kw: killed.append(actor))
    ours = RunStorage(tmp_path / "ours")
    with pytest.raises(SaturnError) as info:
        end_orphaned_driver("sweep", ours)
    msg = str(info.value)
    assert "\n" not in msg and f"a live run named 'sweep' on this Ray cluster writes to {other}" in msg, msg
    assert f"resume {ours.display} once that run has ended" in msg and not killed

    # Its own orphan (the driver of the CLI killed a moment ago) is still ended, answering or not.
    gone = []

    def get_actor(name, namespace=None):
        if killed:
            gone.append(name)
            raise ValueError("no such actor")
        return _LiveDriver(str(tmp_path / "." / "ours"))  # the same folder, spelled otherwise

    monkeypatch.setattr(ray, "get_actor", get_actor)
    assert end_orphaned_driver("sweep", ours) is True and len(killed) == 1 and gone


def test_a_second_run_of_a_name_that_runs_is_one_line(monkeypatch):
    # Two runs given one name on one cluster: Ray's ActorAlreadyExistsError came out as a traceback.
    from ray.exceptions import ActorAlreadyExistsError

    from ray_saturn.errors import SaturnError
    from ray_saturn.runtime import actor
    from ray_saturn.runtime.config import RunSettings

    class Taken:
        def options(self, **kw):
            raise ActorAlreadyExistsError(f"The name {kw['name']} (namespace=ray_saturn) is already taken. Please ...")

    monkeypatch.setattr(actor, "DriverActor", Taken)
    monkeypatch.setattr(actor, "on_head_node", lambda: None)
    settings = RunSettings(name="sweep", mode="train")
    with pytest.raises(SaturnError) as info:
        actor.start_driver(None, settings, None)
    assert str(info.value) == ("a run named 'sweep' is already running on this Ray cluster; give this run another "
                               "name (runs on one cluster need distinct names)")
