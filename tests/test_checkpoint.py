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

from ray_saturn.runtime.storage import StorageError
from ray_saturn.strategies import WorkerContext, get_strategy, train_worker
from ray_saturn.strategies.checkpoint import (
    CheckpointError,
    checkpoint_path,
    latest_checkpoint,
    latest_step,
    load_checkpoint,
    save_checkpoint,
)
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


def _runner(task):
    """The task's model and optimizer as one process's single strategy prepares them."""
    return get_strategy("single").prepare(build_model(task), task, {}, WorkerContext(0, 1, torch.device("cpu")))


class _RunsCode:
    """A pickle that touches ``target`` when it is loaded: a stand-in for any code a crafted file could run."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def state(task, d):
    runner = _runner(task)
    load_checkpoint(latest_checkpoint(d), runner.module, runner.optimizer, d)
    return runner.module.state_dict(), runner.optimizer.state_dict()


CRASH = {
    # dies after the tensors are written, before the record and the rename
    "before-commit": "ray_saturn.strategies.checkpoint.RunStorage.write_json = lambda *a, **k: os._exit(3)",
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
        import ray_saturn.strategies.checkpoint
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
    assert (d / "step-000000006").exists() and not (d / "step-000000006" / "meta.json").exists()  # uncommitted
    task = mlp_task(batches=3)
    resumed = losses_of(task, "single", d, 8)
    assert len(resumed) == 4
    ref_dir = tmp_path / "ref"
    ref = losses_of(task, "single", ref_dir, 8)
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(ref[4:]))
    a, b = state(task, d)[0], state(task, ref_dir)[0]
    for k in a:
        torch.testing.assert_close(a[k], b[k])

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

    path = Path(latest_checkpoint(tmp_path))
    (path / ".metadata").write_bytes(pickle.dumps(_RunsCode(target)))
    runner = _runner(task)
    with pytest.raises(CheckpointError, match="not allowed"):
        load_checkpoint(path, runner.module, runner.optimizer, tmp_path)
    assert latest_step(tmp_path) is None  # verification refuses it too: nothing to resume from
    assert not target.exists()


def test_paths_stay_inside_the_checkpoint_folder(tmp_path):
    inside, outside = tmp_path / "in", tmp_path / "out"
    task = mlp_task()
    losses_of(task, "single", outside, 2)
    inside.mkdir()
    os.symlink(outside / "step-000000002", inside / "step-000000009")
    assert latest_step(inside) is None  # a symlinked checkpoint is not followed
    runner = _runner(task)
    with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
        load_checkpoint(outside / "step-000000002", runner.module, runner.optimizer, inside)
    assert os.path.dirname(checkpoint_path(inside, 3)) == str(inside)


def test_links_inside_a_checkpoint_are_not_followed(tmp_path):
    """A shard or meta.json of a checkpoint linked to a file elsewhere was read through the link (the checkpoint
    counted as intact and loaded); re-writing a step whose folder is a link deleted <elsewhere>/meta.json."""
    task = mlp_task()
    d, outside = tmp_path / "ckpt", tmp_path / "outside"
    losses_of(task, "single", d, 2)
    outside.mkdir()
    newest = Path(latest_checkpoint(d))
    shard = _distcp(newest)
    shard.rename(outside / shard.name)
    shard.symlink_to(outside / shard.name)
    assert latest_step(d) is None  # not intact: nothing is read through the link
    runner = _runner(task)
    with pytest.raises(CheckpointError, match="symbolic link"):
        load_checkpoint(newest, runner.module, runner.optimizer, d)
    (outside / "meta.json").write_text("mine")
    os.symlink(outside, d / "step-000000004")
    with pytest.raises(StorageError, match="symbolic link"):
        save_checkpoint(d, runner.module, runner.optimizer, step=4, data_position=4, strategy="single", task="t")
    assert (outside / "meta.json").read_text() == "mine"
    assert sorted(p.name for p in outside.iterdir()) == sorted([shard.name, "meta.json"])


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


def _distcp(folder: Path) -> Path:
    (shard,) = [p for p in folder.iterdir() if p.suffix == ".distcp"]
    return shard


def test_truncated_newest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, caplog):
    # Issue 16: truncating the newest .distcp of a task lost the task (every attempt failed to load it).
    task = mlp_task(batches=3, optimizer="adam")
    d = tmp_path / "ckpt"
    losses_of(task, "single", d, 4, every=2)  # checkpoints at 2 and 4
    shard = _distcp(d / "step-000000004")
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with caplog.at_level("WARNING", logger="ray_saturn.strategies.checkpoint"):
        assert latest_step(d) == 2  # the progress a driver reports: only what an intact checkpoint holds
    assert any("step-000000004" in r.message and "truncated" in r.message for r in caplog.records)
    resumed = losses_of(task, "single", d, 6, every=2)  # resumes from step 2, does not fail
    assert len(resumed) == 4
    ref_dir = tmp_path / "ref"
    ref = losses_of(task, "single", ref_dir, 6, every=2)
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(ref[2:]))
    a, b = state(task, d), state(task, ref_dir)
    for k in a[0]:
        torch.testing.assert_close(a[0][k], b[0][k])
    torch.testing.assert_close(a[1]["state"][0]["exp_avg"], b[1]["state"][0]["exp_avg"])
    assert latest_step(d) == 6


@pytest.mark.parametrize("damage", ["missing-shard", "torn-metadata", "garbled-shard"])
def test_damaged_checkpoints_are_skipped_and_said_why(tmp_path, damage, caplog):
    task = mlp_task(batches=3)
    d = tmp_path / "ckpt"
    losses_of(task, "single", d, 4, every=2)
    newest = d / "step-000000004"
    if damage == "missing-shard":
        _distcp(newest).unlink()
    elif damage == "torn-metadata":
        meta = newest / ".metadata"
        meta.write_bytes(meta.read_bytes()[:40])
    else:  # same size, unreadable bytes: verification passes, reading the tensors fails
        shard = _distcp(newest)
        shard.write_bytes(b"\0" * shard.stat().st_size)
    with caplog.at_level("WARNING", logger="ray_saturn.strategies.checkpoint"):
        resumed = losses_of(task, "single", d, 6, every=2)
    assert len(resumed) == 4  # from step 2
    assert any("skipping checkpoint" in r.message and "step-000000004" in r.message for r in caplog.records)
    assert latest_step(d) == 6


def test_no_intact_checkpoint_starts_over_and_a_misfit_stays_an_error(tmp_path):
    task = mlp_task(batches=3)
    d = tmp_path / "ckpt"
    losses_of(task, "single", d, 2, every=2)
    shard = _distcp(d / "step-000000002")
    shard.write_bytes(b"")
    assert latest_step(d) is None
    assert len(losses_of(task, "single", d, 2, every=2)) == 2  # trained again from the start
    with pytest.raises(CheckpointError, match="does not fit"):  # a mismatch is not "corrupt": never skipped
        losses_of(mlp_task(width=64), "single", d, 4)
    assert latest_step(d) == 2


def _pickle4_call(module: str, name: str, arg: str) -> bytes:
    """A protocol-4 pickle that calls ``module``'s attribute ``name`` (dotted names resolve attribute by
    attribute) with one string argument."""
    def s(text: str) -> bytes:
        b = text.encode()
        return b"\x8c" + bytes([len(b)]) + b

    return b"\x80\x04" + s(module) + s(name) + b"\x93" + s(arg) + b"\x85R."


def test_metadata_with_a_dotted_name_cannot_reach_what_an_allowed_module_imported(tmp_path):
    # torch.distributed.checkpoint.filesystem imports os: "os.system" in it is os.system itself.
    task = mlp_task()
    losses_of(task, "single", tmp_path, 2)
    target = tmp_path / "pwned"
    path = Path(latest_checkpoint(tmp_path))
    (path / ".metadata").write_bytes(
        _pickle4_call("torch.distributed.checkpoint.filesystem", "os.system", f"touch {target}")
    )
    assert latest_step(tmp_path) is None  # verifying it (what progress and resume do) runs nothing
    runner = _runner(task)
    with pytest.raises(CheckpointError, match="not allowed"):
        load_checkpoint(path, runner.module, runner.optimizer, tmp_path)
    assert not target.exists()


def _with_pickled_entry(path: Path, fqn: str, payload: bytes) -> None:
    """Rewrite the checkpoint at ``path`` so that ``fqn`` is a non-tensor (pickled) entry holding ``payload``."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    md = pickle.loads((path / ".metadata").read_bytes())
    (path / "extra.distcp").write_bytes(payload)
    md.state_dict_metadata[fqn] = BytesStorageMetadata()
    md.storage_data[MetadataIndex(fqn)] = _StorageInfo("extra.distcp", 0, len(payload))
    (path / ".metadata").write_bytes(pickle.dumps(md))


def test_a_non_tensor_entry_in_a_checkpoint_is_never_unpickled(tmp_path, monkeypatch):
    # DCP loads a non-tensor entry with torch.load(weights_only=False): a pickle that runs code.
    from ray_saturn.strategies import checkpoint as ckpt

    task = mlp_task()
    losses_of(task, "single", tmp_path, 2)
    target = tmp_path / "pwned"

    path = Path(latest_checkpoint(tmp_path))
    runner = _runner(task)
    fqn = next(iter(runner.module.state_dict()))
    _with_pickled_entry(path, f"model.{fqn}", pickle.dumps(_RunsCode(target)))
    assert latest_step(tmp_path) is None  # verification refuses the entry's class
    assert ckpt.load_latest(tmp_path, runner.module, runner.optimizer) is None
    # and loading itself refuses the entry, should the metadata get past verification
    monkeypatch.setitem(ckpt._SAFE_CLASSES, "torch.distributed.checkpoint.metadata",
                        ckpt._SAFE_CLASSES["torch.distributed.checkpoint.metadata"] | {"BytesStorageMetadata"})
    with pytest.raises(CheckpointError):
        load_checkpoint(path, runner.module, runner.optimizer, tmp_path)
    assert not target.exists()
