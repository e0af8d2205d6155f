"""A run whose only shared storage is S3 (moto on 127.0.0.1), on nodes that share no folder.

One run through the CLI, on a two-node ``ray.cluster_utils.Cluster`` (a head
without GPUs, one GPU node), every node told its own scratch folder
(``TMPDIR``). Both nodes see the run only through ``s3://``:

1. ``ray-saturn run WORKLOAD --storage s3://...`` trains; its short task finishes;
2. the driver (the CLI process, and with it the driver actor and its
   trainers) is killed while the long task is mid-way;
3. ``ray-saturn status s3://...`` tells what the bucket holds;
4. the GPU node is removed, its scratch folder deleted, and another node
   (with another scratch folder) added: the long task must move there;
5. ``ray-saturn resume s3://...`` finishes: the finished task is not run
   again, the long one continues from its checkpoint on the new node,
   losing at most one checkpoint interval; the newest checkpoint of the long
   task is truncated first (issue 16), so it also falls back to the older one;
6. nothing of the run is written to the head's (or any node's) local folders.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import ray
from s3_server import s3  # noqa: F401  (the fixture)

from ray_saturn.runtime.journal import STATE_FILE
from ray_saturn.runtime.storage import CHECKPOINTS_DIR, TASKS_DIR, RunStorage
from ray_saturn.strategies.checkpoint import latest_step

pytestmark = pytest.mark.ray

BIN = Path(sys.executable).parent
STEP_S = 0.1  # each step sleeps this long, so the kill lands mid-task
EVERY = 10  # checkpoint interval in steps: --checkpoint-interval 1.0 / step time 0.1
LONG = 120

WORKLOAD = textwrap.dedent(
    """
    import time
    import torch
    from ray_saturn import Task

    def model(hp):
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def data(hp):
        g = torch.Generator().manual_seed(0)
        return [(torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)) for _ in range(5)]

    def loss(out, batch):
        time.sleep(STEP_S)
        return torch.nn.functional.mse_loss(out, batch[1])

    def opt(params, hp):
        return torch.optim.Adam(params, lr=1e-2)

    tasks = [Task("short", model, data, loss, opt, max_steps=20), Task("long", model, data, loss, opt, max_steps=LONG)]
    """
).replace("STEP_S", str(STEP_S)).replace("LONG", str(LONG))


def _scratch(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def _run_files(root: Path) -> list[str]:
    """Anything under ``root`` that looks like a file of a run folder or a checkpoint."""
    names = {STATE_FILE, "events.jsonl", "run.json", "plan.json", ".metadata"}
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for n in filenames + dirnames:
            if n in names or n.endswith(".distcp") or n.startswith("step-") or n.startswith("s3:"):
                out.append(os.path.join(dirpath, n))
    return out


def _ours_running(scratch: Path) -> list[str]:
    """The processes of the killed run (driver actor, Train controller or workers) that still run: Ray
    workers of this test's cluster (their ``TMPDIR`` is under ``scratch``), not of an earlier test's."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        title = " ".join(p.info["cmdline"] or [])
        if not title.startswith("ray::") or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if not any(k in title for k in ("DriverActor", "Train", "train_fn")):
            continue
        try:
            tmp = p.environ().get("TMPDIR", "")
        except (psutil.Error, OSError):
            continue
        if tmp.startswith(str(scratch)):
            out.append(f"{p.pid} {title[:80]}")
    return out


def _wait(pred, what: str, budget_s: float = 240.0, show=None):
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}" + (f": {show()}" if show is not None else ""))


