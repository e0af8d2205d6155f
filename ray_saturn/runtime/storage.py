"""The storage layer: one place for a run's folder and every checkpoint, on any filesystem.

A run's ``storage`` is one of

- a local path (or an NFS mount every node sees): ``/mnt/runs/sweep-1``;
- any ``pyarrow.fs`` URI: ``s3://bucket/runs/sweep-1``, ``gs://...``,
  ``hdfs://...``, ``file:///...``, with the usual query options, e.g.
  ``s3://bucket/run?endpoint_override=minio.local:9000&scheme=http&region=us-east-1``
  (credentials come from the environment or the node's role, as for any AWS
  SDK client: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` on every node);
- an fsspec URI that pyarrow does not know itself (``memory://``, ``abfs://``
  with adlfs installed, ...), served through pyarrow's ``FSSpecHandler``.

:class:`RunStorage` is that location: a pyarrow filesystem and a root path
in it, plus the URI to hand to another process (a worker on another node
opens the same location from it). Nothing here assumes a disk shared
between nodes: everything goes through the filesystem object.

What the operations promise:

- :meth:`RunStorage.write_bytes` replaces a file atomically: a reader sees
  the old or the new content, never a part (local: write a temporary name,
  then rename; object stores: one PUT, atomic by itself).
- :meth:`RunStorage.create_exclusive` writes a file only if it does not exist
  yet, atomically where the backend can (local: ``link``; S3 with boto3
  installed: ``PutObject`` with ``If-None-Match: *``). Elsewhere it is a
  check-then-write, and :attr:`RunStorage.exclusive_create_is_atomic` says so.
  A run-folder lock builds on it.
- :meth:`RunStorage.read_bytes` returns one whole version of a file, even
  while another process replaces it. On S3 this needs care: pyarrow's input
  file takes the size from a HEAD and the bytes from a ranged GET, so an
  overwrite between the two gives the new object cut to the old size, or
  the new object padded with zero bytes to the old size. With boto3
  installed, a read is one GET (no range: S3 serves one version per GET);
  without, pyarrow's read is checked against the file's size and mtime
  before and after, and retried.
- :meth:`RunStorage.stat` (size, mtime),
  :meth:`RunStorage.list`, :meth:`RunStorage.move` (atomic on a local disk;
  copy then delete on object stores), :meth:`RunStorage.delete`,
  :meth:`RunStorage.delete_dir`.
- Every failure of the filesystem (no such bucket, access denied, no
  endpoint) is a one-line :class:`StorageError` that names the location
  (with secrets in the URI redacted); :meth:`RunStorage.check` probes the
  location before a run holds any GPU.

Every path is built from validated parts (:meth:`RunStorage.join` refuses
``..``, empty parts and absolute parts), so nothing can escape the root; on
a local disk a read, write or delete through a symbolic link that leads out
of the root (``events.jsonl``, ``state.json`` or a task's checkpoint folder
linked elsewhere) is refused too, in one line.
The names of the files in a run folder are defined in
:mod:`ray_saturn.runtime.journal`; the checkpoint folders in
:data:`TASKS_DIR` and :data:`CHECKPOINTS_DIR` here.

Example:
    >>> import tempfile
    >>> store = RunStorage(tempfile.mkdtemp())
    >>> store.write_json("notes.json", {"ok": True})
    >>> store.read_json("notes.json")
    {'ok': True}
    >>> store.create_exclusive("lock", b"me"), store.create_exclusive("lock", b"you")
    (True, False)
    >>> child_uri("s3://b/run?endpoint_override=h:9000", "tasks", "a")
    's3://b/run/tasks/a?endpoint_override=h:9000'
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import posixpath
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.fs as pafs

from ray_saturn.errors import SaturnError
from ray_saturn.spec import check_name

__all__ = [
    "CHECKPOINTS_DIR",
    "TASKS_DIR",
    "FileStat",
    "RunStorage",
    "StorageError",
    "child_uri",
    "redact_uri",
]

logger = logging.getLogger(__name__)

#: ``tasks/<task>/``: one folder per task (Ray Train's run of it and its checkpoints).
TASKS_DIR = "tasks"
#: ``tasks/<task>/checkpoints/step-<9 digits>/``: the task's DCP checkpoints.
CHECKPOINTS_DIR = "checkpoints"

#: Reads of an object whose connection ends early, before giving up (boto3).
_READ_TRIES = 5
#: Seconds of reading a file that another process keeps replacing, before giving up (S3 without
#: boto3): a read is three requests, and on a loaded machine a writer that replaces the file every
#: few tens of milliseconds can spoil several tries in a row; a driver replaces it a few times a second.
_CHANGING_READ_BUDGET_S = 10.0
_SECRET_KEYS = re.compile(r"secret|token|password|passwd|credential|sas|key", re.IGNORECASE)
_T = TypeVar("_T")


class StorageError(SaturnError, ValueError):
    """The run folder cannot be used (bad URI, unreachable store, missing file, unreadable state)."""


@dataclass(frozen=True)
class FileStat:
    """One entry of a storage listing: its name relative to the listed folder, size, mtime, kind."""

    name: str
    size: int | None
    mtime: float | None
    is_dir: bool


# ------------------------------------------------------------------ URIs
def _is_uri(root: str) -> bool:
    return "://" in root


def redact_uri(uri: str) -> str:
    """``uri`` with the values of secret-looking query options (``secret_key=...``) replaced by ``***``."""
    if not _is_uri(uri):
        return uri
    parts = urlsplit(uri)
    if not parts.query:
        return uri
    query = [
        (k, "***" if _SECRET_KEYS.search(k) and k != "endpoint_override" else v) for k, v in parse_qsl(parts.query)
    ]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query, safe=":/"), parts.fragment))


def child_uri(uri: str, *parts: str) -> str:
    """The URI (or local path) of ``parts`` under ``uri``, keeping its query options at the end."""
    for p in parts:
        for piece in p.split("/"):
            if piece in ("", ".", ".."):
                raise StorageError(f"path part {p!r} would leave the run folder")
    if not _is_uri(uri):
        return os.path.join(uri, *parts)
    s = urlsplit(uri)
    path = posixpath.join(s.path.rstrip("/") or "/", *parts)
    if s.netloc and not path.startswith("/"):
        path = "/" + path
    return urlunsplit((s.scheme, s.netloc, path, s.query, s.fragment))


def _normalise_uri(uri: str) -> str:
    s = urlsplit(uri)
    path = s.path.rstrip("/") if s.path not in ("", "/") else s.path
    return urlunsplit((s.scheme, s.netloc, path, s.query, s.fragment))


def _filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and the path in it for a local path or a URI."""
    if not _is_uri(root):
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(root))
    try:
        fs, path = pafs.FileSystem.from_uri(root)
        return fs, path
    except pa.ArrowInvalid as exc:
        if "Unrecognized filesystem type" not in str(exc):
            raise StorageError(f"{redact_uri(root)}: not a usable storage URI ({exc})") from None
    except (ValueError, OSError) as exc:
        raise StorageError(f"{redact_uri(root)}: not a usable storage URI ({_reason(exc)})") from None
    try:  # a scheme pyarrow does not serve itself: ask fsspec
        import fsspec.core

        ffs, path = fsspec.core.url_to_fs(root)
    except (ImportError, ValueError, OSError) as exc:
        raise StorageError(
            f"{redact_uri(root)}: unknown storage scheme ({type(exc).__name__}: {exc}); give a local path, "
            "a pyarrow URI (s3://, gs://, hdfs://, file://) or an fsspec URI whose package is installed"
        ) from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(ffs)), path


