"""Faults a careful user meets, without Ray: each one survived, or refused in one line.

- two runs on one run folder (the lease: refusal naming the owner, stale take-over, racing starts);
- a dead driver (``status`` says it is not seen, never "running" or "starting" forever);
- a truncated or misshapen ``state.json`` (its backup is used; one line, no traceback);
- a deleted ``state.json`` (rebuilt from ``events.jsonl``: nothing finished re-run, history kept);
- a run folder that turns read-only mid-run (the run stops in one line and stays resumable);
- a workload file changed between ``run`` and ``resume`` (refused unless passed explicitly);
- ``emulate --nodes 100000`` (refused before any process starts) and its private Ray environment.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time

import pytest

from ray_saturn import ClusterSpec, ProfileTable
from ray_saturn.cli import main
from ray_saturn.errors import SaturnError, SpecError
from ray_saturn.runtime.config import DriverConfig, RunSettings
from ray_saturn.runtime.driver import Driver, TaskRecord
from ray_saturn.runtime.fake import FakeLauncher, LedgerManager
from ray_saturn.runtime.journal import (
    PROFILE_FILE,
    RUN_FILE,
    STATE_BACKUP_FILE,
    STATE_FILE,
    Journal,
    RunFolderUnwritable,
)
from ray_saturn.runtime.lease import LEASE_FILE, LeaseInfo, RunLease, RunLocked, read_lease
from ray_saturn.runtime.rebuild import rebuild_state
from ray_saturn.runtime.status import run_status
from ray_saturn.runtime.storage import RunStorage, StorageError


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write_foreign_lease(store: RunStorage, *, pid: int, machine: str | None = None, age_s: float = 0.0,
                        command: str = "run", run_name: str = "other") -> LeaseInfo:
    mine = RunLease(store, command="probe").info
    info = LeaseInfo(
        owner="f" * 32,
        host="elsewhere" if machine else mine.host,
        machine=machine or mine.machine,
        pid=pid,
        pid_start=None,
        command=command,
        run_name=run_name,
        started_wall=time.time() - age_s,
        heartbeat_wall=time.time() - age_s,
    )
    store.write_bytes(LEASE_FILE, json.dumps(info.to_dict()).encode())
    return info


# ------------------------------------------------------------------ the lease
def test_a_second_run_on_a_live_folder_is_refused_naming_the_owner(tmp_path):
    store = RunStorage(tmp_path)
    with RunLease(store, command="emulate", run_name="first", settle_s=0).held(), pytest.raises(RunLocked) as err:
        RunLease(store, command="run", settle_s=0).acquire()
    msg = str(err.value)
    assert "\n" not in msg
    assert "`ray-saturn emulate` (run first, pid" in msg and str(os.getpid()) in msg
    assert not store.exists(LEASE_FILE), "the lease is released on the way out"


def test_a_lease_of_a_dead_process_is_taken_over_and_says_so(tmp_path, caplog):
    store = RunStorage(tmp_path)
    write_foreign_lease(store, pid=dead_pid(), run_name="killed")
    lease = RunLease(store, command="resume", settle_s=0)
    with caplog.at_level(logging.WARNING, logger="ray_saturn.runtime.lease"):
        taken = lease.acquire()
    assert taken is not None and taken.run_name == "killed"
    assert "taking over the lock of `ray-saturn run` (run killed" in caplog.text
    assert "its process is gone" in caplog.text
    assert read_lease(store).owner == lease.info.owner
    lease.release()


def test_a_reused_pid_is_not_the_owner(tmp_path):
    store = RunStorage(tmp_path)
    info = write_foreign_lease(store, pid=os.getpid())  # our pid, but another process start time
    from dataclasses import replace

    store.write_bytes(LEASE_FILE, json.dumps(replace(info, pid_start=1).to_dict()).encode())
    assert read_lease(store).process_gone()


def test_a_lease_on_another_machine_is_judged_by_its_heartbeat(tmp_path):
    store = RunStorage(tmp_path)
    write_foreign_lease(store, pid=1, machine="another|boot|ns", age_s=5)
    with pytest.raises(RunLocked, match="last seen 5 s ago"):
        RunLease(store, command="run", settle_s=0).acquire()
    write_foreign_lease(store, pid=1, machine="another|boot|ns", age_s=500)
    lease = RunLease(store, command="resume", settle_s=0, stale_after_s=60)
    assert lease.acquire() is not None  # stale: taken over
    lease.release()


@pytest.mark.parametrize(("heartbeat", "why"), [
    ("NaN", "its heartbeat nan is not a time"),
    ("Infinity", "its heartbeat inf is not a time"),
    ("1e18", "s in the future"),
])
def test_a_lease_with_a_heartbeat_that_is_no_time_is_stale(tmp_path, caplog, heartbeat, why):
    """A NaN, infinite or far-future heartbeat read as 'last seen 0 s ago': the folder was locked for good."""
    store = RunStorage(tmp_path)
    info = write_foreign_lease(store, pid=1, machine="another|boot|ns", run_name="odd")
    store.write_bytes(LEASE_FILE, json.dumps(info.to_dict()).replace(
        f'"heartbeat_wall": {info.heartbeat_wall!r}', f'"heartbeat_wall": {heartbeat}').encode())
    assert not read_lease(store).alive()
    lease = RunLease(store, command="resume", settle_s=0)
    with caplog.at_level(logging.WARNING, logger="ray_saturn.runtime.lease"):
        assert lease.acquire() is not None
    assert "taking over the lock of `ray-saturn run` (run odd" in caplog.text and why in caplog.text
    lease.release()


def test_the_refusals_say_how_to_take_a_folder_over(tmp_path):
    store = RunStorage(tmp_path)
    write_foreign_lease(store, pid=1, machine="another|boot|ns", age_s=5)
    with pytest.raises(RunLocked, match=f"if it no longer runs, delete {tmp_path}/{LEASE_FILE} to take"):
        RunLease(store, command="run", settle_s=0).acquire()
    store.write_bytes(LEASE_FILE, b"{not json")
    with pytest.raises(RunLocked, match=f"is damaged, delete {tmp_path}/{LEASE_FILE}"):
        RunLease(store, command="run", settle_s=0).acquire()


def test_two_starts_racing_on_a_store_without_atomic_create_the_last_writer_wins(monkeypatch):
    import uuid

    store = RunStorage(f"memory://race-{uuid.uuid4().hex[:8]}/run")  # fsspec memory: create is check-then-write
    assert not store.exclusive_create_is_atomic
    first = RunLease(store, command="emulate", settle_s=0.01)
    import ray_saturn.runtime.lease as lease_mod

    real_sleep = time.sleep

    def other_writes_meanwhile(s):
        write_foreign_lease(store, pid=os.getpid(), run_name="racer")  # lands after ours
        real_sleep(s)

    monkeypatch.setattr(lease_mod.time, "sleep", other_writes_meanwhile)
    with pytest.raises(RunLocked, match="run racer"):
        first.acquire()
    assert read_lease(store).run_name == "racer", "the winner's lease is left alone"


def test_two_resumes_taking_over_one_stale_lease_one_wins(tmp_path):
    store = RunStorage(tmp_path)
    write_foreign_lease(store, pid=dead_pid(), run_name="killed")
    a = RunLease(store, command="resume", settle_s=0)
    b = RunLease(store, command="resume", settle_s=0)
    assert a.acquire() is not None
    with pytest.raises(RunLocked, match="is in use by `ray-saturn resume`"):
        b.acquire()
    a.release()


def test_a_holder_learns_its_lease_was_taken_and_stops(tmp_path):
    store = RunStorage(tmp_path)
    lease = RunLease(store, command="run", settle_s=0)
    lease.acquire()
    write_foreign_lease(store, pid=os.getpid(), run_name="thief")
    lease.renew()
    assert lease.lost is not None
    with pytest.raises(RunLocked, match="took over this run folder"):
        lease.check()
    lease.release()
    assert read_lease(store).run_name == "thief", "release never removes another owner's lease"


def test_emulate_on_a_live_folder_refuses_before_starting_anything(tmp_path, small_profile, capsys):
    store = RunStorage(tmp_path / "run")
    small_profile.write(tmp_path / "p.csv")
    with RunLease(store, command="emulate", run_name="first", settle_s=0).held():
        code = main(["emulate", str(tmp_path / "p.csv"), "--nodes", "2", "--gpus-per-node", "4",
                     "--time-scale", "0.01", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "is in use by `ray-saturn emulate` (run first" in err
    assert not (tmp_path / "run" / RUN_FILE).exists(), "the live run's folder was not touched"


def test_a_folder_holding_a_run_names_its_live_owner_or_says_resume(tmp_path, small_profile, capsys):
    small_profile.write(tmp_path / "p.csv")
    store = RunStorage(tmp_path / "run")
    store.write_json(RUN_FILE, RunSettings(name="first", mode="emulate").to_dict())
    args = ["emulate", str(tmp_path / "p.csv"), "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "0.01",
            "--run-dir", str(tmp_path / "run")]
    with RunLease(store, command="emulate", run_name="first", settle_s=0).held():
        assert main(args) == 2
    assert "is in use by `ray-saturn emulate` (run first" in capsys.readouterr().err
    assert main(args) == 2  # the run is over (or dead): its folder is not reused
    err = capsys.readouterr().err
    assert "already holds a run; resume it with `ray-saturn resume" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------ state.json and status
def state(driver_state="running", steps=5):
    return {
        "driver_state": driver_state,
        "time_s": 12.0,
        "updated_wall": time.time(),
        "tasks": {"a": {"task": "a", "state": "running", "steps_done": steps, "total_steps": 10,
                        "segments": []}},
    }


def test_state_json_keeps_a_backup_and_a_truncated_one_falls_back(tmp_path, caplog):
    j = Journal(RunStorage(tmp_path))
    j.write_state(state(steps=3))
    j.write_state(state(steps=4))
    assert json.loads((tmp_path / STATE_BACKUP_FILE).read_text())["tasks"]["a"]["steps_done"] == 3
    data = (tmp_path / STATE_FILE).read_bytes()
    (tmp_path / STATE_FILE).write_bytes(data[: len(data) // 2])  # truncated
    with caplog.at_level(logging.WARNING):
        loaded = j.load_state()
    assert loaded.source == STATE_BACKUP_FILE and loaded.state["tasks"]["a"]["steps_done"] == 3
    assert "state.json is not valid JSON" in caplog.text
    # The next write keeps the good backup: a damaged state.json is never backed up.
    j2 = Journal(RunStorage(tmp_path))
    j2.write_state(state(steps=6))
    assert json.loads((tmp_path / STATE_BACKUP_FILE).read_text())["tasks"]["a"]["steps_done"] == 3


@pytest.mark.parametrize("bad", [[1, 2], {"driver_state": "running", "tasks": {"a": {"task": "a"}}},
                                 {"driver_state": "running", "tasks": []}, {"tasks": {}}])
def test_a_misshapen_state_is_one_line_never_a_traceback(tmp_path, capsys, bad):
    store = RunStorage(tmp_path)
    store.write_json(RUN_FILE, RunSettings(name="r", mode="emulate").to_dict())
    store.write_json(STATE_FILE, bad)
    with pytest.raises(StorageError) as err:
        Journal(store).read_state()
    assert "\n" not in str(err.value) and "state.json is not" in str(err.value)
    assert main(["status", str(tmp_path)]) == 2  # no backup, no events: nothing readable to show
    out = capsys.readouterr()
    assert "Traceback" not in out.err and out.out == ""
    assert out.err.count("\n") == 1 and "no readable run state (state.json is not" in out.err


def test_status_of_a_run_folder_of_garbage_is_one_line_exit_2(tmp_path, capsys):
    for name in (RUN_FILE, STATE_FILE, STATE_BACKUP_FILE, PROFILE_FILE, "events.jsonl", "plan.json"):
        (tmp_path / name).write_text("garbage{{\n")
    with pytest.raises(StorageError, match=r"no readable run state \(state.json is not valid JSON"):
        run_status(tmp_path)
    assert main(["status", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1, out.err
    assert out.err.startswith("ray-saturn status: error: ") and "state.json.bak is not valid JSON" in out.err
    assert "profile.parquet is damaged" in out.err and "put back a good state.json" in out.err
    assert "and " + str(tmp_path / RUN_FILE) + " is not valid JSON" in out.err
    # A readable backup is still a fallback: shown, but the damaged run.json (resume needs it) is exit 2.
    Journal(RunStorage(tmp_path)).storage.write_json(STATE_BACKUP_FILE, state())
    assert main(["status", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert "showing state.json.bak" in out.out and "run.json is not valid JSON" in out.err
    # ... and with a good run.json, exit 0.
    RunStorage(tmp_path).write_json(RUN_FILE, RunSettings(name="r", mode="emulate").to_dict())
    assert main(["status", str(tmp_path)]) == 0
    assert "showing state.json.bak" in capsys.readouterr().out


def test_status_says_a_killed_driver_is_not_seen(tmp_path, capsys):
    store = RunStorage(tmp_path)
    store.write_json(RUN_FILE, RunSettings(name="r", mode="emulate").to_dict())
    st = state()
    st["updated_wall"] = time.time() - 100
    Journal(store).write_state(st)
    write_foreign_lease(store, pid=dead_pid(), age_s=40)  # kill -9: the lease stays behind
    got = run_status(tmp_path)
    assert not got["driver"]["alive"] and got["driver_state"] == "stopped"
    assert main(["status", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"driver not seen for 40 s: run `ray-saturn resume {tmp_path}`"
    # its task is not shown running with an ETA (nothing runs it): stopped, at its steps
    row = next(x for x in lines if x.startswith("a "))
    assert row.split()[1] == "stopped" and "5/10" in row and "running" not in row


def test_status_of_a_live_run_names_its_driver(tmp_path):
    store = RunStorage(tmp_path)
    store.write_json(RUN_FILE, RunSettings(name="r", mode="emulate").to_dict())
    with RunLease(store, command="emulate", run_name="r", settle_s=0).held():
        got = run_status(tmp_path)
        assert got["driver"]["alive"] and got["driver_state"] == "starting"
        Journal(store).write_state(state())
        got = run_status(tmp_path)
        assert got["driver_state"] == "running" and got["driver"]["note"].startswith("driver: running (")


def test_status_without_state_json_is_not_starting_forever(tmp_path):
    store = RunStorage(tmp_path)
    store.write_json(RUN_FILE, RunSettings(name="r", mode="emulate").to_dict())  # the run died early
    got = run_status(tmp_path)
    assert got["driver_state"] == "stopped"
    assert "driver not running" in got["driver"]["note"]


# ------------------------------------------------ the fake driver: rebuild, read-only folder
def profile() -> ProfileTable:
    return ProfileTable.from_rows(
        [{"task": f"t{i}", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": n}
         for i, n in enumerate((40, 100, 150))]
    )


def config() -> DriverConfig:
    return DriverConfig(solver_time_limit_s=1.0, checkpoint_interval_s=10.0, poll_wall_s=2.0, restart_s=5.0,
                        node_check_wall_s=0.0)


def run_until_one_finishes(tmp_path):
    launcher = FakeLauncher()
    d = Driver(profile(), LedgerManager(ClusterSpec.uniform(1, 2)), launcher, RunStorage(tmp_path), config())
    while not any(r.state == "finished" for r in d.records.values()):
        d.step()
    for _ in range(5):
        d.step()
    d.persist(force=True)
    return d, launcher


def test_deleted_state_json_is_rebuilt_from_events_without_rerunning_finished_tasks(tmp_path):
    _, first = run_until_one_finishes(tmp_path)
    truth = Journal(RunStorage(tmp_path)).read_state()
    (tmp_path / STATE_FILE).unlink()
    (tmp_path / STATE_BACKUP_FILE).unlink()
    rebuilt = rebuild_state(Journal(RunStorage(tmp_path)).events(), profile())
    done = {t for t, r in truth["tasks"].items() if r["state"] == "finished"}
    assert set(rebuilt.finished) == done and done
    assert rebuilt.state["planned_makespan_s"] == pytest.approx(truth["planned_makespan_s"], abs=0.01)
    assert rebuilt.state["time_s"] <= truth["time_s"]
    assert rebuilt.state["time_s"] >= max(s["start_s"] for r in truth["tasks"].values() for s in r["segments"])
    for t, r in truth["tasks"].items():
        got = rebuilt.state["tasks"][t]
        assert got["attempts"] == r["attempts"]
        assert [s["start_s"] for s in got["segments"]] == [s["start_s"] for s in r["segments"]]
    assert any("not in the events" in n for n in rebuilt.notes), "it says what it could not rebuild"
    # Resume from the rebuilt state: finished tasks are not launched again, the history stays.
    second = FakeLauncher()
    second.checkpoints = dict(first.checkpoints)
    d2 = Driver(profile(), LedgerManager(ClusterSpec.uniform(1, 2)), second, RunStorage(tmp_path), config(),
                records={t: TaskRecord.from_dict(r) for t, r in rebuilt.state["tasks"].items()},
                clock_offset_s=rebuilt.state["time_s"], planned_makespan_s=rebuilt.state["planned_makespan_s"])
    result = d2.run(max_steps=10_000)
    assert result.state == "finished"
    assert not {s.task for s in second.launched} & done, "finished tasks are not run again"
    assert result.realised_makespan_s > truth["time_s"] - 1e-6
    for t in done:
        assert len(result.tasks[t].segments) == len(truth["tasks"][t]["segments"])


def test_a_run_folder_turning_read_only_stops_the_run_in_one_line_and_it_resumes(tmp_path, monkeypatch):
    launcher = FakeLauncher()
    store = RunStorage(tmp_path)
    mgr = LedgerManager(ClusterSpec.uniform(1, 2))
    d = Driver(profile(), mgr, launcher, store, config())
    while not any(r.state == "finished" for r in d.records.values()):
        d.step()
    d.persist(force=True)
    good = (tmp_path / STATE_FILE).read_bytes()

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr(RunStorage, "write_bytes", denied)
    monkeypatch.setattr(RunStorage, "append_jsonl", denied)
    result = d.run(max_steps=10_000)  # must not raise: the failure handler itself writes nothing more
    assert result.state == "failed"
    assert "\n" not in result.reason and "cannot write" in result.reason and "ray-saturn resume" in result.reason
    assert mgr.ledger.reservations() == [], "every GPU was handed back"
    monkeypatch.undo()
    assert (tmp_path / STATE_FILE).read_bytes() == good, "the last good state is still there"
    # Writable again: resume continues from it.
    st = Journal(store).read_state()
    second = FakeLauncher()
    second.checkpoints = dict(launcher.checkpoints)
    d2 = Driver(profile(), LedgerManager(ClusterSpec.uniform(1, 2)), second, store, config(),
                records={t: TaskRecord.from_dict(r) for t, r in st["tasks"].items()}, clock_offset_s=st["time_s"])
    assert d2.run(max_steps=10_000).state == "finished"


def test_a_journal_write_error_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    j = Journal(RunStorage(tmp_path))

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(RunStorage, "append_jsonl", denied)
    with pytest.raises(RunFolderUnwritable, match=r"cannot write .*events.jsonl .*ray-saturn resume"):
        j.event({"kind": "x"})


# ---------------------------------------------------------------- workloads
WORKLOAD = """
import torch
from ray_saturn import Task