def test_s3_run_moves_nodes_survives_a_killed_driver_and_writes_nothing_local(s3, tmp_path):  # noqa: F811
    from ray.cluster_utils import Cluster

    scratch = tmp_path / "scratch"
    head_cwd = _scratch(tmp_path, "head-cwd")
    creds = s3.env()
    (tmp_path / "job").mkdir()
    workload = tmp_path / "job" / "workload.py"
    workload.write_text(WORKLOAD)
    profile = tmp_path / "job" / "profile.csv"
    profile.write_text(
        "task,strategy,gpus,step_time_s,steps\n"
        f"short,single,1,{STEP_S},20\n"
        f"long,single,1,{STEP_S},{LONG}\n"
    )
    uri = s3.uri("runs/sweep")
    store_path = "runs/sweep"

    def node_env(name: str) -> dict[str, str]:
        return {**creds, "TMPDIR": str(_scratch(scratch, name))}

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 0, "env_vars": node_env("head")},
    )
    cli_env = {**os.environ, **creds, "RAY_ADDRESS": cluster.address, "TMPDIR": str(_scratch(scratch, "client"))}
    proc = None
    try:
        node_a = cluster.add_node(num_cpus=2, num_gpus=2, env_vars=node_env("node-a"))
        cluster.wait_for_nodes()
        node_a_name = f"node-{node_a.node_id[:8]}"

        # 1. run: the short task finishes, the long one checkpoints on node A.
        proc = subprocess.Popen(
            [str(BIN / "ray-saturn"), "run", str(workload), "--storage", uri, "--profile", str(profile),
             "--checkpoint-interval", "1.0", "--solver-time-limit", "2", "--json"],
            cwd=head_cwd, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )
        with s3.credentials():
            store = RunStorage.at(uri)  # the run creates the folder: look without checking
            long_ckpts = store.uri_of(TASKS_DIR, "long", CHECKPOINTS_DIR)

            def mid_way():
                if proc.poll() is not None:
                    raise AssertionError(f"the run ended early: {proc.stdout.read()[-3000:]}")
                if not store.exists(STATE_FILE):
                    return None
                st = store.read_json(STATE_FILE)["tasks"]
                step = latest_step(long_ckpts) or 0
                return st if st.get("short", {}).get("state") == "finished" and step >= 3 * EVERY else None

            _wait(mid_way, "the short task to finish and the long one to checkpoint 3 times")
            assert _ours_running(scratch), "the run's Ray processes are not seen (so their end could not be)"
            # 2. kill the driver: the CLI process (its job owns the driver actor and the trainers).
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            _wait(lambda: not _ours_running(scratch), "Ray to end the dead job's driver actor and trainers",
                  show=lambda: _ours_running(scratch))
            at_death = store.read_json(STATE_FILE)["tasks"]
            assert at_death["long"]["nodes"] == [node_a_name]
            steps_at_death = at_death["long"]["steps_done"]
            ckpt_at_death = latest_step(long_ckpts)
            assert ckpt_at_death is not None and ckpt_at_death >= 3 * EVERY
            assert steps_at_death - ckpt_at_death <= EVERY  # the kill loses at most one checkpoint interval

        # 3. status reads the bucket.
        out = subprocess.run([str(BIN / "ray-saturn"), "status", uri, "--json"], cwd=head_cwd, env=cli_env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        shown = json.loads(out.stdout)["tasks"]
        assert shown["short"]["state"] == "finished" and shown["short"]["steps_done"] == 20
        assert shown["long"]["steps_done"] == at_death["long"]["steps_done"]

        # 4. node A is lost with its scratch folder; node B (its own scratch) replaces it.
        cluster.remove_node(node_a)
        shutil.rmtree(scratch / "node-a")
        node_b = cluster.add_node(num_cpus=2, num_gpus=2, env_vars=node_env("node-b"))
        cluster.wait_for_nodes()
        node_b_name = f"node-{node_b.node_id[:8]}"
        # Issue 16: the newest checkpoint of the long task is damaged; resume must fall back to the one before.
        client = s3.client()
        newest = f"{store_path}/{TASKS_DIR}/long/{CHECKPOINTS_DIR}/step-{ckpt_at_death:09d}"
        shard = next(k for k in s3.keys(newest) if k.endswith(".distcp"))
        body = client.get_object(Bucket=s3.bucket, Key=shard)["Body"].read()
        client.put_object(Bucket=s3.bucket, Key=shard, Body=body[: len(body) // 2])
        with s3.credentials():
            assert latest_step(long_ckpts) == ckpt_at_death - EVERY

        # 5. resume finishes; the finished task is not run again; the long one moved to node B.
        out = subprocess.run([str(BIN / "ray-saturn"), "resume", uri, "--json"], cwd=head_cwd, env=cli_env,
                             capture_output=True, text=True, timeout=400)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        result = {t["task"]: t for t in json.loads(out.stdout.strip().splitlines()[-1])["tasks"]}
        assert result["short"]["state"] == "finished"
        assert len(result["short"]["segments"]) == len(at_death["short"]["segments"])  # not run again
        long = result["long"]
        assert long["state"] == "finished" and long["steps_done"] == LONG
        new = long["segments"][len(at_death["long"]["segments"]):]
        assert new and new[0]["nodes"] == [node_b_name]
        assert new[0]["steps_start"] == ckpt_at_death - EVERY  # the intact checkpoint before the damaged one
        with s3.credentials():
            assert latest_step(long_ckpts) == LONG
        assert any(k.endswith("/meta.json") for k in s3.keys(f"{store_path}/{TASKS_DIR}/long/"))

        # 6. nothing of the run on any local folder: the head's, the client's, the nodes'.
        leftovers = _run_files(scratch) + _run_files(head_cwd)
        assert not leftovers, leftovers[:10]
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        cluster.shutdown()


def test_tune_trials_checkpoint_to_s3_and_read_back(s3, tmp_path):  # noqa: F811
    """The Tune integration with ``RunConfig(storage_path=s3://...)``: trials' checkpoints land in the
    bucket (Tune's own persistence, through pyarrow with the URI's options), and each reads back as an
    intact checkpoint of the trial's last step (what ``tune.get_checkpoint()`` hands a restarted trial)."""
    import functools

    from ray import tune

    from ray_saturn.tune import SaturnScheduler, saturn_trainable
    from ray_saturn.workloads.regression import regression_task

    def estimate(config):
        return [{"strategy": "single", "gpus": 1, "step_time_s": 0.02, "steps": 12}]

    uri = s3.uri("tune")
    with s3.credentials():
        ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False)
        try:
            scheduler = SaturnScheduler(estimate, restart_s=2.0, cpus_per_trial=0.25)
            tuner = tune.Tuner(
                saturn_trainable(functools.partial(regression_task, max_steps=12), report_every=4),
                param_space={"lr": tune.grid_search([0.1, 0.01]), "width": 16},
                tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler, reuse_actors=False),
                run_config=tune.RunConfig(name="on-s3", storage_path=uri, verbose=0),
            )
            grid = tuner.fit()
            scheduler.close()
            assert len(grid) == 2 and not grid.errors
            for r in grid:
                assert r.metrics["saturn_step"] == 12
                assert type(r.checkpoint.filesystem).__name__ == "S3FileSystem", r.checkpoint.filesystem
                with r.checkpoint.as_directory() as d:  # downloaded from the bucket
                    assert latest_step(d) == 12, os.listdir(d)
            stored = s3.keys("tune/on-s3/")
            assert sum(k.endswith(".distcp") for k in stored) >= 2 * 3, stored[:20]  # 3 reports x 2 trials
            assert not _run_files(tmp_path)
        finally:
            ray.shutdown()
