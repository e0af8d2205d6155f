"""The run folder: one place for a run's state, events, profile, plan and checkpoints.

A run folder is a local path or any pyarrow filesystem URI (``s3://``,
``gs://``, ``file://``...). Layout::

    RUN_DIR/
      run.json          what was asked (cluster, policy, workload, settings)
      state.json        persisted driver state (rewritten atomically)
      events.jsonl      one JSON event per line: re-plans, moves, failures
      profile.parquet   the profile the run plans from
      plan.json         the current plan
      tasks/<task>/     checkpoints of one task (Ray Train storage for it)

Every path is built from validated parts (task names pass ``check_name``),
so nothing can escape the run folder. Whole-file writes are atomic (write
to a temporary name, then move), so a crash mid-write leaves the previous
version readable.

Example:
    >>> import tempfile
    >>> store = RunStorage(tempfile.mkdtemp())
    >>> store.write_json("notes.json", {"ok": True})
    >>> store.read_json("notes.json")
    {'ok': True}
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import threading
import uuid
from typing import Any

import pyarrow.fs as pafs

from ray_saturn.errors import SaturnError
from ray_saturn.spec import check_name

__all__ = ["RunStorage", "StorageError"]

logger = logging.getLogger(__name__)


class StorageError(SaturnError, ValueError):
    """The run folder cannot be used (bad URI, missing file, unreadable state)."""


class RunStorage:
    """A run folder on a local disk or a pyarrow filesystem."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True) -> None:
        root = os.fspath(root)
        if not root:
            raise StorageError("the run folder is empty; give a local path or a URI such as s3://bucket/run")
        if "://" in root:
            try:
                self.fs, path = pafs.FileSystem.from_uri(root)
            except (pafs.ArrowInvalid, ValueError, OSError) as exc:  # type: ignore[attr-defined]
                raise StorageError(f"{root}: not a usable storage URI ({exc})") from None
            self.local = isinstance(self.fs, pafs.LocalFileSystem)
            self.path = path.rstrip("/") or "/"
            self.uri = root.rstrip("/")
        else:
            self.fs = pafs.LocalFileSystem()
            self.local = True
            self.path = os.path.abspath(root)
            self.uri = self.path
        self._lock = threading.Lock()
        if create:
            self.fs.create_dir(self.path, recursive=True)
        elif self.fs.get_file_info(self.path).type != pafs.FileType.Directory:
            raise StorageError(f"{root}: no such run folder")

    # ------------------------------------------------------------- paths
    def join(self, *parts: str) -> str:
        """Path (in this filesystem) of ``parts`` under the run folder."""
        for p in parts:
            for piece in p.split("/"):
                if piece in ("", ".", ".."):
                    raise StorageError(f"path part {p!r} would leave the run folder")
        return posixpath.join(self.path, *parts)

    def uri_of(self, *parts: str) -> str:
        """What to hand to Ray Train or a worker: a local path or a URI."""
        path = self.join(*parts)
        if self.uri == self.path:
            return path
        return self.uri + path[len(self.path) :]

    def task_dir(self, task: str) -> str:
        """The folder (local path or URI) holding one task's checkpoints."""
        return self.uri_of("tasks", check_name(task))

    # ----------------------------------------------------------- writing
    def write_bytes(self, name: str, data: bytes) -> None:
        target = self.join(name)
        parent = posixpath.dirname(target)
        self.fs.create_dir(parent, recursive=True)
        tmp = posixpath.join(parent, f".{posixpath.basename(target)}.{uuid.uuid4().hex[:8]}.tmp")
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        self.fs.move(tmp, target)

    def write_json(self, name: str, obj: Any) -> None:
        self.write_bytes(name, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())

    def append_jsonl(self, name: str, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True) + "\n"
        with self._lock:
            if self.local:
                target = self.join(name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "a") as f:
                    f.write(line)
                    f.flush()
                    os.fsync(f.fileno())
            else:
                # Object stores have no append: rewrite (event logs stay small).
                old = self.read_bytes(name) if self.exists(name) else b""
                self.write_bytes(name, old + line.encode())

    # ----------------------------------------------------------- reading
    def exists(self, name: str) -> bool:
        return self.fs.get_file_info(self.join(name)).type != pafs.FileType.NotFound

    def read_bytes(self, name: str) -> bytes:
        path = self.join(name)
        try:
            with self.fs.open_input_stream(path) as f:
                return f.read()
        except FileNotFoundError:
            raise StorageError(f"{self.uri}: {name} does not exist; is this a ray_saturn run folder?") from None

    def read_json(self, name: str) -> Any:
        try:
            return json.loads(self.read_bytes(name))
        except ValueError as exc:
            raise StorageError(f"{self.uri}: {name} is not valid JSON ({exc})") from None

    def read_jsonl(self, name: str) -> list[dict[str, Any]]:
        if not self.exists(name):
            return []
        out = []
        for line in self.read_bytes(name).decode().splitlines():
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    logger.warning("%s: skipping a torn line in %s", self.uri, name)
        return out

    def __repr__(self) -> str:
        return f"RunStorage({self.uri!r})"