def make_data(hp):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 2, generator=g), torch.randn(8, 1, generator=g)) for _ in range(2)]


def my_loss(out, batch):
    return ((out - batch[1]) ** 2).mean()


def sgd(params, hp):
    return torch.optim.SGD(params, lr=0.1)


tasks = [Task("w", lambda hp: torch.nn.Linear(2, 1), make_data, my_loss, sgd, {}, max_steps=4)]
"""


def train_folder(tmp_path, workload, digest):
    store = RunStorage(tmp_path / "run")
    store.write_json(RUN_FILE, RunSettings(name="r", mode="train", workload=str(workload),
                                           workload_digest=digest).to_dict())
    Journal(store).write_profile(ProfileTable.from_rows(
        [{"task": "w", "strategy": "single", "gpus": 1, "step_time_s": 1.0, "steps": 4}]))
    return store


def test_resume_refuses_a_changed_workload_file_unless_it_is_passed(tmp_path, capsys):
    from ray_saturn.runtime.api import _trusted_workload, resume
    from ray_saturn.workload_file import workload_digest

    wl = tmp_path / "sweep.py"
    wl.write_text(WORKLOAD)
    store = train_folder(tmp_path, wl, workload_digest(wl))
    wl.write_text(WORKLOAD + "\nimport os  # someone edited it\n")
    with pytest.raises(SaturnError, match=r"changed since the run started .*--workload"):
        resume(tmp_path / "run")
    assert main(["resume", str(tmp_path / "run")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    settings = RunSettings.from_dict(store.read_json(RUN_FILE))
    tasks, settings = _trusted_workload(Journal(store), settings, wl)  # passed explicitly: the user's word
    assert [t.name for t in tasks] == ["w"] and settings.workload_digest == workload_digest(wl)
    store.write_json(RUN_FILE, settings.to_dict())  # what resume records once it holds the folder
    tasks, _ = _trusted_workload(Journal(store), settings, None)  # and recorded from then on
    assert [t.name for t in tasks] == ["w"]


def test_a_refused_resume_leaves_the_dead_runs_lock_for_the_next_resume(tmp_path, caplog):
    """A resume refused for a changed workload file touches nothing: the killed run's stale lock is
    still there, so the resume that follows takes it over and says whose it was (and rebuilds with
    its last heartbeat). Before, the refused resume took the lock over, then released it."""
    from ray_saturn.runtime.api import resume
    from ray_saturn.workload_file import workload_digest

    wl = tmp_path / "sweep.py"
    wl.write_text(WORKLOAD)
    store = train_folder(tmp_path, wl, workload_digest(wl))
    dead = write_foreign_lease(store, pid=dead_pid(), run_name="killed")
    wl.write_text(WORKLOAD + "\nimport os  # someone edited it\n")
    with caplog.at_level(logging.WARNING), pytest.raises(SaturnError, match="changed since the run started"):
        resume(tmp_path / "run")
    assert "taking over the lock" not in caplog.text
    left = read_lease(store)
    assert left is not None and left.owner == dead.owner, "the refused resume removed the dead run's lock"


def test_resume_refuses_a_workload_without_a_recorded_hash(tmp_path):
    from ray_saturn.runtime.api import resume

    wl = tmp_path / "sweep.py"
    wl.write_text(WORKLOAD)
    train_folder(tmp_path, wl, None)  # run.json rewritten by someone: the hash removed
    with pytest.raises(SaturnError, match="records no SHA-256 of the workload file"):
        resume(tmp_path / "run")


@pytest.mark.parametrize("damage", [b"garbage", b"PAR1"])
def test_resume_with_a_damaged_profile_is_one_line_naming_the_file(tmp_path, capsys, damage):
    from ray_saturn.workload_file import workload_digest

    wl = tmp_path / "sweep.py"
    wl.write_text(WORKLOAD)
    train_folder(tmp_path, wl, workload_digest(wl))
    (tmp_path / "run" / PROFILE_FILE).write_bytes(damage)
    assert main(["resume", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"run/{PROFILE_FILE} is damaged" in err and "put back the profile the run started with" in err
    assert not (tmp_path / "run" / LEASE_FILE).exists(), "the lock is released"


def test_resume_of_a_run_stopped_before_its_profile_was_written_says_so(tmp_path, capsys):
    # It said "profile.parquet does not exist; is this a ray_saturn run folder?" of the run's own folder.
    from ray_saturn.workload_file import workload_digest

    wl = tmp_path / "sweep.py"
    wl.write_text(WORKLOAD)
    train_folder(tmp_path, wl, workload_digest(wl))
    (tmp_path / "run" / PROFILE_FILE).unlink()
    assert main(["resume", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "has the run's run.json but no profile.parquet: the run stopped before its profile was written" in err
    assert "start it again in a new folder" in err


@pytest.mark.parametrize(("field", "value", "message"), [
    ("workload", 5, r"run.json: workload is 5, not the path of a workload file.*--workload FILE"),
    ("workload_digest", 5, r"records no SHA-256 of the workload file .*--workload"),
])
def test_resume_with_a_wrongly_typed_run_json_field_is_one_line(tmp_path, capsys, field, value, message):
    from ray_saturn.workload_file import workload_digest

    wl = tmp_path / "sweep.py"
    wl.write_text(WORKLOAD)
    store = train_folder(tmp_path, wl, workload_digest(wl))
    store.write_json(RUN_FILE, store.read_json(RUN_FILE) | {field: value})
    assert main(["resume", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert re.search(message, err), err


def test_a_misshapen_run_json_is_one_line(tmp_path):
    from ray_saturn.runtime.api import resume

    RunStorage(tmp_path).write_json(RUN_FILE, {"name": "r", "mode": "train", "bogus": 1})
    with pytest.raises(StorageError, match="is not the settings of a run") as err:
        resume(tmp_path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("damage", "what"), [
    (b"[]", "it holds a JSON list, not an object of run settings"),
    (b"{}", "it has no name or mode"),
    (b"garbage{{", "is not valid JSON"),
    (b'{"name": 5, "mode": "emulate"}', "run name 5 must be"),
    (b'{"name": "r", "mode": "emulate", "driver": []}', "driver is a JSON list, not an object"),
    (b'{"name": "r", "mode": "emulate", "driver": {"objective": 5}}', "objective is 5; choose one of"),
    (b'{"name": "r", "mode": "emulate", "arrivals": 5}', "arrivals is 5; give an object"),
    (b'{"name": "r", "mode": "emulate", "report_interval_s": "x"}', "report_interval_s is 'x'"),
])
def test_status_and_resume_of_a_damaged_run_json_are_one_line_exit_2(tmp_path, capsys, monkeypatch, damage, what):
    """status showed the run and exited 0 (an empty table when no state was written), while resume said
    'RunSettings.__init__() missing 2 required positional arguments' or started a driver that died."""
    no_cluster(monkeypatch)
    store = emulated_folder(tmp_path)
    (tmp_path / "run" / RUN_FILE).write_bytes(damage)
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    for command in ("status", "resume"):
        assert main([command, store.uri]) == 2, command
        out = capsys.readouterr()
        assert out.err.startswith(f"ray-saturn {command}: error: ") and out.err.count("\n") == 1, out.err
        assert f"run/{RUN_FILE}" in out.err and what in out.err, out.err
        assert f"put back the {RUN_FILE} the run started with" in out.err, out.err
        assert "Traceback" not in out.err and "__init__" not in out.err and "positional" not in out.err
        if command == "status":  # what the state shows is still shown, with how to resume once mended
            assert "once run.json is mended" in out.out and "5/10" in out.out, out.out
    assert main(["status", "--json", store.uri]) == 2
    out = capsys.readouterr()
    assert what in json.loads(out.out)["settings_problem"] and out.err.count("\n") == 1
    got = run_status(store.uri)
    assert got["tasks"]["a"]["steps_done"] == 5 and what in got["settings_problem"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before, "nothing was written"
    # Nothing else to show (no state written yet): status is the one-line error, not an empty status.
    (tmp_path / "run" / STATE_FILE).unlink()
    (tmp_path / "run" / STATE_BACKUP_FILE).unlink(missing_ok=True)
    assert main(["status", store.uri]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and what in out.err, out


# ---------------------------------------------------------------- emulate
def test_emulate_refuses_too_many_nodes_before_any_process_starts(tmp_path, small_profile, capsys):
    small_profile.write(tmp_path / "p.csv")
    t0 = time.monotonic()
    code = main(["emulate", str(tmp_path / "p.csv"), "--nodes", "100000", "--gpus-per-node", "4",
                 "--time-scale", "0.01", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--nodes" in err and "100000" in err  # the CLI's range check, or the machine's limit below
    assert time.monotonic() - t0 < 10
    assert not (tmp_path / "run").exists(), "nothing was written or started"
    import ray

    assert not ray.is_initialized()


def test_the_library_refuses_more_emulated_nodes_than_the_machine_holds():
    from ray_saturn.errors import SpecError
    from ray_saturn.runtime.emulation import check_emulated_nodes, emulated_cluster

    with pytest.raises(SpecError, match=r"--nodes 100000 is more than this machine can emulate.*give --nodes <="):
        check_emulated_nodes(100000)
    with pytest.raises(SpecError, match="more than this machine can emulate"), emulated_cluster(100000, 4):
        pass
    import ray

    assert not ray.is_initialized()


def test_emulated_gpus_per_node_count_as_worker_slots(tmp_path, small_profile, capsys):
    """Each emulated node gets a CPU slot (an idle Ray worker) per GPU: 32 nodes x 1024 GPUs started
    32,768 workers and hung; now refused before any process starts, naming the limit."""
    from ray_saturn.runtime.emulation import MAX_EMULATED_WORKERS, check_emulated_nodes

    assert check_emulated_nodes(2, 4) == 2
    with pytest.raises(SpecError, match=r"32 emulated nodes x 1024 GPUs = 32768 worker slots .*limit "
                                        rf"\({MAX_EMULATED_WORKERS} slots.*give --nodes x --gpus-per-node <="):
        check_emulated_nodes(32, 1024)
    small_profile.write(tmp_path / "p.csv")
    t0 = time.monotonic()
    code = main(["emulate", str(tmp_path / "p.csv"), "--nodes", "2", "--gpus-per-node", "1024",
                 "--time-scale", "0.01", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "2048 worker slots" in err, err
    assert time.monotonic() - t0 < 10 and not (tmp_path / "run").exists()
    import ray

    assert not ray.is_initialized()


@pytest.mark.parametrize(("cluster", "message"), [
    ({"nodes": 0, "gpus_per_node": 1}, "emulated_cluster.nodes is 0"),
    ({"nodes": 1, "gpus_per_node": -1}, "emulated_cluster.gpus_per_node is -1"),
    ({"nodes": "x", "gpus_per_node": 1}, "emulated_cluster.nodes is 'x'"),
    ({"nodes": 2, "gpus_per_node": 1024}, "2048 worker slots .*resume it on a larger machine"),
])
def test_a_resumed_emulation_names_run_json_not_flags(tmp_path, capsys, cluster, message):
    store = RunStorage(tmp_path / "run")
    store.write_json(RUN_FILE, RunSettings(name="r", mode="emulate", time_scale=0.01,
                                           emulated_cluster=cluster).to_dict())
    Journal(store).write_profile(ProfileTable.from_rows(
        [{"task": "w", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 4}]))
    assert main(["resume", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--nodes" not in err and "--gpus-per-node" not in err, err
    assert re.search(f"run/{RUN_FILE}: .*{message}", err), err
    import ray

    assert not ray.is_initialized()


def emulated_folder(tmp_path, driver_state="running"):
    store = RunStorage(tmp_path / "run")
    store.write_json(RUN_FILE, RunSettings(name="r", mode="emulate", time_scale=0.01,
                                           emulated_cluster={"nodes": 1, "gpus_per_node": 1}).to_dict())
    Journal(store).write_profile(ProfileTable.from_rows(
        [{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10}]))
    Journal(store).write_state(state(driver_state=driver_state))
    return store


def no_cluster(monkeypatch):
    import ray_saturn.runtime.api as api

    def refuse(*a, **k):
        raise AssertionError("started a cluster or driver")

    for name in ("emulated_context", "connected", "start_driver"):
        monkeypatch.setattr(api, name, refuse)


def test_resuming_an_emulated_run_with_a_workload_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """An emulated run has no workload file: --workload was ignored (the run went on as emulated)."""
    from ray_saturn.runtime.api import resume

    no_cluster(monkeypatch)
    store = emulated_folder(tmp_path)
    wl = tmp_path / "sweep.py"
    wl.write_text(WORKLOAD)
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert main(["resume", str(tmp_path / "run"), "--workload", str(wl)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1, out.err
    assert out.err.startswith("ray-saturn resume: error: ") and "is an emulated run: it has no workload file" in out.err
    assert "resume it without --workload" in out.err
    with pytest.raises(SpecError, match="is an emulated run"):
        resume(store.uri, tasks=[])
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before, "nothing was written"


def test_resuming_a_finished_run_starts_nothing_and_says_so(tmp_path, capsys, monkeypatch, caplog):
    """A finished emulated run's resume started an emulated cluster (about 15 s) and a driver, which
    found nothing to do, and moved the run's end by that time; now the state is read first."""
    from ray_saturn.runtime.api import resume

    no_cluster(monkeypatch)
    store = emulated_folder(tmp_path, driver_state="finished")
    st = store.read_json(STATE_FILE) | {"planned_makespan_s": 9.5, "replans": 2, "moves": 1}
    st["tasks"]["a"].update(state="finished", steps_done=10)
    Journal(store).write_state(st)
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    with caplog.at_level(logging.WARNING):
        result = resume(store.uri)
    assert "the run already finished; nothing to resume" in caplog.text
    assert (result.state, result.planned_makespan_s, result.realised_makespan_s) == ("finished", 9.5, 12.0)
    assert (result.replans, result.moves, list(result.tasks)) == (2, 1, ["a"])
    assert main(["resume", str(tmp_path / "run")]) == 0
    assert "run finished: makespan 12 s (planned 10 s), 2 re-plan(s), 1 move(s)" in capsys.readouterr().out
    after = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    assert after == before, "nothing was written (no lock, no event, no new state)"


