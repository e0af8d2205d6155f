"""Workload files: their own model classes, data functions and losses reach the Ray workers.

These tests check the errors and that a task defined in a workload file
unpickles in a fresh interpreter that cannot import the file (what a Ray worker
is). tests/test_job_submit.py runs `ray-saturn run WORKLOAD.py` through the CLI
against a separate Ray head, profiling included (it shares that module's head).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ray_saturn.errors import SpecError
from ray_saturn.workload_file import load_workload, workload_digest

BIN = Path(sys.executable).parent

WORKLOAD = textwrap.dedent(
    '''
    """A workload with its own model class, data function and loss (nothing importable on the workers)."""
    import torch
    from ray_saturn import Task
    from helper_blocks import Scale  # a helper module beside the workload file


    class TwoLayer(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.inp = torch.nn.Linear(4, width)
            self.out = torch.nn.Linear(width, 1)
            self.scale = Scale(0.5)

        def forward(self, x):
            return self.out(self.scale(torch.tanh(self.inp(x))))


    def make_data(hp):
        g = torch.Generator().manual_seed(int(hp["seed"]))
        return [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)) for _ in range(4)]


    def my_loss(out, batch):
        return ((out - batch[1]) ** 2).mean()


    def sgd(params, hp):
        return torch.optim.SGD(params, lr=hp["lr"])


    tasks = [
        Task(f"own-{w}", lambda hp: TwoLayer(hp["width"]), make_data, my_loss, sgd,
             {"width": w, "lr": 0.05, "seed": 1}, max_steps=12, strategies=("single",))
        for w in (8,)
    ]
    '''
)

HELPER = textwrap.dedent(
    """
    import torch


    class Scale(torch.nn.Module):
        def __init__(self, factor):
            super().__init__()
            self.factor = factor

        def forward(self, x):
            return x * self.factor
    """
)


def write_workload(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "helper_blocks.py").write_text(HELPER)
    path = folder / "sweep.py"
    path.write_text(WORKLOAD)
    return path


def test_tasks_of_a_workload_file_unpickle_where_the_file_cannot_be_imported(tmp_path):
    import ray.cloudpickle as cloudpickle

    (task,) = load_workload(write_workload(tmp_path / "wl"))
    blob = tmp_path / "task.pkl"
    blob.write_bytes(cloudpickle.dumps(task))
    # A fresh interpreter in another folder, like a Ray worker: neither sweep.py nor helper_blocks.py is importable.
    probe = textwrap.dedent(
        f"""
        import pickle, sys
        task = pickle.loads(open({str(blob)!r}, "rb").read())
        model = task.model(task.hparams)
        batch = list(task.data(task.hparams))[0]
        print(type(model).__name__, float(task.loss(model(batch[0]), batch)) >= 0)
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["TwoLayer", "True"]


@pytest.mark.parametrize(
    "body, message",
    [
        (None, "no such workload file"),
        ("import nosuchmodule_xyz\n", "the workload failed to load (ModuleNotFoundError"),
        ("def broken(:\n", "the workload failed to load (SyntaxError"),
        ("x = 1\n", "define a module-level `tasks`"),
        ("tasks = 3\n", "`tasks` is a int"),
        ("def tasks():\n    raise ValueError('no GPUs for this grid')\n", "tasks() raised ValueError: no GPUs"),
        ("tasks = []\n", "no tasks given"),
        ("import sys\nsys.exit(0)\n", "the workload called sys.exit(0) while it loaded"),
        ("raise SystemExit('bye')\n", "the workload called sys.exit('bye') while it loaded"),
        ("import sys\ndef tasks():\n    sys.exit(3)\n", "the workload called sys.exit(3) in tasks()"),
    ],
)
def test_bad_workload_files_give_one_line(tmp_path, body, message):
    path = tmp_path / "w.py"
    if body is not None:
        path.write_text(body)
    with pytest.raises(SpecError) as info:
        load_workload(path)
    text = str(info.value)
    assert message in text and "\n" not in text and str(path) in text


def test_digest_names_the_bytes(tmp_path):
    path = write_workload(tmp_path / "wl")
    first = workload_digest(path)
    assert first.startswith("sha256:") and first == workload_digest(path)
    path.write_text(WORKLOAD + "\n# changed\n")
    assert workload_digest(path) != first


@pytest.mark.parametrize("body", [
    "import ray\nray.init()\nfrom ray_saturn.toy import mlp_task\ntasks = [mlp_task('m')]\n",
    "import ray\nfrom ray_saturn.toy import mlp_task\n"
    "def tasks():\n    ray.init(num_gpus=2)\n    return [mlp_task('m')]\n",
])
def test_a_workload_that_starts_ray_is_one_line_and_its_ray_shut_down(tmp_path, monkeypatch, body):
    # A workload written after the README's Python example (ray.init() first) started a local Ray in the CLI's
    # process: `run --num-gpus 2` then said "Ray is already initialised in this process", and without
    # --num-gpus the run joined that Ray (no GPUs on a CPU machine: "the Ray cluster has no node with a GPU").
    import ray

    up = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: up.append(True))
    monkeypatch.setattr(ray, "is_initialized", lambda: bool(up))
    monkeypatch.setattr(ray, "shutdown", lambda: up.clear())
    path = tmp_path / "w.py"
    path.write_text(body)
    with pytest.raises(SpecError) as info:
        load_workload(path)
    text = str(info.value)
    assert text.startswith(f"{path}: the workload called ray.init(); a workload file defines `tasks` only"), text
    assert "\n" not in text and not up, "the Ray the workload started is shut down"


def test_a_workload_loaded_where_ray_already_runs_is_loaded(tmp_path, monkeypatch):
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # the caller's own Ray (a notebook, a Ray job)
    path = tmp_path / "w.py"
    path.write_text("import ray\nray.init(ignore_reinit_error=True) if not ray.is_initialized() else None\n"
                    "from ray_saturn.toy import mlp_task\ntasks = [mlp_task('m')]\n")
    assert [t.name for t in load_workload(path)] == ["m"]


def test_the_readmes_workload_file_loads_and_its_tasks_train(tmp_path):
    """The README's example workload file, as written: four tasks whose own model class trains."""
    import re

    import torch

    from ray_saturn.strategies.introspect import check_trainable

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("**A workload file**"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert code.startswith("# sweep.py")
    (tmp_path / "sweep.py").write_text(code)
    tasks = load_workload(tmp_path / "sweep.py")
    assert sorted(t.name for t in tasks) == ["reg-w32-lr0.001", "reg-w32-lr0.01", "reg-w64-lr0.001", "reg-w64-lr0.01"]
    for task in tasks:
        check_trainable(task)
        model = task.model(task.hparams)
        opt = task.optimizer(model.parameters(), task.hparams)
        batches = list(task.data(task.hparams))
        again = list(task.data(task.hparams))  # deterministic given hparams, as the README says
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches, again, strict=True))
        losses = []
        for batch in batches * 3:
            loss = task.loss(model(batch[0]), batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < losses[0], (task.name, losses[0], losses[-1])