def _reason(exc: BaseException) -> str:
    """The useful part of a filesystem error, on one line, with a hint for the usual causes."""
    text = " ".join(str(exc).split())
    hints = (
        (("ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "InvalidAccessKeyId",
          "AccessDenied", "SignatureDoesNotMatch", "HTTP status 403", "HTTP status 401"),
         "access denied: check the credentials every node has (e.g. AWS_ACCESS_KEY_ID and "
         "AWS_SECRET_ACCESS_KEY, or the node's role) and their rights on this bucket"),
        (("NETWORK_CONNECTION", "Could not connect", "Couldn't connect", "Failed to connect", "curlCode: 7",
          "Could not resolve host", "curlCode: 6", "Connection refused", "Name or service not known"),
         "cannot reach the storage endpoint: check endpoint_override (host:port) and scheme (http/https)"),
        (("NO_SUCH_BUCKET", "NoSuchBucket", "Bucket '", "bucket does not exist"),
         "the bucket does not exist: create it first"),
    )
    for needles, hint in hints:
        if any(n in text for n in needles):
            return f"{hint} [{text[:160]}]"
    return text[:300]


def _missing_folders(path: str) -> list[str]:
    """The folders on the way to ``path`` (itself included) that do not exist yet, deepest first."""
    missing = []
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _fail_fast(fs: pafs.FileSystem) -> pafs.FileSystem:
    """``fs`` itself, or for S3 a copy that tries once and gives up connecting after 5 s."""
    if fs.type_name != "s3":
        return fs
    opts = dict(fs.__reduce__()[1][0])
    opts.pop("proxy_options", None)
    if opts.get("connect_timeout", -1) < 0:
        opts["connect_timeout"] = 5.0
    return pafs.S3FileSystem(**opts, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))


