"""Ray for tests: a real head node (:func:`ray_head`), and a local Ray in this process whose
workers import this checkout's ray_saturn (:func:`local_ray`).

The head node: `ray start --head --block` in its own temp dir, token auth on.

The head runs with its own temp dir (so no other Ray user on the machine picks
it up as "the current cluster") and its own auth token (RAY_AUTH_TOKEN: the
test neither needs nor touches ~/.ray/auth_token), and is stopped by ending the
process group of the `ray start --block` it started, never with a machine-wide
`ray stop`. Readiness is waited on (`ray job list` answering), never slept for.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent

#: How long a loaded 2-core machine may take to bring up the head node's job API (seen: > 120 s at load 11).
READY_BUDGET_S = 300.0


@contextlib.contextmanager
def local_ray(*, num_gpus: int, num_cpus: int) -> Iterator[None]:
    """``ray.init`` of a local Ray with ``num_gpus`` logical GPUs whose workers import this checkout's
    ray_saturn (its folder on their PYTHONPATH); shut down on exit."""
    import ray

    import ray_saturn

    root = str(Path(ray_saturn.__file__).resolve().parents[1])
    ray.init(address="local", num_gpus=num_gpus, num_cpus=num_cpus, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": root}})
    try:
        yield
    finally:
        ray.shutdown()


@dataclass(frozen=True)
class Head:
    gcs_address: str  # for RAY_ADDRESS / ray.init
    dashboard_url: str  # for `ray job ...`
    env: dict[str, str]  # environment of a client of this head (token, PATH, RAY_ADDRESS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_job_api(proc: subprocess.Popen, address: str, env: dict, log: Path) -> None:
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
        lines = (out.stdout + out.stderr).strip().splitlines()
        last = lines[-1] if lines else f"exit {out.returncode}"
        time.sleep(2)
    raise RuntimeError(
        f"the head node's job API did not answer `ray job list` within {time.monotonic() - t0:.0f} s "
        f"(budget {READY_BUDGET_S:.0f} s); last answer: {last}"
    )


@contextlib.contextmanager
def ray_head(*, num_cpus: int = 2, num_gpus: int = 4) -> Iterator[Head]:
    temp_dir = Path(tempfile.gettempdir()) / f"rsh-{uuid.uuid4().hex[:6]}"
    # The dashboard agent's HTTP port is fixed by default (52365): a Ray of an earlier test still
    # stopping holds it, the agent then runs with its HTTP service disabled and `ray job submit`
    # answers "No available agent" for good. Every port of ours is a free one.
    gcs_port, dash_port, agent_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": uuid.uuid4().hex + uuid.uuid4().hex,
    }
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    log_path = temp_dir.with_suffix(".log")
    log = open(log_path, "w")  # noqa: SIM115 - closed in the finaliser
    proc = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", f"--port={gcs_port}", f"--num-cpus={num_cpus}",
         f"--num-gpus={num_gpus}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash_port}",
         f"--dashboard-agent-listen-port={agent_port}",
         f"--temp-dir={temp_dir}", "--include-dashboard=true", "--disable-usage-stats"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    dashboard = f"http://127.0.0.1:{dash_port}"
    try:
        _wait_for_job_api(proc, dashboard, env, log_path)
        yield Head(f"127.0.0.1:{gcs_port}", dashboard, {**env, "RAY_ADDRESS": f"127.0.0.1:{gcs_port}"})
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have exited on its own (a failed start)
            os.killpg(proc.pid, signal.SIGTERM)  # the process group of our own `ray start --block`
        try:
            proc.wait(timeout=5)  # a graceful stop; past that, the group is killed (nothing of value is left)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            log_path.unlink()


def cluster_environ(pid: int) -> dict[str, str]:
    """The environment the emulating process ``pid`` gave the Ray processes it started.

    (``/proc/PID/environ`` of ``pid`` itself shows its environment at exec, not what it set later.)
    """
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            ppid = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid:")))
            if ppid != pid:
                continue
            env = dict(ln.split("=", 1) for ln in (entry / "environ").read_text().split("\0") if "=" in ln)
        except (OSError, StopIteration, ValueError):
            continue
        if "RAY_TMPDIR" in env:
            return env
    return {}
