"""`ray job submit` against a real head node started with `ray start --head --num-gpus=N` (token auth on).

The head node comes from tests/ray_head.py: its own temp dir and token, readiness waited on, stopped by
ending its own process group.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from ray_head import READY_BUDGET_S, ray_head

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _small_working_dir(dest: Path) -> Path:
    """Only what the job needs: the package and the examples (no tests, caches, results)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.parquet")
    shutil.copytree(REPO / "ray_saturn", dest / "ray_saturn", ignore=ignore)
    shutil.copytree(REPO / "examples", dest / "examples", ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def head_node():
    with ray_head(num_cpus=2, num_gpus=4) as head:
        env = {k: v for k, v in head.env.items() if k != "RAY_ADDRESS"}  # `ray job` takes --address
        yield head.dashboard_url, env, head.gcs_address


def submit_and_wait(address: str, env: dict, workdir: Path, entrypoint: list[str], timeout_s: float = 400):
    """Submit with the `ray job submit` CLI, poll `ray job status` until it ends; return (status, logs)."""
    job_id = f"saturn-{uuid.uuid4().hex[:8]}"
    ray = str(BIN / "ray")
    # The job API answers before its job agent is up on a loaded machine; Ray then asks to try again later.
    t0 = time.monotonic()
    timed_out = False
    while True:
        try:
            submit = subprocess.run(
                [ray, "job", "submit", f"--address={address}", f"--submission-id={job_id}", "--no-wait",
                 "--working-dir", ".", "--", *entrypoint],
                cwd=workdir, env=env, capture_output=True, text=True, timeout=120,
            )
            answer, ok = submit.stdout + submit.stderr, submit.returncode == 0
            # A submit that timed out may have gone through: its retry finds the job there.
            ok = ok or (timed_out and "already exists" in answer)
            waiting = "No available agent to submit job" in answer
        except subprocess.TimeoutExpired:
            answer, ok, waiting, timed_out = "`ray job submit` did not answer within 120 s", False, True, True
        if ok or not waiting or time.monotonic() - t0 > READY_BUDGET_S:
            break
        time.sleep(3)
    assert ok, (
        f"`ray job submit` failed after waiting {time.monotonic() - t0:.0f} s for the job agent "
        f"(budget {READY_BUDGET_S:.0f} s): {answer}"
    )
    status = ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = subprocess.run([ray, "job", "status", f"--address={address}", job_id], env=env,
                              capture_output=True, text=True, timeout=60)
        status = done.stdout + done.stderr
        if re.search(r"Job '[^']+' (succeeded|failed|stopped)", status):
            break
        time.sleep(2)
    logs = subprocess.run([ray, "job", "logs", f"--address={address}", job_id], env=env, capture_output=True,
                          text=True, timeout=60).stdout
    return job_id, status, logs


def test_entry_point_runs_as_a_submitted_job_and_prints_the_plan(head_node, tmp_path):
    address, env, _ = head_node
    workdir = _small_working_dir(tmp_path / "job")
    job_id, status, logs = submit_and_wait(address, env, workdir, ["python", "examples/job_submit.py", "--plan-only",
                                                           "--time-limit", "3"])
    assert f"Job '{job_id}' succeeded" in status, status + logs[-4000:]
    assert "ray_saturn plan:" in logs and '"makespan_s"' in logs and '"lower_bound_s"' in logs, logs[-4000:]
    cluster = json.loads(logs.split("ray_saturn cluster:", 1)[1].splitlines()[0])
    assert sum(n["gpus"] for n in cluster["nodes"]) == 4  # the head node's --num-gpus


def test_submit_without_the_token_is_refused(head_node, tmp_path):
    address, env, _ = head_node
    env = {**env, "RAY_AUTH_TOKEN": "not-the-token"}
    submit = subprocess.run(
        [str(BIN / "ray"), "job", "list", f"--address={address}"], env=env, capture_output=True, text=True, timeout=120,
    )
    assert submit.returncode != 0
    assert "auth" in (submit.stdout + submit.stderr).lower()


def test_cli_run_trains_a_workload_with_its_own_model(head_node, tmp_path):
    # The workload file defines its own model class, data function and loss, and imports a helper beside it:
    # none of it is importable on the workers (profiler trial actors, Ray Train workers).
    from test_workload_file import write_workload

    _, env, gcs = head_node
    workload = write_workload(tmp_path / "wl")
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [str(BIN / "ray-saturn"), "run", str(workload), "--storage", str(run_dir), "--json",
         "--checkpoint-interval", "1", "--solver-time-limit", "2"],
        cwd=tmp_path, env={**env, "RAY_ADDRESS": gcs}, capture_output=True, text=True, timeout=500,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["state"] == "finished"
    (task,) = result["tasks"]
    assert task["task"] == "own-8" and task["state"] == "finished" and task["steps_done"] == 12
    from ray_saturn.strategies import latest_step

    assert latest_step(str(run_dir / "tasks" / "own-8" / "checkpoints")) == 12
