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


def test_fsspec_uri_through_pyarrow():
    store = RunStorage("memory://saturn-test/run")
    _roundtrip(store, mtimes=False)  # fsspec's memory filesystem keeps no modification times
    assert not store.exclusive_create_is_atomic


@pytest.mark.parametrize("bad", ["", "  ", "nosuchscheme-xyz://a/b"])
def test_bad_locations(bad):
    with pytest.raises(StorageError):
        RunStorage(bad)


def test_paths_stay_inside(tmp_path):
    store = RunStorage(tmp_path)
    for part in ("..", "../x", "a/../../x", "", "a//b", "/abs"):
        with pytest.raises(StorageError, match="leave the run folder"):
            store.join(part)
    with pytest.raises(StorageError):
        child_uri("s3://b/run", "..")
    with pytest.raises(StorageError):
        RunStorage(tmp_path / "missing", create=False)


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