@pytest.mark.parametrize("link", ["tasks/a", "tasks/a/emulated"])
def test_resume_refuses_a_task_folder_linked_out_of_the_run_folder_before_anything_starts(
        tmp_path, capsys, monkeypatch, link):
    """The driver opened the task folders only once started: the resume started a cluster and a driver
    that died on the link ('the driver died (RayTaskError(StorageError) ...); resume continues the run')."""
    no_cluster(monkeypatch)
    store = emulated_folder(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "run" / link).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "run" / link).symlink_to(outside)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert main(["resume", store.uri]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1, out.err
    assert f"run/{link}: a symbolic link leads out of the run folder (to {outside})" in out.err
    assert "remove the link" in out.err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before, "nothing was written"


def test_the_private_ray_environment_is_restored_on_exit(monkeypatch):
    from ray_saturn.runtime.emulation import private_ray_environment

    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/somewhere/token")
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    with pytest.raises(RuntimeError), private_ray_environment() as temp:
        assert os.environ["RAY_TMPDIR"] == temp and os.path.isdir(temp)
        assert os.environ["RAY_AUTH_MODE"] == "token" and len(os.environ["RAY_AUTH_TOKEN"]) == 64
        assert "RAY_AUTH_TOKEN_PATH" not in os.environ
        raise RuntimeError("an exit path")
    assert "RAY_TMPDIR" not in os.environ and os.environ["RAY_AUTH_TOKEN_PATH"] == "/somewhere/token"
    assert not os.path.exists(temp)


def test_check_emulated_nodes_rejects_non_numbers():
    from ray_saturn.runtime.emulation import check_emulated_nodes

    assert check_emulated_nodes(2) == 2
    for bad in (0, -1, 2.5, True):
        with pytest.raises(SpecError):
            check_emulated_nodes(bad)


# ------------------------------------------------------------ what a run says
def _ended(states: dict[str, str]):
    from ray_saturn.runtime.records import DriverResult

    tasks = {t: TaskRecord.from_dict({"task": t, "state": s, "total_steps": 10,
                                      "steps_done": 10 if s == "finished" else 3,
                                      "reason": "ValueError: boom" if s == "failed" else ""})
             for t, s in states.items()}
    return DriverResult(state="finished", planned_makespan_s=10.0, realised_makespan_s=12.0, replans=0, moves=0,
                        tasks=tasks)


def test_a_run_whose_every_task_failed_does_not_say_finished(capsys):
    from ray_saturn.cli.run import print_result

    result = _ended({"a": "failed", "b": "failed"})  # the driver ended: nothing left to run
    print_result(result, as_json=True)
    out = json.loads(capsys.readouterr().out)
    assert out["state"] == "failed" and out["failed_tasks"] == 2
    assert "every task failed" in out["reason"] and "boom" in out["reason"] and "\n" not in out["reason"]
    print_result(result, as_json=False)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("run failed") and "every task failed" in last


def test_a_run_with_some_failed_tasks_says_how_many(capsys):
    from ray_saturn.cli.run import print_result

    result = _ended({"a": "finished", "b": "failed", "c": "finished"})
    print_result(result, as_json=True)
    out = json.loads(capsys.readouterr().out)
    assert out["state"] == "finished" and out["failed_tasks"] == 1
    print_result(result, as_json=False)
    assert "run finished with 1 of 3 tasks failed" in capsys.readouterr().out
    print_result(_ended({"a": "finished"}), as_json=True)
    out = json.loads(capsys.readouterr().out)
    assert out["state"] == "finished" and out["failed_tasks"] == 0


def test_status_of_a_run_whose_every_task_failed_says_failed(tmp_path, capsys):
    store = RunStorage(tmp_path)
    store.write_json(RUN_FILE, RunSettings(name="r", mode="train").to_dict())
    st = state(driver_state="finished")
    st["tasks"]["a"].update(state="failed", reason="ValueError: boom")
    Journal(store).write_state(st)
    got = run_status(tmp_path)
    assert got["driver_state"] == "failed" and got["failed_tasks"] == 1 and "every task failed" in got["reason"]
    assert main(["status", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "driver: failed" and lines[1].startswith("run: failed")
    st["tasks"]["b"] = {"task": "b", "state": "finished", "steps_done": 10, "total_steps": 10, "segments": []}
    Journal(store).write_state(st)
    got = run_status(tmp_path)
    assert got["driver_state"] == "finished" and got["failed_tasks"] == 1
    assert main(["status", str(tmp_path)]) == 0
    assert "run: finished with 1 of 2 tasks failed" in capsys.readouterr().out
