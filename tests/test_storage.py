"""The storage layer on a local folder, an fsspec filesystem and a real S3 endpoint (moto on 127.0.0.1)."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time

import pytest
from s3_server import s3  # noqa: F401  (the fixture)

from ray_saturn.runtime.storage import RunStorage, StorageError, child_uri, redact_uri


def _roundtrip(store: RunStorage, *, mtimes: bool = True) -> None:
    store.write_json("a/state.json", {"x": 1})
    assert store.read_json("a/state.json") == {"x": 1}
    store.write_json("a/state.json", {"x": 2})  # replaced
    assert store.read_json("a/state.json") == {"x": 2}
    store.append_jsonl("events.jsonl", {"k": 1})
    store.append_jsonl("events.jsonl", {"k": 2})
    assert [e["k"] for e in store.read_jsonl("events.jsonl")] == [1, 2]
    assert store.exists("a/state.json") and not store.exists("a/none.json")
    st = store.stat("a/state.json")
    assert st is not None and st.size > 0
    assert not mtimes or (st.mtime is not None and abs(st.mtime - time.time()) < 600)
    assert store.stat("nope") is None
    names = [s.name for s in store.list()]
    assert "events.jsonl" in names and "a" in names
    assert [s.name for s in store.list("a")] == ["state.json"]
    assert "a/state.json" in [s.name for s in store.list(recursive=True)]
    assert store.create_exclusive("lock.json", b"one") is True
    assert store.create_exclusive("lock.json", b"two") is False
    assert store.read_bytes("lock.json") == b"one"
    store.move("lock.json", "backup/lock.json")
    assert store.read_bytes("backup/lock.json") == b"one" and not store.exists("lock.json")
    store.move("backup/lock.json", "lock.json")
    with pytest.raises(StorageError, match="does not exist"):
        store.move("backup/lock.json", "x")
    store.delete("lock.json")
    assert not store.exists("lock.json")
    store.delete("lock.json", missing_ok=True)
    with pytest.raises(StorageError, match="does not exist"):
        store.delete("lock.json")
    store.delete_dir("a")
    assert not store.exists("a/state.json")
    with pytest.raises(StorageError, match="does not exist"):
        store.read_bytes("a/state.json")
    store.check()
    # No temporary names left behind by atomic writes or probes.
    assert not [s.name for s in store.list(recursive=True) if s.name.split("/")[-1].startswith(".")]


def test_local_folder(tmp_path):
    store = RunStorage(tmp_path / "run")
    _roundtrip(store)
    assert store.exclusive_create_is_atomic
    assert store.uri == str(tmp_path / "run") and store.task_dir("t-1") == str(tmp_path / "run" / "tasks" / "t-1")
    # The probe of a folder not yet there leaves no folder behind (a run refused after it leaves nothing).
    fresh = RunStorage(tmp_path / "new" / "deeper" / "run")
    with pytest.raises(StorageError, match="refused"), fresh.removed_if_refused():
        fresh.check()
        raise StorageError("refused")
    assert not (tmp_path / "new").exists()
    kept = RunStorage(tmp_path / "kept")  # a folder something wrote to stays
    with pytest.raises(StorageError), kept.removed_if_refused():
        kept.write_bytes("state.json", b"{}")
        raise StorageError("refused")
    assert (tmp_path / "kept" / "state.json").exists()
    with pytest.raises(StorageError), store.removed_if_refused():  # one that was there before stays
        raise StorageError("refused")
    assert (tmp_path / "run").is_dir()


def test_fsspec_uri_through_pyarrow():
    store = RunStorage("memory://saturn-test/run")
    _roundtrip(store, mtimes=False)  # fsspec's memory filesystem keeps no modification times
    assert not store.exclusive_create_is_atomic


@pytest.mark.parametrize("bad", ["", "  ", "nosuchscheme-xyz://a/b"])
def test_bad_locations(bad):
    with pytest.raises(StorageError):
        RunStorage(bad)


def test_a_folder_that_cannot_be_created_is_one_line(tmp_path, capsys):
    from ray_saturn.cli import main

    with pytest.raises(StorageError, match=r"/proc/saturn-x: cannot create the folder: .*a place you can write"):
        RunStorage("/proc/saturn-x")
    (tmp_path / "p.csv").write_text("task,strategy,gpus,step_time_s,steps\na,single,1,1.0,10\n")
    assert main(["emulate", str(tmp_path / "p.csv"), "--nodes", "1", "--gpus-per-node", "1", "--time-scale",
                 "0.01", "--storage", "/proc/saturn-x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot create the folder" in err, err


def test_a_file_where_the_run_folder_belongs_is_said_as_such(tmp_path, capsys):
    """It read 'no such run folder' (status, resume) or an errno text without a fix (run, emulate)."""
    from ray_saturn.cli import main

    f = tmp_path / "p.csv"
    f.write_text("task,strategy,gpus,step_time_s,steps\na,single,1,1.0,10\n")
    with pytest.raises(StorageError, match=r"p\.csv: is a file, not a run folder; give a folder for the run"):
        RunStorage(f)
    with pytest.raises(StorageError, match=r"p\.csv: is a file, not a run folder; give the folder the run was"):
        RunStorage(f, create=False)
    assert main(["emulate", str(f), "--nodes", "1", "--gpus-per-node", "1", "--time-scale", "0.01",
                 "--storage", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a file, not a run folder" in err, err


def test_paths_stay_inside(tmp_path):
    store = RunStorage(tmp_path)
    for part in ("..", "../x", "a/../../x", "", "a//b", "/abs"):
        with pytest.raises(StorageError, match="leave the run folder"):
            store.join(part)
    with pytest.raises(StorageError):
        child_uri("s3://b/run", "..")
    with pytest.raises(StorageError):
        RunStorage(tmp_path / "missing", create=False)


def test_writes_do_not_follow_links_out_of_the_run_folder(tmp_path):
    """events.jsonl or a task folder linked elsewhere made the run append to (or checkpoint into) files
    outside its folder. Local writes now refuse a link out, in one line; the target is untouched."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.jsonl").write_text("mine\n")
    store = RunStorage(tmp_path / "run")
    run = tmp_path / "run"
    (run / "events.jsonl").symlink_to(outside / "victim.jsonl")
    (run / "tasks").mkdir()
    (run / "tasks" / "b").symlink_to(outside)
    out = "a symbolic link leads out of the run folder"
    with pytest.raises(StorageError, match=f"events.jsonl: {out} .*remove the link") as err:
        store.append_jsonl("events.jsonl", {"kind": "x"})
    assert "\n" not in str(err.value)
    with pytest.raises(StorageError, match=f"tasks/b: {out}"):
        store.task_dir("b")
    with pytest.raises(StorageError, match=out):
        store.write_json("tasks/b/step.json", {"step": 1})
    with pytest.raises(StorageError, match=out):
        store.create_exclusive("tasks/b/lock", b"x")
    with pytest.raises(StorageError, match=out):
        store.delete_dir("tasks/b")
    assert (outside / "victim.jsonl").read_text() == "mine\n" and sorted(p.name for p in outside.iterdir()) == [
        "victim.jsonl"]
    # A link in a file's place is replaced by an atomic write, not followed; links inside the folder are fine.
    (run / "state.json").symlink_to(outside / "victim.jsonl")
    store.write_json("state.json", {"x": 1})
    assert (outside / "victim.jsonl").read_text() == "mine\n" and store.read_json("state.json") == {"x": 1}
    (run / "tasks" / "a").mkdir()
    (run / "tasks" / "c").symlink_to(run / "tasks" / "a")
    assert store.task_dir("c") == str(run / "tasks" / "c")
    store.write_json("tasks/c/step.json", {"step": 1})
    # Workers open a task's checkpoints/ (emulated/) directly: a link there out of the run folder is refused too.
    (run / "tasks" / "a" / "checkpoints").symlink_to(outside)
    with pytest.raises(StorageError, match=f"tasks/a/checkpoints: {out} \\(to {outside}\\)"):
        store.task_dir("a")
    with pytest.raises(StorageError, match=f"tasks/c/checkpoints: {out}"):
        store.task_dir("c")


