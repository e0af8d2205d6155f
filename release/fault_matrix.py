"""Fault matrix (issue 16): the faults a careful user meets, injected on the real path.

The real path: ``ray-saturn run WORKLOAD`` against a separate Ray head (token
auth, 127.0.0.1, 2 logical GPUs), every task segment a TorchTrainer run
(one process per task, strategy ``single``) that writes DCP checkpoints into the run folder, the folder on
a local disk (``--storage local``) or on an S3 endpoint (``--storage s3``:
moto on 127.0.0.1 with credentials enforced, ``tests/s3_server.py``). The
workload is a file with its own model class, data function and loss; its
steps take about 50 ms (a sleep in the loss), checkpoints every 2 s.

Each fault is injected into a live run (or its folder), and the row says
what happened:

- survived: the run (or ``ray-saturn resume``) finished; no task that had
  finished ran again; no task lost more than one checkpoint interval of the
  progress the driver had recorded; no actor or placement group of ours was
  left on the cluster afterwards;
- refused: the command exited 2 with one line (no traceback) naming what is
  wrong, and nothing was touched.

Anything else is a failure, and the table says which check failed.

Usage (each command fits the 10-minute CPU lock; results merge into --out):

    python release/fault_matrix.py --storage local --out release/fault_matrix.json --faults kill-cli,state-deleted
    python release/fault_matrix.py --storage s3 --out release/fault_matrix.json --faults ...
    python release/fault_matrix.py --table release/fault_matrix.json

``--faults`` takes the names in :data:`SCENARIOS` (default: all, about 25
minutes per storage on a 2-core machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the Ray head and S3 server helpers the tests use

BIN = Path(sys.executable).parent
#: Budget for anything that waits on Ray or a run on a loaded 2-core machine.
BUDGET_S = 420.0

WORKLOAD = textwrap.dedent(
    '''
    """Fault-matrix workload: its own model class, data function and loss; ~50 ms per step."""
    import time

    import torch

    from ray_saturn import Task

    STEP_S = 0.05


    class Net(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.a = torch.nn.Linear(8, width)
            self.b = torch.nn.Linear(width, 1)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))


    def data(hp):
        g = torch.Generator().manual_seed(int(hp["seed"]))
        return [(torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)) for _ in range(8)]


    def bad_data(hp):
        g = torch.Generator().manual_seed(0)
        for _ in range(int(hp["fail_at"])):
            yield torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
        raise ValueError(f"boom: batch {hp['fail_at']} of this task is broken")


    def loss(out, batch):
        time.sleep(STEP_S)
        return ((out - batch[1]) ** 2).mean()


    def sgd(params, hp):
        return torch.optim.SGD(params, lr=0.05)


    STEPS = {STEPS}
    tasks = [
        Task(name, lambda hp: Net(16), bad_data if name == "fm-bad" else data, loss, sgd,
             {{"seed": i, "fail_at": 20}}, max_steps=n, strategies=("single",))
        for i, (name, n) in enumerate(STEPS.items())
    ]
    '''
)
STEPS = {"fm-0": 120, "fm-1": 300, "fm-2": 480}
BAD_STEPS = {"fm-good": 120, "fm-bad": 200}
STEP_S = 0.05
CHECKPOINT_S = 2.0
#: Class names of what our runs put on the cluster (driver, board, Ray Train's controller, workers, cleaner).
OURS = ("DriverActor", "ProgressBoard", "TrainController", "RayTrainWorker", "PlacementGroupCleaner")


@dataclass
class Row:
    """One injected fault and what came of it."""

    fault: str
    storage: str
    outcome: str  # survived | refused | FAILED
    detail: str
    finished_rerun: bool | None = None
    lost_intervals: float | None = None
    leftovers: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome in ("survived", "refused")


class Failed(Exception):
    """A check of a scenario failed (the row says which)."""


class Proc:
    """A command running in the background, its output in files (a pipe could fill up and block it)."""

    def __init__(self, args: list[str], env: dict[str, str], work: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.out_path, self.err_path = work / f"{tag}.out", work / f"{tag}.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.popen = subprocess.Popen(args, env=env, stdout=out, stderr=err, text=True, start_new_session=True)
        self.args = args
        self.pid = self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout=timeout)

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def completed(self) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(self.args, self.returncode, self.stdout, self.stderr)

    def result(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None


# ------------------------------------------------------------------ the bench
class Bench:
    """The Ray head, the storage, the workload files, and the commands a user types."""

    def __init__(self, kind: str, work: Path, head: Any, s3: Any | None) -> None:
        self.kind = kind
        self.work = work
        self.head = head
        self.s3 = s3
        self.env = {**head.env, **(s3.env() if s3 else {})}
        self.env["PYTHONUNBUFFERED"] = "1"
        self.workload = work / "fm_workload.py"
        self.workload.write_text(WORKLOAD.replace("{STEPS}", repr(STEPS)).replace("{{", "{").replace("}}", "}"))
        self.bad_workload = work / "fm_bad_workload.py"
        self.bad_workload.write_text(
            WORKLOAD.replace("{STEPS}", repr(BAD_STEPS)).replace("{{", "{").replace("}}", "}"))
        self.profile = work / "fm_profile.csv"
        self._write_profile(self.profile, STEPS)
        self.procs: list[Proc] = []
        self.bad_profile = work / "fm_bad_profile.csv"
        self._write_profile(self.bad_profile, BAD_STEPS)

    @staticmethod
    def _write_profile(path: Path, steps: dict[str, int]) -> None:
        from ray_saturn import ProfileTable

        ProfileTable.from_rows(
            [{"task": t, "strategy": "single", "gpus": 1, "step_time_s": STEP_S, "steps": n} for t, n in steps.items()]
        ).write(path)

    def run_dir(self, name: str) -> str:
        tag = f"{name}-{uuid.uuid4().hex[:6]}"
        if self.s3 is not None:
            return self.s3.uri(f"fm/{tag}")
        return str(self.work / tag)

    def storage(self, run_dir: str) -> Any:
        from ray_saturn.runtime.storage import RunStorage

        return RunStorage(run_dir, create=False)

    def cli(self, *args: str, timeout: float = BUDGET_S,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "ray-saturn"), *args], env=env or self.env, capture_output=True, text=True,
                              timeout=timeout)

    def start_run(self, run_dir: str, *, bad: bool = False) -> Proc:
        wl, prof = (self.bad_workload, self.bad_profile) if bad else (self.workload, self.profile)
        p = Proc([str(BIN / "ray-saturn"), "run", str(wl), "--run-dir", run_dir, "--profile", str(prof),
                  "--checkpoint-interval", str(CHECKPOINT_S), "--json"], self.env, self.work)
        self.procs.append(p)
        return p

    def end_runs(self) -> list[int]:
        """Kill the runs the scenarios started that still run (one failed half-way); their pids."""
        left = [p for p in self.procs if p.poll() is None]
        for p in left:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)
        self.procs = [p for p in self.procs if p.poll() is None]
        return [p.pid for p in left]

    def state(self, run_dir: str) -> dict[str, Any] | None:
        from ray_saturn.runtime.journal import Journal

        try:
            return Journal(self.storage(run_dir)).load_state().state
        except Exception:
            return None

    def wait(self, what: str, pred: Callable[[], Any], proc: Proc | None = None,
             budget: float = BUDGET_S) -> Any:
        t0 = time.monotonic()
        while time.monotonic() - t0 < budget:
            got = pred()
            if got:
                return got
            if proc is not None and proc.poll() is not None:
                raise Failed(f"the run ended before {what}: exit {proc.returncode}: {_tail(proc.stderr)}")
            time.sleep(0.5)
        raise Failed(f"{what}: not within {budget:.0f} s")

    def wait_mid_run(self, run_dir: str, proc: Proc) -> dict[str, Any]:
        """Until one task has finished and another is two checkpoints in, with one more to go."""
        every = self.every()

        def mid() -> dict[str, Any] | None:
            st = self.state(run_dir)
            if not st:
                return None
            t = st["tasks"].values()
            done = any(r["state"] == "finished" for r in t)
            going = any(r["state"] == "running" and 2 * every <= r["steps_done"] <= r["total_steps"] - every
                        for r in t)
            return st if done and going else None

        return self.wait("a task finished while another ran two checkpoints in", mid, proc)

    @staticmethod
    def every() -> int:
        return max(1, round(CHECKPOINT_S / STEP_S))

    def leftovers(self, budget: float = 60.0) -> list[str]:
        """Our actors and placement groups still alive on the cluster (waits for them to end by themselves)."""
        t0 = time.monotonic()
        while True:
            left = _alive_of_ours()
            if not left or time.monotonic() - t0 > budget:
                return left
            time.sleep(1.0)

    def resume(self, run_dir: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict[str, Any] | None]:
        out = self.cli("resume", run_dir, "--json", *extra)
        try:
            return out, json.loads(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return out, None


def _tail(text: str | None, n: int = 600) -> str:
    text = (text or "").strip()
    return text[-n:].replace("\n", " | ")


def _alive_of_ours() -> list[str]:
    import ray._private.state as ray_state
    from ray.core.generated import gcs_pb2

    acc = ray_state.state._connect_and_get_accessor()
    out = []
    for raw in acc.get_actor_table(None, None):
        a = gcs_pb2.ActorTableData.FromString(raw)
        # The last dotted part: Ray records a class defined in a function as e.g. _board_cls.<locals>.ProgressBoard.
        if a.class_name.rsplit(".", 1)[-1] in OURS and a.state != gcs_pb2.ActorTableData.DEAD:
            out.append(f"{a.class_name} {a.actor_id.hex()[:8]}")
    for raw in acc.get_placement_group_table():
        pg = gcs_pb2.PlacementGroupTableData.FromString(raw)
        if pg.state != gcs_pb2.PlacementGroupTableData.REMOVED:
            out.append(f"placement group {pg.name or pg.placement_group_id.hex()[:8]}")
    return out


def own_traceback(stderr: str) -> bool:
    """A traceback of the command itself (Ray forwards its workers' log lines, a task's traceback among
    them, to the command's stderr, each line prefixed ``(ActorName pid=N)``: those are not ours)."""
    return any(ln.startswith("Traceback (most recent call last)") for ln in stderr.splitlines())


def one_line_refusal(proc: subprocess.CompletedProcess, expect: str) -> str:
    """The refusal's line; raises Failed unless exit 2 with one line containing ``expect`` and no traceback."""
    err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    lines = [ln for ln in err if ln.startswith("ray-saturn ")]
    if proc.returncode != 2 or own_traceback(proc.stderr) or len(lines) != 1 or expect not in lines[0]:
        raise Failed(f"expected exit 2 and one line with {expect!r}; got exit {proc.returncode}: {_tail(proc.stderr)}")
    return lines[0]


def check_resumed(b: Bench, at: dict[str, Any], result: dict[str, Any] | None, proc: Any, *,
                  max_intervals: float = 1.0) -> tuple[bool, float, str]:
    """Finished, no finished task re-run, worst loss in checkpoint intervals; raises Failed otherwise."""
    if result is None or result.get("state") != "finished" or proc.returncode != 0:
        raise Failed(f"resume did not finish: exit {proc.returncode}: {_tail(proc.stderr)}")
    tasks = {t["task"]: t for t in result["tasks"]}
    every = b.every()
    rerun = False
    worst = 0.0
    for name, was in at["tasks"].items():
        now = tasks[name]
        if now["state"] != "finished" or now["steps_done"] != now["total_steps"]:
            raise Failed(f"{name} is {now['state']} at {now['steps_done']}/{now['total_steps']} after resume")
        new = now["segments"][len(was["segments"]):]
        if was["state"] == "finished":
            rerun |= bool(new)
        elif new and was["steps_done"] > 0:
            worst = max(worst, (was["steps_done"] - new[0]["steps_start"]) / every)
    if rerun:
        raise Failed("a task that had finished ran again")
    if worst > max_intervals:
        raise Failed(f"a task lost {worst:.2f} checkpoint intervals (> {max_intervals})")
    return rerun, round(worst, 2), f"resumed: {len(result['tasks'])} tasks finished, worst loss {worst:.2f} interval"


def kill_cli(proc: Proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


# ------------------------------------------------------------------ scenarios
def s_kill_cli(b: Bench) -> list[Row]:
    """kill -9 of `ray-saturn run` mid-run, and what a user does next: a second run and a resume on the
    live folder (refused), status after the kill, resume with the workload file changed (refused), resume."""
    rows: list[Row] = []
    d = b.run_dir("kill-cli")
    first = b.start_run(d)
    time.sleep(0.5)
    second = b.start_run(d)  # 0.5 s apart on the same folder: one runs, the other is refused
    t0 = time.monotonic()

    def one_refused() -> Proc | None:
        for p in (first, second):
            if p.poll() is not None:
                return p
        return None

    loser = b.wait("one of two runs on one folder exits", one_refused, budget=BUDGET_S)
    live = second if loser is first else first
    out = loser.completed()
    rows.append(_row("two runs on one folder, 0.5 s apart", b, t0,
                     lambda: ("refused", one_line_refusal(out, "is in use by `ray-saturn run`"))))
    t0 = time.monotonic()
    at_mid = b.wait_mid_run(d, live)
    rows.append(_row("resume of a live run", b, t0,
                     lambda: ("refused", one_line_refusal(b.cli("resume", d), "is in use by `ray-saturn run`"))))
    t0 = time.monotonic()
    kill_cli(live)
    at = b.state(d) or at_mid

    def status() -> tuple[str, str]:
        st = b.cli("status", d)
        first_line = (st.stdout.splitlines() or [""])[0]
        if st.returncode != 0 or not first_line.startswith("driver not seen for ") or "ray-saturn resume" not in \
                first_line:
            raise Failed(f"status after kill -9 said: {first_line!r} {_tail(st.stderr)}")
        return "survived", first_line

    rows.append(_row("status after kill -9 of the run", b, t0, status))
    t0 = time.monotonic()
    original = b.workload.read_text()
    b.workload.write_text(original + "\n# edited after the run started\n")

    def changed() -> tuple[str, str]:
        from ray_saturn.runtime.lease import read_lease

        before = read_lease(b.storage(d))
        line = one_line_refusal(b.cli("resume", d), "changed since the run started")
        after = read_lease(b.storage(d))
        if (before is None) != (after is None) or (before is not None and before.owner != after.owner):
            raise Failed(f"the refused resume changed the run's lock ({before and before.owner[:8]} -> "
                         f"{after and after.owner[:8]}): {line}")
        return "refused", line

    try:
        rows.append(_row("workload file changed before resume", b, t0, changed))
    finally:
        b.workload.write_text(original)
    t0 = time.monotonic()

    def resume() -> tuple[str, str, bool, float]:
        proc, result = b.resume(d)
        finished = proc.returncode == 0 and result is not None and result.get("state") == "finished"
        said = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "taking over the lock" in ln]
        if not said:  # the whole output, not its tail (Ray's worker log lines fill the tail)
            raise Failed(f"resume {'finished' if finished else f'did not finish (exit {proc.returncode})'}, but "
                         f"none of its {len(proc.stderr.splitlines())} lines of output says it took over the "
                         "stale lock of the killed run")
        rerun, lost, detail = check_resumed(b, at, result, proc)
        took = said[0][said[0].find("taking over"):]
        return "survived", f"{detail}; said: {took[:140]}", rerun, lost

    rows.append(_row("kill -9 of `ray-saturn run` mid-run, then resume", b, t0, resume, leftovers=True))
    return rows


def _state_fault(b: Bench, name: str, label: str, mutate: Callable[[Any], None], status_expect: str | None) -> Row:
    t0 = time.monotonic()
    d = b.run_dir(name)

    def go() -> tuple[str, str, bool, float]:
        p = b.start_run(d)
        b.wait_mid_run(d, p)
        kill_cli(p)
        at = b.state(d)
        mutate(b.storage(d))
        notes = ""
        if status_expect is not None:
            st = b.cli("status", d)
            if st.returncode != 0 or own_traceback(st.stderr) or status_expect not in st.stdout:
                raise Failed(f"status: exit {st.returncode}, expected {status_expect!r}: "
                             f"{_tail(st.stdout + st.stderr)}")
            notes = "; status: " + next(ln for ln in st.stdout.splitlines() if status_expect in ln)[:120]
        proc, result = b.resume(d)
        rerun, lost, detail = check_resumed(b, at, result, proc)
        if result["realised_makespan_s"] < at["time_s"]:
            raise Failed(f"the run's history was lost: makespan {result['realised_makespan_s']} < {at['time_s']}")
        return "survived", detail + notes, rerun, lost

    return _row(label, b, t0, go, leftovers=True)


def s_state_deleted(b: Bench) -> list[Row]:
    def mutate(store: Any) -> None:
        for f in ("state.json", "state.json.bak"):
            store.delete(f, missing_ok=True)

    return [_state_fault(b, "state-deleted", "state.json (and its backup) deleted, then resume", mutate,
                         "showing events.jsonl")]


def s_state_truncated(b: Bench) -> list[Row]:
    def mutate(store: Any) -> None:
        data = store.read_bytes("state.json")
        store.write_bytes("state.json", data[: len(data) // 2])

    return [_state_fault(b, "state-truncated", "state.json truncated, then status and resume", mutate,
                         "showing state.json.bak")]


def s_state_misshapen(b: Bench) -> list[Row]:
    def mutate(store: Any) -> None:
        store.write_json("state.json", {"driver_state": "running", "tasks": ["not", "records"]})

    return [_state_fault(b, "state-misshapen", "state.json of the wrong shape, then status and resume", mutate,
                         "showing state.json.bak")]


def s_driver_killed(b: Bench) -> list[Row]:
    import ray

    from ray_saturn.runtime.actor import DRIVER_NAMESPACE, driver_name

    t0 = time.monotonic()
    d = b.run_dir("driver-killed")

    def go() -> tuple[str, str, bool, float]:
        p = b.start_run(d)
        b.wait_mid_run(d, p)
        name = b.storage(d).read_json("run.json")["name"]
        ray.kill(ray.get_actor(driver_name(name), namespace=DRIVER_NAMESPACE), no_restart=True)
        p.wait(timeout=BUDGET_S)
        line = one_line_refusal(p.completed(), "died")
        at = b.state(d)
        proc, result = b.resume(d)
        rerun, lost, detail = check_resumed(b, at, result, proc)
        return "survived", f"the run said: {line[:100]}...; {detail}", rerun, lost

    return [_row("driver actor killed mid-run, then resume", b, t0, go, leftovers=True)]


def s_worker_killed(b: Bench) -> list[Row]:
    t0 = time.monotonic()
    d = b.run_dir("worker-killed")

    def go() -> tuple[str, str, bool, float]:
        p = b.start_run(d)
        b.wait_mid_run(d, p)
        pid = _a_train_worker_pid()
        before = b.state(d)
        os.kill(pid, signal.SIGKILL)
        p.wait(timeout=BUDGET_S)
        result = p.result()
        if p.returncode != 0 or result is None:
            raise Failed(f"the run did not finish after a worker was killed: exit {p.returncode}: {_tail(p.stderr)}")
        lost = 0.0
        hit = []
        for t in result["tasks"]:
            segs = t["segments"]
            for i, s in enumerate(segs[:-1]):
                if s["status"] == "failed":
                    hit.append(t["task"])
                    reached = before["tasks"][t["task"]]["steps_done"]
                    lost = max(lost, (reached - segs[i + 1]["steps_start"]) / b.every())
        if not hit:
            raise Failed("no segment failed: the kill hit nothing")
        if lost > 1.0:
            raise Failed(f"the killed worker's task lost {lost:.2f} checkpoint intervals")
        if any(t["state"] != "finished" for t in result["tasks"]):
            raise Failed("not every task finished")
        detail = f"the segment of {', '.join(hit)} failed and was relaunched from its checkpoint; run finished"
        return "survived", detail, False, round(lost, 2)

    return [_row("a Ray Train worker killed (kill -9) mid-segment", b, t0, go, leftovers=True)]


def _processes_under(temp: str) -> list[int]:
    """Processes whose command line names ``temp`` (the emulated cluster's private temp dir)."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                if temp.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    out.append(int(pid))
    return out


def _a_train_worker_pid() -> int:
    import ray._private.state as ray_state
    from ray.core.generated import gcs_pb2

    acc = ray_state.state._connect_and_get_accessor()
    for raw in acc.get_actor_table(None, None):
        a = gcs_pb2.ActorTableData.FromString(raw)
        if a.class_name == "RayTrainWorker" and a.state == gcs_pb2.ActorTableData.ALIVE and a.pid:
            return int(a.pid)
    raise Failed("no live Ray Train worker to kill")


def s_checkpoint_corrupt(b: Bench) -> list[Row]:
    t0 = time.monotonic()
    d = b.run_dir("ckpt-corrupt")

    def go() -> tuple[str, str, bool, float]:
        p = b.start_run(d)
        b.wait_mid_run(d, p)
        kill_cli(p)
        at = b.state(d)
        store = b.storage(d)
        victim = max((t for t, r in at["tasks"].items() if r["state"] != "finished"),
                     key=lambda t: at["tasks"][t]["steps_done"])
        ck = f"tasks/{victim}/checkpoints"
        steps = sorted(e.name for e in store.list(ck) if e.name.startswith("step-"))
        if len(steps) < 2:
            raise Failed(f"{victim} has {len(steps)} checkpoint(s); need two to fall back")
        files = [e for e in store.list(f"{ck}/{steps[-1]}") if e.name.endswith(".distcp")]
        if not files:
            raise Failed(f"no .distcp file in {ck}/{steps[-1]}")
        target = f"{ck}/{steps[-1]}/{files[0].name}"
        data = store.read_bytes(target)
        store.write_bytes(target, data[: len(data) // 2])
        proc, result = b.resume(d)
        # The newest checkpoint is gone: falling back to the one before loses up to two intervals.
        rerun, lost, detail = check_resumed(b, at, result, proc, max_intervals=2.0)
        return "survived", f"newest checkpoint of {victim} ({steps[-1]}) truncated; {detail}", rerun, lost

    return [_row("newest checkpoint of a task truncated, then resume", b, t0, go, leftovers=True)]


def _iam_unauthenticated(b: Bench, call: Callable[[Any], Any]) -> Any:
    """One IAM call on the moto endpoint, which the test user may not make: moto's reset-auth lets
    the next request through unauthenticated (a request of the run may take that slot: then again)."""
    import urllib.request

    import boto3
    from botocore.exceptions import ClientError

    iam = boto3.client("iam", endpoint_url=b.s3.url, region_name="us-east-1", aws_access_key_id="setup",
                       aws_secret_access_key="setup")
    for _ in range(50):
        # text/plain: with urllib's default (form-encoded) the server sees no body and answers 500.
        req = urllib.request.Request(f"{b.s3.url}/moto-api/reset-auth", data=b"1", method="POST",
                                     headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(req, timeout=30).close()
        try:
            return call(iam)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("AccessDenied", "InvalidClientTokenId"):
                raise
    raise Failed("could not change the test user's policy on the S3 endpoint")


@contextlib.contextmanager
def read_only(b: Bench, run_dir: str) -> Iterator[None]:
    """Make the run folder read-only (local: immutable files; S3: the user's writes under it denied).

    (moto evaluates the user's IAM policies, not bucket policies: the deny is an inline user policy.)
    """
    if b.s3 is None:
        subprocess.run(["chattr", "-R", "+i", run_dir], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-R", "-i", run_dir], check=True)
        return
    prefix = run_dir.split("?")[0][len(f"s3://{b.s3.bucket}/"):]
    policy = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Deny", "Action": ["s3:PutObject", "s3:DeleteObject"],
        "Resource": f"arn:aws:s3:::{b.s3.bucket}/{prefix}/*"}]}
    _iam_unauthenticated(b, lambda iam: iam.put_user_policy(UserName="saturn", PolicyName="fm-read-only",
                                                            PolicyDocument=json.dumps(policy)))
    try:
        yield
    finally:
        _iam_unauthenticated(b, lambda iam: iam.delete_user_policy(UserName="saturn", PolicyName="fm-read-only"))


def s_read_only(b: Bench) -> list[Row]:
    t0 = time.monotonic()
    d = b.run_dir("read-only")

    def go() -> tuple[str, str, bool, float]:
        p = b.start_run(d)
        b.wait_mid_run(d, p)
        with read_only(b, d):
            p.wait(timeout=BUDGET_S)
            at = b.state(d)
        result = p.result()
        if own_traceback(p.stderr) or p.returncode == 0 or result is None:
            raise Failed(f"the run on a read-only folder: exit {p.returncode}: {_tail(p.stderr)}")
        reason = result.get("reason", "")
        if result["state"] != "failed" or "\n" in reason or "cannot write" not in reason:
            raise Failed(f"the run did not fail with one line saying it cannot write: {reason!r}")
        proc, res = b.resume(d)
        rerun, lost, detail = check_resumed(b, at, res, proc)
        return "survived", f"the run said: {reason[:90]}...; writable again: {detail}", rerun, lost

    return [_row("run folder made read-only mid-run, then writable and resume", b, t0, go, leftovers=True)]


def s_task_raises(b: Bench) -> list[Row]:
    t0 = time.monotonic()
    d = b.run_dir("task-raises")

    def go() -> tuple[str, str, bool, float]:
        p = b.start_run(d, bad=True)
        p.wait(timeout=BUDGET_S)
        got = p.result()
        if p.returncode != 1 or own_traceback(p.stderr) or got is None:
            why = ("a traceback of the command itself" if own_traceback(p.stderr)
                   else "no JSON result" if got is None else "")
            raise Failed(f"expected exit 1 (a task failed) and its JSON result, got exit {p.returncode} {why}: "
                         f"{_tail(p.stderr)}")
        result = {t["task"]: t for t in got["tasks"]}
        good, bad = result["fm-good"], result["fm-bad"]
        if good["state"] != "finished":
            raise Failed(f"the good task is {good['state']}: one task's error cost another")
        if bad["state"] != "failed" or "boom" not in bad["reason"] or "\n" in bad["reason"]:
            raise Failed(f"the failing task: {bad['state']} with reason {bad['reason']!r}")
        st = b.cli("status", d)
        line = next((ln for ln in st.stdout.splitlines() if ln.startswith("fm-bad")), "")
        if "100%" in line or "failed" not in line:
            raise Failed(f"status shows the failed task as {line!r}")
        return "survived", f"the other task finished; the failing one: {bad['reason'][:90]}", False, 0.0

    return [_row("a task that raises (its data is broken)", b, t0, go, leftovers=True)]


def s_emulate_killed(b: Bench) -> list[Row]:
    """`ray-saturn emulate` SIGKILLed: auth was on, no machine-wide address file, plain ray.init() works, resume."""
    from ray_head import cluster_environ

    t0 = time.monotonic()
    d = b.run_dir("emulate-killed")
    prof = b.work / "emu.csv"
    from ray_saturn import ProfileTable

    ProfileTable.from_rows([{"task": f"e{i}", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": n}
                            for i, n in enumerate((200, 1500, 1500, 1500))]).write(prof)
    env = {k: v for k, v in b.env.items() if not k.startswith("RAY_")}
    env["HOME"] = str(b.work)  # a plain ray.init() may write a token under HOME: keep it here
    address_file = Path("/tmp/ray/ray_current_cluster")

    def go() -> tuple[str, str, bool, float]:
        before = address_file.stat().st_mtime if address_file.exists() else None
        p = Proc([str(BIN / "ray-saturn"), "emulate", str(prof), "--nodes", "1", "--gpus-per-node", "2",
                  "--time-scale", "0.01", "--run-dir", d], env, b.work)
        every = 100

        def mid() -> dict[str, Any] | None:
            st = b.state(d)
            if not st:
                return None
            t = st["tasks"].values()
            going = any(r["state"] == "running" and 2 * every <= r["steps_done"] <= r["total_steps"] - every
                        for r in t)
            return st if going and any(r["state"] == "finished" for r in t) else None

        b.wait("the emulated run is mid-way", mid, p)
        private = cluster_environ(p.pid)
        if private.get("RAY_AUTH_MODE") != "token" or len(private.get("RAY_AUTH_TOKEN", "")) < 32:
            raise Failed("the emulated cluster runs without token auth")
        addr = (Path(private["RAY_TMPDIR"]) / "ray" / "ray_current_cluster").read_text().strip()
        if not addr.startswith("127.0.0.1:"):
            raise Failed(f"the emulated cluster listens on {addr}")
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
        at = b.state(d)
        temp = private["RAY_TMPDIR"]
        b.wait("the killed emulation's cluster processes end", lambda: not _processes_under(temp), budget=120)
        after = address_file.stat().st_mtime if address_file.exists() else None
        if after != before:
            raise Failed("emulate wrote the machine-wide /tmp/ray/ray_current_cluster")
        plain = ("import ray; ray.init(num_cpus=1, include_dashboard=False); "
                 "print('OK', ray.get(ray.remote(lambda: 2).remote())); ray.shutdown()")
        t1 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", plain], env=env, capture_output=True, text=True, timeout=240)
        if "OK 2" not in out.stdout:
            raise Failed(f"a plain ray.init() after the kill failed: {_tail(out.stderr)}")
        init_s = time.monotonic() - t1
        res = subprocess.run([str(BIN / "ray-saturn"), "resume", d, "--json"], env=env, capture_output=True,
                             text=True, timeout=BUDGET_S)
        result = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else None
        tasks = {t["task"]: t for t in (result or {}).get("tasks", [])}
        if result is None or result["state"] != "finished":
            raise Failed(f"resume of the emulation: exit {res.returncode}: {_tail(res.stderr)}")
        rerun = any(r["state"] == "finished" and len(tasks[t]["segments"]) > len(r["segments"])
                    for t, r in at["tasks"].items())
        if rerun:
            raise Failed("a finished task ran again")
        lost = max([(r["steps_done"] - tasks[t]["segments"][len(r["segments"])]["steps_start"]) / every
                    for t, r in at["tasks"].items() if r["state"] == "running"] or [0.0])
        if lost > 1.0:
            raise Failed(f"a task lost {lost:.2f} checkpoint intervals")
        return ("survived", f"token auth on, 127.0.0.1, no machine-wide address file; plain ray.init() after the "
                f"kill: {init_s:.0f} s; resume finished, worst loss {lost:.2f} interval", False, round(lost, 2))

    return [_row("`ray-saturn emulate` killed (SIGKILL), then plain ray.init() and resume", b, t0, go)]


def s_emulate_nodes(b: Bench) -> list[Row]:
    t0 = time.monotonic()

    def go() -> tuple[str, str]:
        out = b.cli("emulate", str(b.profile), "--nodes", "100000", "--gpus-per-node", "4", "--time-scale", "0.01",
                    "--run-dir", b.run_dir("emulate-nodes"), timeout=60)
        line = one_line_refusal(out, "--nodes")
        if time.monotonic() - t0 > 30:
            raise Failed(f"the refusal took {time.monotonic() - t0:.0f} s")
        return "refused", line

    return [_row("`ray-saturn emulate --nodes 100000`", b, t0, go)]


def _row(fault: str, b: Bench, t0: float, go: Callable[[], tuple], *, leftovers: bool = False) -> Row:
    try:
        got = go()
        row = Row(fault, b.kind, got[0], got[1])
        if len(got) == 4:
            row.finished_rerun, row.lost_intervals = got[2], got[3]
    except Failed as exc:
        row = Row(fault, b.kind, "FAILED", str(exc))
    except Exception as exc:  # a crash of the scenario is a failure of the row, with its reason
        row = Row(fault, b.kind, "FAILED", f"{type(exc).__name__}: {exc}"[:500])
    if not row.ok:
        b.end_runs()  # a scenario that failed half-way leaves no run of its own going
    if leftovers:
        row.leftovers = b.leftovers()
        if row.leftovers and row.ok:
            row.outcome, row.detail = "FAILED", f"left on the cluster: {', '.join(row.leftovers)[:200]}; {row.detail}"
    row.wall_s = round(time.monotonic() - t0, 1)
    print(f"[{b.kind}] {row.outcome:<8} {fault} ({row.wall_s:.0f} s): {row.detail[:200]}", flush=True)
    return row


SCENARIOS: dict[str, Callable[[Bench], list[Row]]] = {
    "kill-cli": s_kill_cli,
    "state-deleted": s_state_deleted,
    "state-truncated": s_state_truncated,
    "state-misshapen": s_state_misshapen,
    "driver-killed": s_driver_killed,
    "worker-killed": s_worker_killed,
    "checkpoint-corrupt": s_checkpoint_corrupt,
    "read-only": s_read_only,
    "task-raises": s_task_raises,
    "emulate-killed": s_emulate_killed,
    "emulate-nodes": s_emulate_nodes,
}


# ------------------------------------------------------------------ main
def run_matrix(kind: str, names: list[str], on_rows: Callable[[list[Row]], None] | None = None) -> list[Row]:
    """Run the scenarios ``names`` on one Ray head; ``on_rows`` gets each scenario's rows as they come."""
    import ray
    from ray_head import ray_head

    from ray_saturn.runtime.local import _reload_ray_auth

    work = Path(tempfile.mkdtemp(prefix=f"fm-{kind}-"))
    rows: list[Row] = []
    try:
        with contextlib.ExitStack() as stack:
            s3 = None
            if kind == "s3":
                from s3_server import s3_server

                s3 = stack.enter_context(s3_server())
                stack.enter_context(s3.credentials())
            head = stack.enter_context(ray_head(num_cpus=2, num_gpus=2))
            saved = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
            os.environ.update({k: head.env[k] for k in saved})
            _reload_ray_auth()  # Ray read its auth settings at import: read them again (the head's token)
            try:
                ray.init(address=head.gcs_address, log_to_driver=False, logging_level="ERROR")
                b = Bench(kind, work, head, s3)
                for name in names:
                    got = SCENARIOS[name](b)
                    rows += got
                    if on_rows is not None:
                        on_rows(got)
            finally:
                ray.shutdown()
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
                _reload_ray_auth()
    finally:
        subprocess.run(["chattr", "-R", "-i", str(work)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    return rows


def merge(path: Path, rows: list[Row]) -> list[dict[str, Any]]:
    old = json.loads(path.read_text()) if path.exists() else []
    keep = {(r["fault"], r["storage"]): r for r in old}
    for r in rows:
        keep[(r.fault, r.storage)] = {**asdict(r), "ok": r.ok}
    out = sorted(keep.values(), key=lambda r: (r["storage"], r["fault"]))
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


def table(rows: list[dict[str, Any]]) -> str:
    faults = list(dict.fromkeys(r["fault"] for r in rows))
    by = {(r["fault"], r["storage"]): r for r in rows}

    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return "not run"
        extra = "" if r.get("lost_intervals") is None else f", lost {r['lost_intervals']:.2f} interval"
        return f"{r['outcome']}{extra}"

    lines = ["| fault | local folder | S3 endpoint | what the user saw (local) |", "|---|---|---|---|"]
    for f in faults:
        loc, s3 = by.get((f, "local")), by.get((f, "s3"))
        seen = (loc or s3 or {}).get("detail", "").replace("|", "/")[:160]
        lines.append(f"| {f} | {cell(loc)} | {cell(s3)} | {seen} |")
    ok = sum(bool(r["ok"]) for r in rows)
    refused = sum(r["outcome"] == "refused" for r in rows)
    lines.append("")
    lines.append(f"faults injected: {len(rows)}, survived without loss: {ok} ({refused} of them refused in one line)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--storage", choices=("local", "s3"))
    ap.add_argument("--faults", default="all", help="comma-separated scenario names, or all: " + ", ".join(SCENARIOS))
    ap.add_argument("--out", type=Path, help="JSON file the rows merge into")
    ap.add_argument("--table", type=Path, metavar="JSON", help="print the table and the count of a results file")
    args = ap.parse_args()
    if args.table:
        rows = json.loads(args.table.read_text())
        print(table(rows))
        return 0 if all(r["ok"] for r in rows) else 1
    if not args.storage:
        ap.error("give --storage local|s3 (or --table FILE)")
    names = list(SCENARIOS) if args.faults == "all" else [n.strip() for n in args.faults.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    # `timeout` sends SIGTERM: end through the finally blocks (Ray head, S3 server, temp folders).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Each scenario's rows are merged into --out as they come (a run cut short keeps what it did).
    rows = run_matrix(args.storage, names, on_rows=(lambda got: merge(args.out, got)) if args.out else None)
    merged = merge(args.out, []) if args.out else [{**asdict(r), "ok": r.ok} for r in rows]
    print()
    print(table(merged))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