def _missing_credentials(fs: pafs.FileSystem) -> str:
    """A note when an S3 filesystem has no credentials from anywhere the AWS SDK looks."""
    if fs.type_name != "s3":
        return ""
    opts = fs.__reduce__()[1][0]
    if opts.get("access_key") or opts.get("anonymous") or opts.get("role_arn"):
        return ""
    env = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
    if any(os.environ.get(k) for k in env):
        return ""
    files = (os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.expanduser("~/.aws/credentials"),)
    if any(os.path.isfile(f) for f in files):
        return ""
    return "; no S3 credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY on every node"


# -------------------------------------------------------------- storage
class RunStorage:
    """A folder on a local disk or on any pyarrow/fsspec filesystem (see the module docstring).

    Args:
        root: a local path or a URI.
        create: create the folder if missing (a new run); else it must exist
            (resume, status), or a :class:`StorageError` says there is no run.
    """

    #: The local folders the constructor created, deepest first (see :meth:`removed_if_refused`).
    created: tuple[str, ...] = ()

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True) -> None:
        if not isinstance(root, (str, os.PathLike)):
            raise StorageError(f"the run folder is a {type(root).__name__}; give a local path or a URI such as "
                               "s3://bucket/run")
        root = os.fspath(root)
        if not root or not root.strip():
            raise StorageError("the run folder is empty; give a local path or a URI such as s3://bucket/run")
        self.fs, path = _filesystem(root)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self.path = (path.rstrip("/") or "/") if not self.local else path
        #: What to hand to another process (a worker on another node): a local path or the URI.
        self.uri = self.path if not _is_uri(root) else _normalise_uri(root)
        self._lock = threading.Lock()
        self._appended: dict[str, bytes] = {}
        # First a quick look with few retries, so a wrong endpoint or missing credentials fail in seconds.
        info = self._call("read", lambda: _fail_fast(self.fs).get_file_info(self.path))
        if info.type == pafs.FileType.File:
            raise StorageError(f"{self.display}: is a file, not a run folder; give "
                               + ("a folder for the run (a new or an empty one)" if create
                                  else "the folder the run was started in"))
        if create:
            if self.local and info.type == pafs.FileType.NotFound:
                self.created = tuple(_missing_folders(self.path))
            try:
                self._call("create the folder", lambda: self.fs.create_dir(self.path, recursive=True))
            except FileNotFoundError as exc:  # e.g. under /proc: a place that takes no folders
                raise StorageError(f"{self.display}: cannot create the folder: {_reason(exc)}; give a folder "
                                   "in a place you can write") from None
        elif info.type != pafs.FileType.Directory:
            raise StorageError(f"{self.display}: no such run folder")

    @contextlib.contextmanager
    def removed_if_refused(self) -> Iterator[None]:
        """Checks of a new run: when one refuses (raises), the folders this store's constructor created are
        removed again while they are empty, so a refused run leaves no empty run folder behind."""
        try:
            yield
        except BaseException:
            for folder in self.created:  # deepest first; one that something filled meanwhile stays
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            raise

    @classmethod
    def at(cls, uri: str | os.PathLike[str]) -> RunStorage:
        """The location ``uri`` as it is: nothing is created or checked (a worker opening a checkpoint folder)."""
        self = cls.__new__(cls)
        root = os.fspath(uri)
        if not root:
            raise StorageError("the storage location is empty")
        self.fs, path = _filesystem(root)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self.path = (path.rstrip("/") or "/") if not self.local else path
        self.uri = self.path if not _is_uri(root) else _normalise_uri(root)
        self._lock = threading.Lock()
        self._appended: dict[str, bytes] = {}
        return self

    def child(self, *parts: str) -> RunStorage:
        """The location of ``parts`` under this one (same filesystem object; nothing created)."""
        sub = RunStorage.__new__(RunStorage)
        sub.fs, sub.local = self.fs, self.local
        sub.path = self.join(*parts)
        sub.uri = child_uri(self.uri, *parts)
        sub._lock = threading.Lock()
        sub._appended = {}
        return sub

    @property
    def name(self) -> str:
        """The folder's own name (the last part of its path), e.g. a run's name for metrics."""
        return posixpath.basename(self.path.rstrip("/")) or "run"

    @property
    def display(self) -> str:
        """The location for messages: the URI with secrets redacted."""
        return redact_uri(self.uri)

    def _call(self, what: str, fn: Callable[[], _T], name: str = "") -> _T:
        try:
            return fn()
        except FileNotFoundError:
            raise
        except (OSError, pa.ArrowException) as exc:
            where = f"{self.display}/{name}" if name else self.display
            raise StorageError(f"{where}: cannot {what}: {_reason(exc)}{_missing_credentials(self.fs)}") from None

    def check(self) -> None:
        """Probe that this location can be written, read and deleted; a one-line :class:`StorageError` if not.

        Run it before any GPU is held: a wrong endpoint or missing
        credentials then fail at once, naming the location.
        """
        self._call("read", lambda: _fail_fast(self.fs).get_file_info(self.path))
        probe = f".saturn-probe-{uuid.uuid4().hex[:12]}"
        self.write_bytes(probe, b"probe\n")
        try:
            if self.read_bytes(probe) != b"probe\n":
                raise StorageError(f"{self.display}: a probe file read back differently; is the storage consistent?")
        finally:
            self.delete(probe, missing_ok=True)

    # ------------------------------------------------------------- paths
    def join(self, *parts: str) -> str:
        """Path (in this filesystem) of ``parts`` under the root; refuses parts that would leave it."""
        for p in parts:
            if not isinstance(p, str) or not p:
                raise StorageError(f"path part {p!r} would leave the run folder")
            for piece in p.split("/"):
                if piece in ("", ".", ".."):
                    raise StorageError(f"path part {p!r} would leave the run folder")
        return posixpath.join(self.path, *parts)

    def _inside(self, name: str, *, follow: bool = True) -> str:
        """The local path of ``name``, refusing one that a symbolic link leads out of the root (``follow``:
        the file itself is opened, so a link in its place counts; else only the folders on the way do)."""
        target = self.join(name)
        if not self.local:
            return target
        root = os.path.realpath(self.path)
        real = os.path.realpath(target if follow else posixpath.dirname(target))
        if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
            raise StorageError(
                f"{self.display}/{name}: a symbolic link leads out of the run folder (to {real}); ray_saturn "
                "reads and writes only inside the run folder: remove the link"
            )
        return target

    def uri_of(self, *parts: str) -> str:
        """What to hand to Ray Train or a worker for ``parts``: a local path or a URI (query kept)."""
        return child_uri(self.uri, *parts) if parts else self.uri

    def task_dir(self, task: str) -> str:
        """The folder (local path or URI) of one task: Ray Train's run and its checkpoints.

        Workers and launchers open it (and its ``checkpoints/``) directly, so a symbolic link out of the
        run folder, in its place or among its entries, is a one-line :class:`StorageError` here.
        """
        name = check_name(task)
        folder = f"{TASKS_DIR}/{name}"
        self._inside(folder)
        if self.local:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for entry in os.scandir(self.join(folder)):
                    if entry.is_symlink():
                        self._inside(f"{folder}/{entry.name}")
        return self.uri_of(TASKS_DIR, name)

    def ray_storage(self, *parts: str) -> tuple[str, pafs.FileSystem]:
        """``(storage_path, storage_filesystem)`` for Ray Train/Tune's ``RunConfig`` at ``parts``."""
        return self.join(*parts), self.fs

    # ----------------------------------------------------------- writing
    def _atomic_put(self) -> bool:
        # One PUT is atomic on object stores; elsewhere write a temporary name and rename.
        return self.fs.type_name in ("s3", "gcs")

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write ``name`` (replacing it atomically: readers see the old or the new content)."""
        target = self._inside(name, follow=False)  # a link in its place is replaced, not followed
        parent = posixpath.dirname(target)
        self._appended.pop(name, None)

        def go() -> None:
            if self._atomic_put():
                with self.fs.open_output_stream(target) as f:
                    f.write(data)
                return
            self.fs.create_dir(parent, recursive=True)
            tmp = posixpath.join(parent, f".{posixpath.basename(target)}.{uuid.uuid4().hex[:8]}.tmp")
            try:
                if self.local:
                    with open(tmp, "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, target)
                else:
                    with self.fs.open_output_stream(tmp) as f:
                        f.write(data)
                    self.fs.move(tmp, target)
            except BaseException:
                with contextlib.suppress(OSError, FileNotFoundError):
                    self.fs.delete_file(tmp)
                raise

        self._call("write", go, name)

    def write_json(self, name: str, obj: Any) -> None:
        self.write_bytes(name, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())

    @property
    def exclusive_create_is_atomic(self) -> bool:
        """Whether :meth:`create_exclusive` is atomic here (local disk; S3 with boto3, no assumed role or proxy)."""
        return self.local or (self.fs.type_name == "s3" and _s3_client(self.fs) is not None)

    def create_exclusive(self, name: str, data: bytes) -> bool:
        """Write ``name`` only if it does not exist; ``True`` if this call created it.

        Atomic on a local disk (write a temporary file, then ``link`` it,
        which fails if the name exists) and on S3 with boto3 installed
        (``If-None-Match: *``); elsewhere a check then a write (see
        :attr:`exclusive_create_is_atomic`). Readers never see a part.
        """
        target = self._inside(name, follow=False)  # link() never follows a link in its place
        if self.local:
            parent = posixpath.dirname(target)
            os.makedirs(parent, exist_ok=True)
            tmp = posixpath.join(parent, f".{posixpath.basename(target)}.{uuid.uuid4().hex[:8]}.tmp")
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.link(tmp, target)
                return True
            except FileExistsError:
                return False
            except OSError as exc:
                raise StorageError(f"{self.display}/{name}: cannot write ({_reason(exc)})") from None
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        client = _s3_client(self.fs) if self.fs.type_name == "s3" else None
        if client is not None:
            return self._s3_create_exclusive(client, target, data, name)
        if self.exists(name):
            return False
        self.write_bytes(name, data)
        return True

    def _s3_create_exclusive(self, client: Any, target: str, data: bytes, name: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, _, key = target.partition("/")
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            return True
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or exc.response.get(
                "ResponseMetadata", {}
            ).get("HTTPStatusCode") in (409, 412):
                return False
            raise StorageError(f"{self.display}/{name}: cannot write ({_reason(exc)})") from None
        except BotoCoreError as exc:
            raise StorageError(f"{self.display}/{name}: cannot write ({_reason(exc)})") from None

    def append_jsonl(self, name: str, record: dict[str, Any]) -> None:
        """Append one JSON line (local: an append; object stores have none: rewrite the file, kept in memory)."""
        line = json.dumps(record, sort_keys=True) + "\n"
        with self._lock:
            if self.local:
                target = self._inside(name)  # an append follows a link in its place
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "a") as f:
                    f.write(line)
                    f.flush()
                    os.fsync(f.fileno())
            else:
                # One writer per run folder (the run's lock): what it wrote last is what is there.
                old = self._appended.get(name)
                if old is None:
                    old = self.read_bytes(name) if self.exists(name) else b""
                new = old + line.encode()
                self.write_bytes(name, new)
                self._appended[name] = new

    def move(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst``, replacing it (atomic on a local disk; copy then delete on object stores)."""
        self._appended.pop(src, None)
        self._appended.pop(dst, None)
        a, b = self._inside(src, follow=False), self._inside(dst, follow=False)

        def go() -> None:
            if self.local:
                os.makedirs(os.path.dirname(b), exist_ok=True)
                os.replace(a, b)
            else:
                self.fs.move(a, b)

        try:
            self._call("rename", go, src)
        except FileNotFoundError:
            raise StorageError(f"{self.display}/{src}: cannot rename, it does not exist") from None

    def delete(self, name: str, *, missing_ok: bool = False) -> None:
        """Delete the file ``name``."""
        self._appended.pop(name, None)
        try:
            target = self._inside(name, follow=False)  # a link in its place is removed, not what it leads to
            self._call("delete", lambda: self.fs.delete_file(target), name)
        except FileNotFoundError:
            if not missing_ok:
                raise StorageError(f"{self.display}/{name}: cannot delete, it does not exist") from None

    def delete_dir(self, name: str, *, missing_ok: bool = True) -> None:
        """Delete the folder ``name`` and everything in it."""
        try:
            self._call("delete", lambda: self.fs.delete_dir(self._inside(name)), name)
        except FileNotFoundError:
            if not missing_ok:
                raise StorageError(f"{self.display}/{name}: cannot delete, it does not exist") from None

    # ----------------------------------------------------------- reading
    def exists(self, name: str) -> bool:
        info = self._call("read", lambda: self.fs.get_file_info(self.join(name)), name)
        return info.type != pafs.FileType.NotFound

    def stat(self, name: str) -> FileStat | None:
        """Size and modification time of ``name`` (``None`` if it does not exist)."""
        info = self._call("read", lambda: self.fs.get_file_info(self.join(name)), name)
        if info.type == pafs.FileType.NotFound:
            return None
        return _stat(name, info)

    def list(self, name: str = "", *, recursive: bool = False) -> list[FileStat]:
        """Entries of the folder ``name`` (names relative to it), sorted; empty if it does not exist."""
        base = self.join(name) if name else self.path
        sel = pafs.FileSelector(base, allow_not_found=True, recursive=recursive)
        infos = self._call("list", lambda: self.fs.get_file_info(sel), name)
        prefix = base.rstrip("/") + "/"
        out = []
        for info in infos:
            rel = info.path[len(prefix) :] if info.path.startswith(prefix) else info.base_name
            if rel:
                out.append(_stat(rel, info))
        return sorted(out, key=lambda s: s.name)

    def read_bytes(self, name: str) -> bytes:
        """The whole content of ``name``: one version of it, even while another process replaces it."""
        path = self._inside(name)  # never read what a link leads to outside the folder

        def go() -> bytes:
            if self.fs.type_name == "s3":
                client = _s3_client(self.fs)
                return _s3_get(client, path) if client is not None else self._read_checked(path)
            return self._read_stream(path)

        try:
            return self._call("read", go, name)
        except FileNotFoundError:
            raise StorageError(f"{self.display}: {name} does not exist; is this a ray_saturn run folder?") from None

    def _read_stream(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return f.read()

    def _read_checked(self, path: str) -> bytes:
        """pyarrow's read (a HEAD, then a ranged GET), kept only if size and mtime did not change around it."""
        deadline = time.monotonic() + _CHANGING_READ_BUDGET_S
        attempt = 0
        while True:
            attempt += 1
            before = self.fs.get_file_info(path)
            if before.type == pafs.FileType.NotFound:
                raise FileNotFoundError(path)
            data = self._read_stream(path)
            after = self.fs.get_file_info(path)
            if before.size == after.size == len(data) and before.mtime == after.mtime:
                return data
            if time.monotonic() >= deadline:
                raise OSError(f"{path} kept changing while it was read ({attempt} tries in "
                              f"{_CHANGING_READ_BUDGET_S:g} s); is another process rewriting it in a loop?")
            logger.debug("%s: replaced while it was read (try %d); reading it again", path, attempt)
            # Jittered, growing pauses, so the next try does not fall in step with the writer's rhythm.
            time.sleep(random.uniform(0.005, 0.02 * min(2 ** attempt, 16)))

    def read_json(self, name: str) -> Any:
        try:
            return json.loads(self.read_bytes(name))
        except ValueError as exc:
            raise StorageError(f"{self.display}: {name} is not valid JSON ({exc})") from None

    def read_jsonl(self, name: str) -> list[dict[str, Any]]:
        if not self.exists(name):
            return []
        out = []
        for line in self.read_bytes(name).decode(errors="replace").splitlines():
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    logger.warning("%s: skipping a torn line in %s", self.display, name)
        return out

    @contextlib.contextmanager
    def open_input(self, name: str) -> Iterator[Any]:
        """A random-access file of ``name`` (``seek``/``read``)."""
        path = self._inside(name)
        f = self._call("read", lambda: self.fs.open_input_file(path), name)
        try:
            yield f
        finally:
            f.close()

    def __repr__(self) -> str:
        return f"RunStorage({self.display!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Another process opens the same location from its URI (a filesystem object may hold sockets).
        return (RunStorage.at, (self.uri,))


def _stat(name: str, info: pafs.FileInfo) -> FileStat:
    mtime = info.mtime.timestamp() if info.mtime is not None else None
    return FileStat(name, info.size, mtime, info.type == pafs.FileType.Directory)


# -------------------------------------------------------------- S3 extras
@functools.cache
def _boto3() -> Any:
    try:
        import boto3
    except ImportError:
        return None
    return boto3


_CLIENTS: dict[tuple, Any] = {}
_CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
_CLIENTS_LOCK = threading.Lock()  # one client per key, also when two threads ask at once


def _s3_client(fs: pafs.FileSystem) -> Any:
    """A boto3 S3 client configured like the pyarrow S3 filesystem ``fs``; ``None`` without boto3.

    Also ``None`` when ``fs`` gets its credentials or connection in a way this
    does not reproduce (an assumed role, a proxy): then pyarrow does all.
    """
    if _boto3() is None:
        return None
    opts = fs.__reduce__()[1][0]
    if opts.get("role_arn") or (opts.get("proxy_options") or {}).get("host"):
        return None
    endpoint = opts.get("endpoint_override") or None
    if endpoint and "://" not in endpoint:
        endpoint = f"{opts.get('scheme') or 'https'}://{endpoint}"
    # Credentials from the environment are read when a client is made: a change makes another client.
    env = () if opts.get("access_key") else tuple(os.environ.get(k) for k in _CREDENTIAL_ENV)
    key = (endpoint, opts.get("region"), opts.get("access_key"), opts.get("secret_key"), opts.get("session_token"),
           bool(opts.get("anonymous")), bool(opts.get("force_virtual_addressing")), opts.get("tls_ca_file_path"), env)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            import botocore
            from botocore.config import Config

            config: dict[str, Any] = {}
            if opts.get("anonymous"):
                config["signature_version"] = botocore.UNSIGNED
            if opts.get("force_virtual_addressing"):
                config["s3"] = {"addressing_style": "virtual"}
            kwargs: dict[str, Any] = {"endpoint_url": endpoint, "region_name": opts.get("region") or None,
                                      "config": Config(**config)}
            if opts.get("tls_ca_file_path"):
                kwargs["verify"] = opts["tls_ca_file_path"]
            if opts.get("access_key"):
                kwargs.update(
                    aws_access_key_id=opts["access_key"],
                    aws_secret_access_key=opts.get("secret_key"),
                    aws_session_token=opts.get("session_token") or None,
                )
            # A session of its own: the default one keeps the credentials it found first.
            client = _CLIENTS[key] = _boto3().session.Session().client("s3", **kwargs)
    return client


def _s3_get(client: Any, path: str) -> bytes:
    """The object at ``path`` (``bucket/key``) in one GET: one version, checked against its length.

    Raises ``FileNotFoundError`` if it does not exist, else ``OSError`` with
    the service's error (for :func:`_reason`).
    """
    from botocore.exceptions import BotoCoreError, ClientError, IncompleteReadError

    bucket, _, key = path.partition("/")
    short: IncompleteReadError | None = None
    for _ in range(_READ_TRIES):
        try:
            return client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except IncompleteReadError as exc:  # the connection ended early: read it again
            short = exc
        except ClientError as exc:
            err = exc.response.get("Error", {})
            if err.get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(path) from None
            raise OSError(f"{err.get('Code', '')}: {exc}") from None
        except BotoCoreError as exc:
            raise OSError(f"{type(exc).__name__}: {exc}") from None
    raise OSError(f"the body ended early {_READ_TRIES} times ({short})")