def test_reads_and_deletes_do_not_follow_links_out_of_the_run_folder(tmp_path):
    """Reads (state.json, run.json, a checkpoint's meta.json) followed a link out of the run folder, and a
    delete through a linked folder removed the file it led to (a checkpoint step folder linked elsewhere:
    re-writing that step deleted <elsewhere>/meta.json). Both are refused now; the target is untouched."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text('{"token": "s3cr3t"}')
    (outside / "meta.json").write_text("mine")
    store = RunStorage(tmp_path / "run")
    run = tmp_path / "run"
    (run / "state.json").symlink_to(outside / "secret.json")
    (run / "step").symlink_to(outside)
    out = "a symbolic link leads out of the run folder"
    with pytest.raises(StorageError, match=f"state.json: {out}"):
        store.read_json("state.json")
    with pytest.raises(StorageError, match=out):
        store.read_bytes("step/secret.json")
    with pytest.raises(StorageError, match=out), store.open_input("step/secret.json"):
        pass
    with pytest.raises(StorageError, match=out):
        store.delete("step/meta.json", missing_ok=True)
    assert (outside / "meta.json").read_text() == "mine"
    # A link in a file's own place is removed, not what it leads to; links inside the folder are read.
    store.delete("state.json")
    assert not (run / "state.json").is_symlink() and (outside / "secret.json").exists()
    store.write_json("a.json", {"x": 1})
    (run / "b.json").symlink_to(run / "a.json")
    assert store.read_json("b.json") == {"x": 1}


def test_uris_keep_their_options_and_hide_secrets():
    uri = "s3://b/run?endpoint_override=h:9000&scheme=http&secret_key=SECRET&access_key=AK"
    assert child_uri(uri, "tasks", "a") == (
        "s3://b/run/tasks/a?endpoint_override=h:9000&scheme=http&secret_key=SECRET&access_key=AK"
    )
    assert child_uri("s3://b?region=x", "run") == "s3://b/run?region=x"
    assert child_uri("/tmp/r", "tasks") == "/tmp/r/tasks"
    shown = redact_uri(uri)
    assert "SECRET" not in shown and "AK" not in shown and "endpoint_override=h:9000" in shown


def test_s3_bucket(s3):  # noqa: F811
    with s3.credentials():
        store = RunStorage(s3.uri("runs/one"))
        _roundtrip(store)
        assert store.exclusive_create_is_atomic  # If-None-Match: * through boto3
        store.write_json("state.json", {"ok": 1})
        child = store.child("tasks", "a")
        child.write_bytes("x.bin", b"123")
        assert child.uri == s3.uri("runs/one/tasks/a")
        # Another process opens the same location from the pickled object (its URI).
        again = pickle.loads(pickle.dumps(store))
        assert again.read_json("state.json") == {"ok": 1}
        assert RunStorage(s3.uri("runs/one"), create=False).read_bytes("tasks/a/x.bin") == b"123"
    assert "runs/one/state.json" in s3.keys("runs/one")  # seen by an independent client


def test_s3_atomic_create_races(s3):  # noqa: F811
    # Eight processes race for one name: exactly one wins.
    code = (
        "import sys; from ray_saturn.runtime.storage import RunStorage;"
        "print(RunStorage(sys.argv[1]).create_exclusive('lock', sys.argv[2].encode()))"
    )
    with s3.credentials():
        uri = s3.uri("race")
        import os

        procs = [
            subprocess.Popen([sys.executable, "-c", code, uri, str(i)], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ))
            for i in range(8)
        ]
        wins = [p.communicate(timeout=120)[0].strip() for p in procs]
        assert wins.count("True") == 1, wins
        winner = wins.index("True")
        assert RunStorage(uri).read_bytes("lock") == str(winner).encode()


def test_s3_wrong_credentials_or_endpoint_one_line(s3):  # noqa: F811
    cases = [
        (s3.uri("x"), {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}, "no S3 credentials found"),
        (s3.uri("x"), {"AWS_ACCESS_KEY_ID": "wrong", "AWS_SECRET_ACCESS_KEY": "wrong"}, "access denied"),
        (s3.uri("x", endpoint="127.0.0.1:1"), None, "cannot reach the storage endpoint"),
        (s3.uri("x", bucket="no-such-bucket"), None, "bucket does not exist"),
    ]
    for uri, env, hint in cases:
        with s3.credentials(env), pytest.raises(StorageError) as err:
            RunStorage(uri).check()
        msg = str(err.value)
        assert "\n" not in msg and hint in msg, msg
        assert redact_uri(uri).split("?")[0] in msg, msg


def test_s3_reads_use_the_credentials_in_the_environment_now(s3):  # noqa: F811
    # Reads go through boto3, which must not keep the first credentials it saw (its default session does).
    with s3.credentials():
        store = RunStorage(s3.uri("creds"))
        store.write_bytes("x", b"1")
    with s3.credentials({"AWS_ACCESS_KEY_ID": "wrong", "AWS_SECRET_ACCESS_KEY": "wrong"}), \
            pytest.raises(StorageError, match="access denied"):
        store.read_bytes("x")
    with s3.credentials():
        assert store.read_bytes("x") == b"1"


def test_checkpoints_on_s3_resume_exactly_and_fall_back(s3, tmp_path):  # noqa: F811
    import torch

    from ray_saturn.strategies import train_worker
    from ray_saturn.strategies.checkpoint import checkpoints, latest_step
    from ray_saturn.toy import mlp_task

    def losses(strategy, d, target):
        out: list[float] = []
        train_worker(task, strategy, {}, target_step=target, checkpoint_dir=d, checkpoint_every=2,
                     report=lambda r: out.append(r["loss"]))
        return out

    task = mlp_task(batches=3, optimizer="adam")
    with s3.credentials():
        d = s3.uri("ckpt/t")
        first = losses("single", d, 4)
        assert latest_step(d) == 4
        rest = losses("spill", d, 8)  # another strategy resumes from the shards on S3
        ref = losses("single", str(tmp_path / "ref"), 8)
        torch.testing.assert_close(torch.tensor(first + rest), torch.tensor(ref))
        assert [c.step for c in checkpoints(d)] == [8, 6]  # keep=2, older ones pruned
        # A truncated newest shard: the next reader skips it and resumes from the one before.
        (shard,) = [k for k in s3.keys("ckpt/t/step-000000008") if k.endswith(".distcp")]
        body = s3.client().get_object(Bucket=s3.bucket, Key=shard)["Body"].read()
        s3.client().put_object(Bucket=s3.bucket, Key=shard, Body=body[:10])
        assert latest_step(d) == 6
        assert "truncated" in checkpoints(d)[0].problem
        assert len(losses("single", d, 10)) == 4
        assert latest_step(d) == 10
    assert not any(k.startswith(".") for k in s3.keys("ckpt/t"))


def test_cli_refuses_unreachable_storage_in_one_line_before_starting_ray(s3, tmp_path):  # noqa: F811
    import os
    from pathlib import Path

    bin_dir = Path(sys.executable).parent
    workload = tmp_path / "w.py"
    workload.write_text(
        "import torch\nfrom ray_saturn import Task\n"
        "tasks = [Task('a', lambda hp: torch.nn.Linear(2, 1), lambda hp: [(torch.ones(2, 2), torch.ones(2, 1))],"
        " lambda o, b: ((o - b[1]) ** 2).mean(), lambda p, hp: torch.optim.SGD(p, lr=0.1), max_steps=2)]\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "RAY_ADDRESS"}
    good = {**base, **s3.env()}
    no_creds = {**base, "AWS_EC2_METADATA_DISABLED": "true"}
    cases = [
        (["run", str(workload), "--storage", s3.uri("r1", endpoint="127.0.0.1:1")], good, "cannot reach"),
        (["run", str(workload), "--storage", s3.uri("r1")], no_creds, "no S3 credentials found"),
        (["resume", s3.uri("r1", endpoint="127.0.0.1:1")], good, "cannot reach"),
        (["status", s3.uri("r1")], no_creds, "no S3 credentials found"),
        (["status", s3.uri("never-ran")], good, "no such run folder"),
    ]
    for argv, env, hint in cases:
        uri = next(a for a in argv if a.startswith("s3://"))
        proc = subprocess.run([str(bin_dir / "ray-saturn"), *argv], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (argv, proc.stderr[-2000:])
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and hint in lines[0] and uri.split("?")[0] in lines[0], (argv, lines)
        assert "Ray" not in proc.stdout + proc.stderr  # refused before Ray (or any GPU) was touched


def _fsdp_on_s3(rank, uri):
    from ray_saturn.strategies import train_worker
    from ray_saturn.toy import mlp_task

    out: list[float] = []
    train_worker(mlp_task(batches=3), "fsdp", {}, target_step=4, checkpoint_dir=uri, checkpoint_every=2,
                 report=lambda r: out.append(r["loss"]))
    return out


def test_sharded_checkpoint_on_s3_reshards_to_one_process(s3, tmp_path):  # noqa: F811
    # Two gloo workers write FSDP shards straight to the bucket; one process reads them back and goes on.
    import torch
    from dist_helpers import run_workers

    from ray_saturn.strategies import train_worker
    from ray_saturn.toy import mlp_task

    def single(d, target):
        out: list[float] = []
        train_worker(mlp_task(batches=3), "single", {}, target_step=target, checkpoint_dir=d, checkpoint_every=2,
                     report=lambda r: out.append(r["loss"]))
        return out

    with s3.credentials():
        uri = s3.uri("sharded/t")
        first = run_workers(_fsdp_on_s3, 2, uri)[0]
        assert len([k for k in s3.keys("sharded/t/step-000000004") if k.endswith(".distcp")]) == 2
        rest = single(uri, 8)
    ref = single(str(tmp_path / "ref"), 8)
    torch.testing.assert_close(torch.tensor(first + rest), torch.tensor(ref), rtol=1e-4, atol=1e-5)


def test_error_hints_do_not_mistake_a_port_for_a_status():
    from ray_saturn.runtime.storage import _reason

    refused = _reason(OSError("AWS Error NETWORK_CONNECTION during HeadObject: Failed to connect to 127.0.0.1:40381"))
    assert refused.startswith("cannot reach the storage endpoint")
    assert _reason(OSError("AWS Error UNKNOWN (HTTP status 403) during PutObject")).startswith("access denied")


@pytest.mark.parametrize("how", ["s3 (one GET)", "s3 without boto3 (checked pyarrow read)", "local"])
def test_a_state_read_while_the_driver_rewrites_it_is_whole(how, s3, tmp_path, monkeypatch):  # noqa: F811
    # pyarrow's S3 read takes the size from a HEAD and the bytes from a ranged GET: a state.json
    # replaced in between read as the new object cut to the old size, or padded with zero bytes,
    # and status fell back to state.json.bak. A reader polls while another thread writes states of
    # alternating length (never the same length twice, so the checked read can tell) the driver's way.
    import threading

    from ray_saturn.runtime import storage as storage_mod
    from ray_saturn.runtime.journal import STATE_FILE, Journal

    def state(i: int) -> dict:
        return {"driver_state": "running", "tasks": {}, "time_s": i, "pad": "x" * (1000 * (i % 2) + i)}

    if how.startswith("s3 without"):
        monkeypatch.setattr(storage_mod, "_s3_client", lambda fs: None)
    with s3.credentials():
        uri = str(tmp_path / "run") if how == "local" else s3.uri(f"torn/{how.split()[0]}-{time.time_ns()}")
        writer, reader = Journal(RunStorage(uri)), Journal(RunStorage(uri))
        writer.write_state(state(0))
        stop = threading.Event()

        def write() -> None:
            i = 1
            while not stop.wait(0.01) and i < 1000:  # 100 states a second: a driver writes a few
                writer.write_state(state(i))
                i += 1

        thread = threading.Thread(target=write)
        thread.start()
        bad: list[str] = []
        reads = 0
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 2.0 and thread.is_alive():
                got = reader.load_state()
                reads += 1
                if got.source != STATE_FILE or got.problems or got.state != state(got.state["time_s"]):
                    bad.append(f"{got.source}: {got.problems}")
        finally:
            stop.set()
            thread.join(timeout=60)
    assert reads >= 10, f"only {reads} reads in 2 s: the race was hardly tried"
    assert not bad, f"{len(bad)} of {reads} reads were not one whole state.json: {bad[:3]}"


def test_a_file_that_never_stops_changing_is_one_clear_error_after_the_read_budget(tmp_path, monkeypatch) -> None:
    """pyarrow's S3 read (no boto3) retries a file replaced around it, within a time budget, then says why."""
    import types

    import pyarrow.fs as pafs

    from ray_saturn.runtime import storage as storage_mod

    monkeypatch.setattr(storage_mod, "_CHANGING_READ_BUDGET_S", 0.3)
    st = RunStorage(tmp_path / "run")
    st.write_bytes("state.json", b"{}")
    real = st.fs
    looks = iter(range(10**6))

    class Replaced:  # every look at the file sees another version of it
        def get_file_info(self, path):
            return types.SimpleNamespace(type=pafs.FileType.File, size=2, mtime=next(looks))

        def open_input_stream(self, path):
            return real.open_input_stream(path)

    st.fs = Replaced()
    t0 = time.monotonic()
    with pytest.raises(OSError, match=r"kept changing while it was read \(\d+ tries in 0.3 s\); is another process"):
        st._read_checked(st.join("state.json"))
    assert 0.3 <= time.monotonic() - t0 < 5
    st.fs = real
    assert st._read_checked(st.join("state.json")) == b"{}"  # one that holds still reads at once
