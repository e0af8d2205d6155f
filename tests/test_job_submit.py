"""`ray job submit` against a real head node started with `ray start --head --num-gpus=N` (token auth on).

The head node runs with its own temp dir (so no other Ray user on the machine
picks it up as "the current cluster") and is stopped by ending the `ray start
--block` process group this test started, never with a machine-wide `ray stop`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _small_working_dir(dest: Path) -> Path:
    """Only what the job needs: the package and the examples (no tests, caches, results)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.parquet")
    shutil.copytree(REPO / "ray_saturn", dest / "ray_saturn", ignore=ignore)
    shutil.copytree(REPO / "examples", dest / "examples", ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def head_node():
    temp_dir = Path(tempfile.gettempdir()) / f"rsj-{uuid.uuid4().hex[:6]}"
    gcs_port, dash_port = _free_port(), _free_port()
    # Token authentication on, for the head node and for the `ray job submit` client. The token is this test's
    # own (RAY_AUTH_TOKEN), so the test neither needs nor touches ~/.ray/auth_token on a fresh machine.
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": uuid.uuid4().hex + uuid.uuid4().hex,
    }
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    log = open(temp_dir.with_suffix(".log"), "w")  # noqa: SIM115 - closed in the finaliser
    proc = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", f"--port={gcs_port}", "--num-cpus=2", "--num-gpus=4",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dash_port}", f"--temp-dir={temp_dir}",
         "--include-dashboard=true"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    address = f"http://127.0.0.1:{dash_port}"
    try:
        _wait_for_job_api(proc, address, env, temp_dir.with_suffix(".log"))
        yield address, env
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have exited on its own (a failed start)
            os.killpg(proc.pid, signal.SIGTERM)  # the process group of our own `ray start --block`
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


#: How long a loaded 2-core machine may take to bring up the head node's job API (seen: > 120 s at load 11).
READY_BUDGET_S = 300.0


def _wait_for_job_api(proc: subprocess.Popen, address: str, env: dict, log: Path) -> None:
    """Wait until the job API answers `ray job list` (readiness, not a fixed sleep); fail saying how long."""
    t0 = time.monotonic()
    last = ""
    while time.monotonic() - t0 < READY_BUDGET_S:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}: {log.read_text()[-4000:]}")
        try:
            out = subprocess.run([str(BIN / "ray"), "job", "list", f"--address={address}"], env=env,
                                 capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            last = "`ray job list` did not answer within 60 s"
            continue
        if out.returncode == 0:
            return
        last = (out.stdout + out.stderr).strip().splitlines()[-1:] or [f"exit {out.returncode}"]
        last = last[0]
        time.sleep(2)
    raise RuntimeError(
        f"the head node's job API did not answer `ray job list` within {time.monotonic() - t0:.0f} s "
        f"(budget {READY_BUDGET_S:.0f} s); last answer: {last}"
    )


def submit_and_wait(address: str, env: dict, workdir: Path, entrypoint: list[str], timeout_s: float = 400):
    """Submit with the `ray job submit` CLI, poll `ray job status` until it ends; return (status, logs)."""
    job_id = f"saturn-{uuid.uuid4().hex[:8]}"
    ray = str(BIN / "ray")
    # The job API answers before its job agent is up on a loaded machine; Ray then asks to try again later.
    t0 = time.monotonic()
    while True:
        submit = subprocess.run(
            [ray, "job", "submit", f"--address={address}", f"--submission-id={job_id}", "--no-wait",
             "--working-dir", ".", "--", *entrypoint],
            cwd=workdir, env=env, capture_output=True, text=True, timeout=120,
        )
        waiting = "No available agent to submit job" in submit.stdout + submit.stderr
        if submit.returncode == 0 or not waiting or time.monotonic() - t0 > READY_BUDGET_S:
            break
        time.sleep(3)
    assert submit.returncode == 0, (
        f"`ray job submit` failed after waiting {time.monotonic() - t0:.0f} s for the job agent "
        f"(budget {READY_BUDGET_S:.0f} s): {submit.stdout + submit.stderr}"
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
    address, env = head_node
    workdir = _small_working_dir(tmp_path / "job")
    job_id, status, logs = submit_and_wait(address, env, workdir, ["python", "examples/job_submit.py", "--plan-only",
                                                           "--time-limit", "3"])
    assert f"Job '{job_id}' succeeded" in status, status + logs[-4000:]
    assert "ray_saturn plan:" in logs and '"makespan_s"' in logs and '"lower_bound_s"' in logs, logs[-4000:]
    cluster = json.loads(logs.split("ray_saturn cluster:", 1)[1].splitlines()[0])
    assert sum(n["gpus"] for n in cluster["nodes"]) == 4  # the head node's --num-gpus


def test_submit_without_the_token_is_refused(head_node, tmp_path):
    address, env = head_node
    env = {**env, "RAY_AUTH_TOKEN": "not-the-token"}
    submit = subprocess.run(
        [str(BIN / "ray"), "job", "list", f"--address={address}"], env=env, capture_output=True, text=True, timeout=120,
    )
    assert submit.returncode != 0
    assert "auth" in (submit.stdout + submit.stderr).lower()
