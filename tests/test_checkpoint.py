"""Checkpoints: atomic writes, safe loading, paths kept inside the folder, exact resume."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ray_saturn.checkpoint import (
    CheckpointError,
    checkpoint_path,
    latest_checkpoint,
    latest_step,
    load_checkpoint,
    save_checkpoint,
)
from ray_saturn.strategies import WorkerContext, get_strategy, train_worker
from ray_saturn.strategies.introspect import build_model
from ray_saturn.toy import mlp_task

ROOT = str(Path(__file__).resolve().parents[1])


def losses_of(task, strategy, d, target, every=2, knobs=None):
    out: list[float] = []
    train_worker(
        task,
        strategy,
        knobs or {},
        target_step=target,
        checkpoint_dir=str(d),
        checkpoint_every=every,
        report=lambda r: out.append(r["loss"]),
    )
    return out


def state(task, d):
    runner = get_strategy("single").prepare(build_model(task), task, {}, WorkerContext(0, 1, torch.device("cpu")))
    load_checkpoint(latest_checkpoint(d), runner.module, runner.optimizer, d)
    return runner.module.state_dict(), runner.optimizer.state_dict()


CRASH = {
    # dies after the tensors are written, before the record and the rename
    "before-commit": "ray_saturn.checkpoint.json.dump = lambda *a, **k: os._exit(3)",
    # dies in the middle of DCP writing the tensor files
    "mid-tensors": (
        "import torch.distributed.checkpoint as dcp\ndcp.FileSystemWriter.write_data = lambda *a, **k: os._exit(3)"
    ),
}


@pytest.mark.parametrize("where", list(CRASH))
def test_crash_mid_write_keeps_the_previous_checkpoint(tmp_path, where):
    d = tmp_path / "ckpt"
    script = (
        textwrap.dedent(f"""
        import os, sys
        import ray_saturn.checkpoint
        from ray_saturn.strategies import train_worker
        from ray_saturn.toy import mlp_task
        t = mlp_task(batches=3)
        train_worker(t, "single", {{}}, target_step=4, checkpoint_dir={str(d)!r},
                     checkpoint_every=2,
                     report=lambda r: None)
    """)
        + CRASH[where]
        + textwrap.dedent(f"""
        train_worker(t, "single", {{}}, target_step=6, checkpoint_dir={str(d)!r},
                     checkpoint_every=2,
                     report=lambda r: None)
        sys.exit(0)
    """)
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert latest_step(d) == 4
    assert (d / ".tmp-step-000000006").exists()  # the interrupted write is there, uncommitted
    task = mlp_task(batches=3)
    resumed = losses_of(task, "single", d, 8)
    assert len(resumed) == 4
    ref_dir = tmp_path / "ref"
    ref = losses_of(task, "single", ref_dir, 8)
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(ref[4:]))
    a, b = state(task, d)[0], state(task, ref_dir)[0]
    for k in a:
        torch.testing.assert_close(a[k], b[k])
    assert not (d / ".tmp-step-000000006").exists()  # leftovers are cleaned by the next commit
    assert sorted(p.name for p in d.iterdir()) == ["step-000000006", "step-000000008"]  # keep=2


def test_resume_restores_optimizer_state_and_data_position(tmp_path):
    task = mlp_task(batches=3, optimizer="adam")
    first = losses_of(task, "single", tmp_path / "a", 5, every=5)
    rest = losses_of(task, "spill", tmp_path / "a", 11, every=3)
    ref = losses_of(task, "single", tmp_path / "b", 11, every=11)
    torch.testing.assert_close(torch.tensor(first + rest), torch.tensor(ref))
    opt_a, opt_b = state(task, tmp_path / "a")[1], state(task, tmp_path / "b")[1]
    assert opt_a["state"][0]["step"] == opt_b["state"][0]["step"] == 11
    torch.testing.assert_close(opt_a["state"][0]["exp_avg"], opt_b["state"][0]["exp_avg"])


def test_metadata_with_foreign_pickle_is_refused(tmp_path):
    task = mlp_task()
    losses_of(task, "single", tmp_path, 2)
    target = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {target}",))

    (latest_checkpoint(tmp_path) / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(CheckpointError, match="not allowed"):
        state(task, tmp_path)
    assert not target.exists()


def test_paths_stay_inside_the_checkpoint_folder(tmp_path):
    inside, outside = tmp_path / "in", tmp_path / "out"
    task = mlp_task()
    losses_of(task, "single", outside, 2)
    inside.mkdir()
    os.symlink(outside / "step-000000002", inside / "step-000000009")
    assert latest_step(inside) is None  # a symlinked checkpoint is not followed
    runner = get_strategy("single").prepare(build_model(task), task, {}, WorkerContext(0, 1, torch.device("cpu")))
    with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
        load_checkpoint(outside / "step-000000002", runner.module, runner.optimizer, inside)
    assert checkpoint_path(inside, 3).parent == inside.resolve()


def test_checkpoint_of_another_model_is_a_clear_error(tmp_path):
    losses_of(mlp_task(width=32), "single", tmp_path, 2)
    with pytest.raises(CheckpointError, match="does not fit"):
        losses_of(mlp_task(width=64), "single", tmp_path, 4)


def test_incomplete_folder_is_not_a_checkpoint(tmp_path):
    (tmp_path / "step-000000005").mkdir()
    assert latest_step(tmp_path) is None
    m = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(tmp_path / "step-000000005", m, opt)
    save_checkpoint(tmp_path, m, opt, step=5, data_position=5, strategy="single", task="t")
    assert latest_step(tmp_path) == 5  # re-writing a step replaces it
