"""A real S3 endpoint on 127.0.0.1 for tests: moto's server mode, with credentials enforced.

    from s3_server import s3_server

    with s3_server() as s3:
        uri = s3.uri("runs/a")      # s3://<bucket>/runs/a?endpoint_override=127.0.0.1:PORT&scheme=http&region=...
        with s3.credentials():      # AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY of a user allowed s3:* (os.environ)
            RunStorage(uri).write_json("x.json", {})
        s3.keys("runs/a")           # what the bucket holds under a prefix (checked with boto3, not pyarrow)

The server is ``python -m moto.server`` in its own process (moto from PyPI,
in the ``test`` extra), started on a free port of 127.0.0.1 and ended by its
process id. Authentication is enforced (``INITIAL_NO_AUTH_ACTION_COUNT``):
the fixture's first few calls create an IAM user with an ``s3:*`` policy, its
access key and the bucket; after that a request without those credentials,
or with others, is refused as by AWS. ``AWS_EC2_METADATA_DISABLED`` keeps
the SDKs from asking a metadata service that is not there.

``s3`` (module scope) is the pytest fixture; :func:`s3_server` the context
manager behind it, for scripts (release benchmarks, fault injection).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlencode

import pytest

#: Readiness budget of the server on a loaded 2-core machine (it answers in < 1 s when idle).
READY_BUDGET_S = 120.0
REGION = "us-east-1"
#: Unauthenticated calls the fixture needs to set up (user, policy, key, bucket).
_SETUP_CALLS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    """A running moto S3 endpoint with one bucket and one user's credentials."""

    endpoint: str  # host:port
    bucket: str
    access_key: str
    secret_key: str
    pid: int

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def query(self, **extra: str) -> str:
        return urlencode({"endpoint_override": self.endpoint, "scheme": "http", "region": REGION, **extra}, safe=":")

    def uri(self, prefix: str = "", *, bucket: str | None = None, endpoint: str | None = None) -> str:
        """An ``s3://`` URI under ``prefix`` that pyarrow (and so ray_saturn) opens on this server."""
        q = urlencode({"endpoint_override": endpoint or self.endpoint, "scheme": "http", "region": REGION}, safe=":")
        path = f"{bucket or self.bucket}/{prefix.strip('/')}".rstrip("/")
        return f"s3://{path}?{q}"

    def env(self) -> dict[str, str]:
        """The environment a process (or a Ray node) needs to reach the bucket."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    @contextlib.contextmanager
    def credentials(self, env: dict[str, str | None] | None = None) -> Iterator[None]:
        """Set this server's credentials in ``os.environ`` for the block; ``env`` overrides some (``None`` removes)."""
        want: dict[str, str | None] = {**self.env(), **(env or {})}
        old = {k: os.environ.get(k) for k in want}
        try:
            for k, v in want.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            yield
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def client(self):
        """A boto3 S3 client with this server's credentials (independent of ray_saturn and pyarrow)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key in the bucket under ``prefix``."""
        out: list[str] = []
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        for page in pages:
            out += [o["Key"] for o in page.get("Contents", [])]
        return sorted(out)

    def new_bucket(self, name: str | None = None) -> str:
        name = name or f"b-{uuid.uuid4().hex[:10]}"
        self.client().create_bucket(Bucket=name)
        return name


def _wait_ready(proc: subprocess.Popen, url: str, log_path: str) -> None:
    deadline = time.monotonic() + READY_BUDGET_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path) as f:
                raise RuntimeError(f"moto server exited with {proc.returncode}: {f.read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto server at {url} did not answer within {READY_BUDGET_S:.0f} s")


@contextlib.contextmanager
def s3_server(bucket: str = "saturn-test") -> Iterator[S3Server]:
    """Start moto's S3 server on 127.0.0.1 (see the module docstring); stop it on exit."""
    import boto3

    port = _free_port()
    env = dict(os.environ)
    env.update({"INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_CALLS), "AWS_EC2_METADATA_DISABLED": "true"})
    env.setdefault("AWS_ACCESS_KEY_ID", "setup")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "setup")
    log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)  # noqa: SIM115 (closed in finally)
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url, log.name)
        setup = {"endpoint_url": url, "region_name": REGION, "aws_access_key_id": "setup",
                 "aws_secret_access_key": "setup"}
        iam = boto3.client("iam", **setup)
        iam.create_user(UserName="saturn")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.put_user_policy(UserName="saturn", PolicyName="s3-all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="saturn")["AccessKey"]
        server = S3Server(f"127.0.0.1:{port}", bucket, key["AccessKeyId"], key["SecretAccessKey"], proc.pid)
        server.client().create_bucket(Bucket=bucket)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
        with contextlib.suppress(OSError):
            os.unlink(log.name)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    """A moto S3 server for the module's tests (import this fixture into a test module to use it)."""
    with s3_server() as server:
        yield server
