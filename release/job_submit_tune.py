"""Release check: the Tune example as a `ray job submit` job on a real head node (too slow for the suite).

Starts ``ray start --head --block --num-gpus=N`` with its own temp dir and
token authentication, submits ``examples/tune_search.py --quick`` with the
``ray job submit`` CLI from a minimal working dir, waits for SUCCEEDED,
checks that the logs show the plan, prints the wall times, and stops the head
node by ending the process group it started::

    PYTHONPATH=. python release/job_submit_tune.py --gpus 4
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rs-job-"))
    temp_dir = Path(tempfile.gettempdir()) / f"rsj-{uuid.uuid4().hex[:6]}"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.parquet")
    shutil.copytree(REPO / "ray_saturn", work / "job" / "ray_saturn", ignore=ignore)
    shutil.copytree(REPO / "examples", work / "job" / "examples", ignore=ignore)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    dash = _free_port()
    t0 = time.monotonic()
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", f"--port={_free_port()}", "--num-cpus=2",
         f"--num-gpus={args.gpus}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
         f"--temp-dir={temp_dir}", "--include-dashboard=true"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    ray = str(BIN / "ray")
    address = f"http://127.0.0.1:{dash}"
    try:
        while True:
            try:
                with socket.create_connection(("127.0.0.1", dash), timeout=1):
                    break
            except OSError:
                if head.poll() is not None or time.monotonic() - t0 > 120:
                    print("the head node did not come up", file=sys.stderr)
                    return 1
                time.sleep(1)
        t_up = time.monotonic()
        job_id = f"saturn-tune-{uuid.uuid4().hex[:6]}"
        subprocess.run([ray, "job", "submit", f"--address={address}", f"--submission-id={job_id}", "--no-wait",
                        "--working-dir", ".", "--", "python", "examples/tune_search.py", "--quick",
                        "--storage", str(work / "results")], cwd=work / "job", env=env, check=True,
                       capture_output=True, timeout=120)
        status = ""
        while time.monotonic() - t_up < args.timeout:
            done = subprocess.run([ray, "job", "status", f"--address={address}", job_id], env=env,
                                  capture_output=True, text=True, timeout=60)
            status = done.stdout + done.stderr
            if re.search(r"Job '[^']+' (succeeded|failed|stopped)", status):
                break
            time.sleep(3)
        logs = subprocess.run([ray, "job", "logs", f"--address={address}", job_id], env=env, capture_output=True,
                              text=True, timeout=60).stdout
        ok = f"Job '{job_id}' succeeded" in status and "ray_saturn first plan:" in logs and '"lower_bound_s"' in logs
        print("\n".join(line for line in logs.splitlines() if line.startswith(("ray_saturn", "trial ", "best:"))))
        print(f"head node up in {t_up - t0:.0f}s; job {'SUCCEEDED' if ok else 'FAILED'} after "
              f"{time.monotonic() - t_up:.0f}s")
        return 0 if ok else 1
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
