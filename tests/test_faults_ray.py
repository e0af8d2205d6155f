"""Faults on a real local Ray cluster: what a dead run leaves is ended; emulation is private and locked.

- ``reclaim_dead_runs`` ends the actors (also detached ones, like Ray Train's
  ``PlacementGroupCleaner``) and placement groups that a dead driver's family
  left, and nothing of a live driver;
- a SIGKILLed ``ray-saturn emulate`` run: its cluster had token auth on and
  listened on 127.0.0.1, it wrote no machine-wide address file, a plain
  ``ray.init()`` afterwards starts normally, ``status`` says the driver is
  not seen, and ``resume`` takes the stale lock over (saying so) and
  finishes without re-running a finished task.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
from ray_head import cluster_environ

from ray_saturn import ProfileTable
from ray_saturn.runtime.emulation import emulated_cluster
from ray_saturn.runtime.journal import EVENTS_FILE, STATE_FILE
from ray_saturn.runtime.reclaim import reclaim_dead_runs
from ray_saturn.runtime.storage import RunStorage

pytestmark = pytest.mark.ray

BIN = Path(sys.executable).parent
#: How long a loaded 2-core machine may take to start a local cluster and a driver.
BUDGET_S = 300.0


def _wait(pred, what: str, budget: float = BUDGET_S, every: float = 0.2):
    t0 = time.monotonic()
    while time.monotonic() - t0 < budget:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"{what}: not within {budget:.0f} s")


def _pg_state(pg) -> str:
    return ray.util.placement_group_table(pg).get("state", "REMOVED")


def _actor_state(actor) -> str:
    """The state of an actor, given its handle or its id (hex)."""
    from ray._private.state import actors

    return actors(actor if isinstance(actor, str) else actor._actor_id.hex()).get("State", "DEAD")


def _recorded_class(handle) -> str:
    from ray._private.state import actors

    return actors(handle._actor_id.hex())["ActorClassName"]


def test_reclaim_ends_what_a_dead_driver_left_and_nothing_of_a_live_one():
    from ray.util.placement_group import placement_group

    from ray_saturn.runtime.actor import DRIVER_NAMESPACE, DriverActor, driver_name

    with emulated_cluster(1, 2):
        # The class name Ray records for the real driver actor, read from the GCS table.
        real = DriverActor().options(name=driver_name("realrun"), namespace=DRIVER_NAMESPACE).remote()
        assert ray.get(real.status.remote()) == {"driver_state": "starting"}
        real_class = _recorded_class(real)
        ray.kill(real, no_restart=True)

        # Ray records a class's __qualname__: these local classes get the names of the real ones.
        class PlacementGroupCleaner:  # the class name Ray Train's detached helper has
            def ping(self):
                return True

        PlacementGroupCleaner.__qualname__ = "PlacementGroupCleaner"
        PlacementGroupCleaner = ray.remote(num_cpus=0)(PlacementGroupCleaner)

        def driver_cls(qualname: str):
            class FakeDriver:  # the root of what a run owns
                def start(self, run):
                    self.pg = placement_group([{"GPU": 0.5}], name=f"ray_saturn:{run}:t0")
                    self.train_pg = placement_group([{"CPU": 0.01}])  # unnamed, like Ray Train's own
                    self.cleaner = PlacementGroupCleaner.options(lifetime="detached").remote()
                    ray.get(self.cleaner.ping.remote())
                    # Its id only: the process that reclaims holds no handle to it (a resuming CLI does not).
                    return self.pg, self.train_pg, self.cleaner._actor_id.hex()

                def end(self):
                    ray.kill(self.cleaner)

            FakeDriver.__qualname__ = qualname
            return ray.remote(num_cpus=0)(FakeDriver)

        # A dead driver of this version, one of an earlier version (its class defined in a function), a live one.
        drivers = {
            "deadrun": driver_cls(real_class),
            "oldrun": driver_cls("_actor_cls.<locals>.DriverActor"),
            "liverun": driver_cls(real_class),
        }
        handles = {run: cls.options(name=driver_name(run), namespace=DRIVER_NAMESPACE).remote()
                   for run, cls in drivers.items()}
        assert _recorded_class(handles["deadrun"]) == real_class
        left = {run: ray.get(h.start.remote(run)) for run, h in handles.items()}
        for run in ("deadrun", "oldrun"):
            ray.kill(handles[run], no_restart=True)
            _wait(lambda run=run: _actor_state(handles[run]) == "DEAD", "the killed driver is dead")
            _, train_pg, cleaner = left[run]
            assert _actor_state(cleaner) == "ALIVE" and _pg_state(train_pg) != "REMOVED", \
                "Ray itself leaves these behind (else this test tests nothing)"
        got = reclaim_dead_runs(["deadrun", "oldrun", "liverun"])
        ended = [f"PlacementGroupCleaner {left[run][2][:8]}" for run in ("deadrun", "oldrun")]
        assert sorted(got.actors) == sorted(ended)
        assert {"ray_saturn:deadrun:t0", "ray_saturn:oldrun:t0"} <= set(got.placement_groups)
        assert len(got.placement_groups) == 4
        for run in ("deadrun", "oldrun"):
            pg, train_pg, cleaner = left[run]
            _wait(lambda cleaner=cleaner: _actor_state(cleaner) == "DEAD", "the dead run's cleaner is ended",
                  budget=60)
            assert _pg_state(pg) == "REMOVED" and _pg_state(train_pg) == "REMOVED"
        live_pg, live_train_pg, live_cleaner = left["liverun"]
        assert _actor_state(live_cleaner) == "ALIVE", "a live run's actors are not touched"
        assert _pg_state(live_pg) != "REMOVED" and _pg_state(live_train_pg) != "REMOVED"
        assert not reclaim_dead_runs(), "nothing is left to end"
        ray.get(handles["liverun"].end.remote())
        ray.kill(handles["liverun"])


def test_a_sigkilled_emulate_is_private_resumable_and_leaves_ray_usable(tmp_path):
    rows = [{"task": f"job-{i}", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": s}
            for i, s in enumerate((200, 1000, 1000, 1000))]
    ProfileTable.from_rows(rows).write(tmp_path / "p.csv")
    run_dir = tmp_path / "run"
    global_file = Path("/tmp/ray/ray_current_cluster")
    before = global_file.stat().st_mtime if global_file.exists() else None
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(tmp_path)  # a token a plain ray.init() may write lands here, not in ~/.ray
    cmd = [str(BIN / "ray-saturn"), "emulate", str(tmp_path / "p.csv"), "--nodes", "1", "--gpus-per-node", "2",
           "--time-scale", "0.01", "--run-dir", str(run_dir)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    store = RunStorage(run_dir)
    try:
        def progress():
            if proc.poll() is not None:
                raise AssertionError(f"emulate ended early: {proc.communicate()[1][-2000:]}")
            if not store.exists(STATE_FILE):
                return None
            st = store.read_json(STATE_FILE)
            t = st["tasks"].values()
            done = any(r["state"] == "finished" for r in t)
            going = any(r["state"] == "running" and 300 <= r["steps_done"] <= r["total_steps"] - 300 for r in t)
            return st if done and going else None

        def cluster_address():
            if proc.poll() is not None:
                raise AssertionError(f"emulate ended early: {proc.communicate()[1][-2000:]}")
            env_of_cluster = cluster_environ(proc.pid)
            where = Path(env_of_cluster.get("RAY_TMPDIR", "/nonexistent")) / "ray" / "ray_current_cluster"
            return (env_of_cluster, where.read_text().strip()) if where.exists() else None

        private, address = _wait(cluster_address, "the emulated cluster to start")
        assert private.get("RAY_AUTH_MODE") == "token" and len(private.get("RAY_AUTH_TOKEN", "")) == 64, private
        assert address.startswith("127.0.0.1:"), address
        after = global_file.stat().st_mtime if global_file.exists() else None
        assert after == before, "emulate wrote the machine-wide address file"
        # A client without the token is turned away, by the token check (Ray retries its GCS connection once a
        # second, 20 times by default; 5 here), and while the cluster is up.
        probe = (f"import ray; ray.init(address={address!r}, log_to_driver=False); "
                 "print('RAN', ray.get(ray.remote(lambda: 1).remote()))")
        # (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: connect to 127.0.0.1 as given, not the machine's address.)
        prober = subprocess.Popen([sys.executable, "-c", probe], env={**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                                                                     "RAY_gcs_server_port_wait_time_s": "5"},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            _wait(progress, "the emulated run finishes a task while another is 300 steps in")
            probed, _ = prober.communicate(timeout=120)
            assert "RAN" not in probed and prober.returncode != 0, probed[-500:]
            assert "InvalidAuthToken" in probed, probed[-2000:]
        except subprocess.TimeoutExpired:
            pass  # it never got in
        finally:
            if prober.poll() is None:
                prober.kill()
                prober.wait(timeout=30)
        assert proc.poll() is None, "the cluster must still be up when the probe was refused"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        # What the run had recorded when it died (tasks went on during the checks above).
        at_kill = store.read_json(STATE_FILE)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    # The next plain ray.init() on this machine starts its own cluster (it used to hang on the dead one).
    plain = ("import ray; ray.init(num_cpus=1, include_dashboard=False); "
             "print('OK', ray.get(ray.remote(lambda: 2).remote())); ray.shutdown()")
    out = subprocess.run([sys.executable, "-c", plain], env=env, capture_output=True, text=True, timeout=240)
    assert "OK 2" in out.stdout, out.stderr[-2000:]
    # status: the driver is dead, not "running".
    st = subprocess.run([str(BIN / "ray-saturn"), "status", str(run_dir)], env=env, capture_output=True, text=True,
                        timeout=120)
    assert st.returncode == 0, st.stderr
    assert st.stdout.splitlines()[0].startswith("driver not seen for "), st.stdout
    assert f"run `ray-saturn resume {run_dir}`" in st.stdout.splitlines()[0]
    # resume takes the stale lock over, says so, and finishes without re-running job-0.
    res = subprocess.run([str(BIN / "ray-saturn"), "resume", str(run_dir), "--json"], env=env, capture_output=True,
                         text=True, timeout=420)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "taking over the lock of `ray-saturn emulate`" in res.stderr and "its process is gone" in res.stderr
    result = json.loads(res.stdout)
    assert result["state"] == "finished"
    tasks = {t["task"]: t for t in result["tasks"]}
    every = 100  # the emulation checkpoints every 1 / time-scale profile seconds: 100 steps of 1 s
    resumed = 0
    for name, was in at_kill["tasks"].items():
        assert tasks[name]["state"] == "finished" and tasks[name]["steps_done"] == was["total_steps"]
        new = tasks[name]["segments"][len(was["segments"]):]
        if was["state"] == "finished":
            assert not new, f"{name} finished before the kill and ran again"
        elif was["segments"] and new:  # (none: its last checkpoint was its last step, written before the kill)
            resumed += 1
            lost = was["steps_done"] - new[0]["steps_start"]
            assert lost <= every + 60, f"{name} lost {lost} steps (more than one checkpoint interval)"
    assert resumed, "no task was mid-way at the kill and continued from its checkpoint"
    assert result["realised_makespan_s"] >= at_kill["time_s"], "the run's history was kept"
    kinds = [e["kind"] for e in RunStorage(run_dir).read_jsonl(EVENTS_FILE)]
    assert "resume" in kinds
