"""Checkpoints that move between strategies, worker counts and nodes, on any storage.

A checkpoint is a folder ``step-<9 digits>`` under the task's checkpoint
folder, which is a :class:`~ray_saturn.runtime.storage.RunStorage` location:
a local path, an NFS mount, or an object store URI (``s3://...``). It is
written with ``torch.distributed.checkpoint`` (DCP): each worker writes its
own shard straight to the storage, and DCP's metadata lets any other layout
read it back (FSDP on 2 workers -> DDP on 1 -> a pipeline on 2, ...), each
worker reading only the byte ranges it holds. Model and optimizer state are
keyed by the model's own parameter names (optimizer state flattened per
parameter). Beside the tensors, ``meta.json`` holds the step count and the
data position (global batches consumed), so a restart neither repeats nor
skips a sample.

Why DCP through the run's pyarrow filesystem, and not Ray Train's checkpoint
persistence (``ray.train.report(checkpoint=...)`` into ``RunConfig(storage_path)``):

- resharding: Ray Train hands a restarted worker the *whole* checkpoint
  directory (every rank downloads every shard before DCP can read it);
  DCP on the storage itself reads only each worker's slices;
- one reader for everyone: the driver (progress), the profiler (save/load
  costs), the Tune trainable and a resumed run all read the same folders
  with the same verification, without Ray Train's controller state;
- the same filesystem object as the run folder (:mod:`ray_saturn.runtime.storage`),
  so a URI, its options and its credentials mean the same thing everywhere.

Ray Train still runs each segment (and keeps its own run state under
``tasks/<task>/``); only the checkpoint bytes take this path.

Completion is atomic without a rename (object stores have none): the shards
and DCP's ``.metadata`` are written first, and ``meta.json`` last, by rank 0
after every worker has finished; a folder without ``meta.json`` is not a
checkpoint. Re-writing a step first removes its ``meta.json``.

Trust nothing read back (issue 16): before a checkpoint is used it is
*verified*: ``meta.json`` parses and names this step, DCP's metadata
unpickles with an unpickler that only accepts DCP's own metadata classes
(named exactly: no dotted names, no entry for a non-tensor value),
and every file the metadata names is present and at least as long as the
byte ranges it lists. A checkpoint that fails (truncated shard, missing
file, torn metadata), or whose tensors fail to read, is skipped with a
warning that says which and why (a ``corrupt.json`` note is left in it) and
the newest intact one is used instead; :func:`latest_step` (what the driver
reports as progress) counts only intact checkpoints. Tensors are read with
``torch.load(weights_only=True)`` (by DCP); a non-tensor entry, which DCP
would ``torch.load`` with ``weights_only=False``, is refused; every path stays under the given
folder (names are built from step numbers; local symlinks are not followed).

Example:
    >>> import tempfile
    >>> latest_step(tempfile.mkdtemp()) is None
    True
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import posixpath
import re
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from ray_saturn.errors import SaturnError
from ray_saturn.runtime.storage import RunStorage, StorageError, child_uri

__all__ = [
    "CheckpointError",
    "CheckpointMeta",
    "CheckpointStatus",
    "Loaded",
    "checkpoint_path",
    "checkpoints",
    "latest_checkpoint",
    "latest_step",
    "load_checkpoint",
    "load_latest",
    "read_meta",
    "save_checkpoint",
    "verify_checkpoint",
]

log = logging.getLogger(__name__)

_STEP_RE = re.compile(r"step-([0-9]{9})")  # fullmatch: ASCII digits, no trailing newline
META_FILE = "meta.json"
DCP_METADATA_FILE = ".metadata"
CORRUPT_NOTE = "corrupt.json"
FORMAT = 1
_READ_BUFFER = 16 << 20  # bytes buffered in front of a remote shard (reads ahead, writes behind)


class CheckpointError(SaturnError, ValueError):
    """A checkpoint folder is missing, unsafe, corrupt or does not fit the model being loaded."""


@dataclass(frozen=True)
class CheckpointMeta:
    """What ``meta.json`` records beside the tensors."""

    step: int
    data_position: int
    strategy: str
    world_size: int
    task: str
    loss: float | None = None
    format: int = FORMAT
    written_at: float = 0.0


@dataclass(frozen=True)
class CheckpointStatus:
    """One ``step-*`` folder: its step, location, and why it cannot be used (``None``: intact)."""

    step: int
    location: str
    problem: str | None

    @property
    def intact(self) -> bool:
        return self.problem is None


# ------------------------------------------------------------------ paths
def _store(checkpoint_dir: str | os.PathLike[str] | RunStorage) -> RunStorage:
    if isinstance(checkpoint_dir, RunStorage):
        return checkpoint_dir
    return RunStorage.at(os.fspath(checkpoint_dir))


def _name(step: int) -> str:
    return f"step-{int(step):09d}"


def checkpoint_path(checkpoint_dir: str | os.PathLike[str] | RunStorage, step: int) -> str:
    """The location (local path or URI) of the checkpoint at ``step`` (it may not exist)."""
    return _store(checkpoint_dir).uri_of(_name(step))


def _step_folder(store: RunStorage, path: str | os.PathLike[str]) -> str:
    """The ``step-*`` name of ``path``, which must be a checkpoint folder directly under ``store``."""
    loc = os.fspath(path)
    if store.local:
        real, root = os.path.realpath(loc), os.path.realpath(store.path)
        if os.path.dirname(real) != root or not _STEP_RE.fullmatch(os.path.basename(real)):
            raise CheckpointError(f"{loc} is outside the checkpoint folder {root}; refusing to use it")
        return os.path.basename(real)
    name = posixpath.basename(loc.split("?")[0].rstrip("/"))
    if not _STEP_RE.fullmatch(name) or child_uri(store.uri, name) != loc:
        raise CheckpointError(f"{loc} is outside the checkpoint folder {store.display}; refusing to use it")
    return name


def _listing(store: RunStorage) -> dict[str, dict[str, int]]:
    """``{step folder: {file: size}}`` of every ``step-*`` folder (one recursive listing)."""
    out: dict[str, dict[str, int]] = {}
    for st in store.list(recursive=True):
        top, _, rest = st.name.partition("/")
        if not _STEP_RE.fullmatch(top):
            continue
        if store.local and os.path.islink(store.join(top)):
            continue  # a symlinked checkpoint is not followed
        files = out.setdefault(top, {})
        if rest and "/" not in rest and not st.is_dir:
            files[rest] = int(st.size or 0)
    return out


# ----------------------------------------------------------- safe metadata
#: The classes DCP's metadata of a tensors-only checkpoint is made of, by module: nothing else unpickles.
#: Exact names only: pickle (protocol 4+) resolves a dotted name attribute by attribute, so a module's
#: whole namespace (``filesystem.os.system``, ``FileSystem.rm_file``) must never be reachable by prefix.
_SAFE_CLASSES = {
    "torch.distributed.checkpoint.metadata": frozenset({
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING",
    }),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo", "_StoragePrefix", "SerializationFormat"}),
}
_SAFE_GLOBALS = {
    ("collections", "OrderedDict"),
    ("torch", "Size"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("torch", "device"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Accepts DCP's metadata dataclasses, torch dtypes and sizes; nothing else (no dotted names:
    ``module.attr.attr`` would reach anything a module imported)."""

    def find_class(self, module: str, name: str) -> Any:
        if "." not in name:
            if name in _SAFE_CLASSES.get(module, ()) or (module, name) in _SAFE_GLOBALS:
                return super().find_class(module, name)
            if module == "torch" and isinstance(
                getattr(torch, name, None), (torch.dtype, torch.memory_format, torch.layout)
            ):
                return getattr(torch, name)
        raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}, which is not allowed")


def _read_dcp_metadata(store: RunStorage, folder: str) -> Any:
    data = store.read_bytes(f"{folder}/{DCP_METADATA_FILE}")
    try:
        return _MetadataUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{store.uri_of(folder, DCP_METADATA_FILE)}: {exc}") from None
    except Exception as exc:  # a torn or garbled pickle
        raise CheckpointError(
            f"{store.uri_of(folder, DCP_METADATA_FILE)}: unreadable DCP metadata ({type(exc).__name__})"
        ) from None


def _read_meta(store: RunStorage, folder: str) -> CheckpointMeta:
    where = store.uri_of(folder, META_FILE)
    try:
        data = store.read_json(f"{folder}/{META_FILE}")
        meta = CheckpointMeta(**{k: data[k] for k in CheckpointMeta.__dataclass_fields__ if k in data})
        int(meta.step), int(meta.data_position)
    except (StorageError, ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{where}: not a readable checkpoint record ({exc})") from None
    return meta


def _parent(loc: str) -> str:
    """The folder (local path or URI, options kept) that holds the checkpoint at ``loc``."""
    if "://" not in loc:
        return os.path.dirname(os.path.abspath(loc))
    base, _, query = loc.partition("?")
    return base.rstrip("/").rsplit("/", 1)[0] + (f"?{query}" if query else "")


def read_meta(path: str | os.PathLike[str]) -> CheckpointMeta:
    """``meta.json`` of the checkpoint folder ``path``."""
    loc = os.fspath(path)
    store = _store(_parent(loc))
    return _read_meta(store, _step_folder(store, loc))


def _problem(store: RunStorage, folder: str, files: dict[str, int]) -> str | None:
    """Why the checkpoint ``folder`` (whose files and sizes are ``files``) cannot be trusted; ``None`` if intact."""
    if META_FILE not in files:
        return "incomplete: no meta.json (the write did not finish)"
    if store.local:  # every file of a checkpoint is in it: a link is not followed (it may lead anywhere)
        with contextlib.suppress(OSError):
            links = sorted(e.name for e in os.scandir(store.join(folder)) if e.is_symlink())
            if links:
                return f"{links[0]} is a symbolic link; a checkpoint's files must be in its folder (not followed)"
    if CORRUPT_NOTE in files:
        try:
            note = store.read_json(f"{folder}/{CORRUPT_NOTE}")
            return f"marked corrupt earlier: {note.get('reason', '?')}"
        except StorageError:
            return "marked corrupt earlier"
    try:
        meta = _read_meta(store, folder)
    except CheckpointError as exc:
        return str(exc)
    if meta.format != FORMAT:
        return f"checkpoint format {meta.format}, this ray_saturn reads format {FORMAT}"
    if _name(meta.step) != folder:
        return f"meta.json says step {meta.step}, but the folder is {folder}"
    if DCP_METADATA_FILE not in files:
        return "DCP metadata (.metadata) is missing"
    try:
        md = _read_dcp_metadata(store, folder)
    except (CheckpointError, StorageError) as exc:
        return str(exc)
    need: dict[str, int] = {}
    for info in (getattr(md, "storage_data", None) or {}).values():
        rel = str(getattr(info, "relative_path", ""))
        if not rel or "/" in rel or rel.startswith("."):
            return f"DCP metadata names a file outside the checkpoint ({rel!r})"
        need[rel] = max(need.get(rel, 0), int(info.offset) + int(info.length))
    for rel, size in sorted(need.items()):
        if rel not in files:
            return f"{rel} is missing"
        if files[rel] < size:
            return f"{rel} is truncated ({files[rel]} of at least {size} bytes)"
    return None


_warned: set[tuple[str, str]] = set()


def _warn_skip(status: CheckpointStatus) -> None:
    key = (status.location, status.problem or "")
    if key not in _warned:
        _warned.add(key)
        log.warning("skipping checkpoint %s: %s", status.location, status.problem)


def checkpoints(checkpoint_dir: str | os.PathLike[str] | RunStorage) -> list[CheckpointStatus]:
    """Every ``step-*`` folder, newest first, each verified (see the module docstring)."""
    store = _store(checkpoint_dir)
    out = []
    for folder, files in sorted(_listing(store).items(), reverse=True):
        step = int(_STEP_RE.fullmatch(folder).group(1))  # type: ignore[union-attr]
        out.append(CheckpointStatus(step, store.uri_of(folder), _problem(store, folder, files)))
    return out


def verify_checkpoint(path: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str] | RunStorage) -> str | None:
    """Why the checkpoint at ``path`` cannot be used, or ``None`` when it is intact."""
    store = _store(checkpoint_dir)
    folder = _step_folder(store, path)
    files = _listing(store).get(folder)
    if files is None:
        return "no such checkpoint"
    return _problem(store, folder, files)


def _intact(checkpoint_dir: str | os.PathLike[str] | RunStorage) -> list[CheckpointStatus]:
    found = []
    for status in checkpoints(checkpoint_dir):
        if status.intact:
            found.append(status)
        elif not status.problem.startswith("incomplete"):  # type: ignore[union-attr]
            _warn_skip(status)  # an unfinished write is normal after a crash; a damaged one is not
    return found


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str] | RunStorage) -> str | None:
    """The location of the newest intact checkpoint, or ``None``."""
    found = _intact(checkpoint_dir)
    return found[0].location if found else None


def latest_step(checkpoint_dir: str | os.PathLike[str] | RunStorage) -> int | None:
    """The step of the newest intact checkpoint in ``checkpoint_dir``, or ``None``.

    Example:
        >>> import tempfile
        >>> latest_step(tempfile.mkdtemp()) is None
        True
    """
    found = _intact(checkpoint_dir)
    return found[0].step if found else None


# ------------------------------------------------------- DCP on a pyarrow filesystem
def _dcp_fs(store: RunStorage) -> Any:
    """DCP's filesystem interface on the storage's pyarrow filesystem (local files stay real files)."""
    from torch.distributed.checkpoint.filesystem import FileSystemBase

    class ArrowFileSystem(FileSystemBase):
        @contextlib.contextmanager
        def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
            path = os.fspath(path)
            if store.local:
                root = os.path.realpath(store.path)
                if not os.path.realpath(path).startswith(root.rstrip(os.sep) + os.sep):
                    raise CheckpointError(f"{path}: a symbolic link leads out of the checkpoint folder {root}")
                with open(path, mode) as f:
                    yield f
            elif "w" in mode:
                with store.fs.open_output_stream(path) as raw, io.BufferedWriter(raw, _READ_BUFFER) as f:
                    yield f
            else:
                # DCP reads each tensor in many small pieces: on an object store every unbuffered
                # read is a ranged GET. A large read-ahead buffer makes it a few big ones.
                with store.fs.open_input_file(path) as raw, io.BufferedReader(raw, _READ_BUFFER) as f:
                    yield f

        def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
            return posixpath.join(os.fspath(path), suffix)

        def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
            if store.local:
                os.replace(path, new_path)
            else:
                store.fs.move(os.fspath(path), os.fspath(new_path))

        def init_path(self, path: str | os.PathLike[str]) -> str:
            return os.fspath(path)

        def mkdir(self, path: str | os.PathLike[str]) -> None:
            store.fs.create_dir(os.fspath(path), recursive=True)

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
            return True

        def exists(self, path: str | os.PathLike[str]) -> bool:
            import pyarrow.fs as pafs

            return store.fs.get_file_info(os.fspath(path)).type != pafs.FileType.NotFound

        def rm_file(self, path: str | os.PathLike[str]) -> None:
            store.fs.delete_file(os.fspath(path))

    return ArrowFileSystem()


def _writer(store: RunStorage, folder: str) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter

    # fsync only means something on a local disk (an object is durable once its PUT returns).
    writer = FileSystemWriter(store.join(folder), sync_files=store.local)
    writer.fs = _dcp_fs(store)
    return writer


def _planner() -> Any:
    """DCP's default load planner, except that a non-tensor entry is refused instead of ``torch.load``-ed
    with ``weights_only=False`` (a pickle: code could run). ray_saturn writes tensors only."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class TensorsOnlyLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            raise CheckpointError(
                f"the checkpoint holds a non-tensor entry ({read_item.dest_index.fqn}); ray_saturn checkpoints "
                "hold tensors only, and a non-tensor entry would be unpickled: refusing it"
            )

    return TensorsOnlyLoadPlanner()


def _reader(store: RunStorage, folder: str) -> Any:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = _read_dcp_metadata(store, folder)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    reader = SafeReader(store.join(folder))
    reader.fs = _dcp_fs(store)
    return reader


# ----------------------------------------------------------- state dicts
def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(module, optimizer, options=_options())
    return model_sd, optim_sd


def _tensors_only(sd: dict[str, Any]) -> dict[str, Any]:
    # Non-tensor optimizer entries (lr, betas, ...) come from the task's optimizer factory
    # when loading; only tensors are saved, so no pickled object is ever read back.
    return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}


# --------------------------------------------------------------- collectives
def _dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _dist() else 0


def _barrier() -> None:
    if _dist():
        dist.barrier()


def _broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (so all workers pick the same checkpoint)."""
    if not _dist():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ------------------------------------------------------------------- save/load
def save_checkpoint(
    checkpoint_dir: str | os.PathLike[str] | RunStorage,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    data_position: int,
    strategy: str,
    task: str,
    loss: float | None = None,
    keep: int = 2,
) -> str:
    """Write a checkpoint atomically (collective: every worker calls it); returns its location.

    Keeps the newest ``keep`` intact checkpoints and removes older ones and
    leftovers of interrupted writes. Nothing else happens inside, so the
    call's wall time is the checkpoint's save cost.

    Example:
        >>> import tempfile, torch
        >>> m = torch.nn.Linear(2, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        >>> d = tempfile.mkdtemp()
        >>> save_checkpoint(d, m, opt, step=3, data_position=3, strategy="single", task="t").endswith("step-000000003")
        True
    """
    import torch.distributed.checkpoint as dcp

    store = _store(checkpoint_dir)
    folder = _name(step)
    if _rank() == 0:
        # Re-writing a step: un-commit it first (meta.json), then clear it.
        store.delete(f"{folder}/{META_FILE}", missing_ok=True)
        store.delete_dir(folder)
        store.fs.create_dir(store.join(folder), recursive=True)
    _barrier()
    model_sd, optim_sd = _state(module, optimizer)
    with warnings.catch_warnings():  # one process without a process group is a supported case
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", message=".*Detected an existing checkpoint.*")
        dcp.save(
            {"model": _tensors_only(model_sd), "optim": _tensors_only(optim_sd)},
            storage_writer=_writer(store, folder),
        )
    _barrier()
    if _rank() == 0:
        meta = CheckpointMeta(
            step, data_position, strategy, dist.get_world_size() if _dist() else 1, task, loss, FORMAT, time.time()
        )
        store.write_json(f"{folder}/{META_FILE}", asdict(meta))  # the commit
        _prune(store, keep, folder)
    _barrier()
    return store.uri_of(folder)


def _prune(store: RunStorage, keep: int, current: str) -> None:
    """Remove checkpoints older than the ``keep`` newest intact ones, and unfinished writes."""
    statuses = checkpoints(store)
    intact = [s for s in statuses if s.intact]
    oldest_kept = intact[: max(1, keep)][-1].step if intact else None
    for s in statuses:
        folder = _name(s.step)
        unfinished = s.problem is not None and s.problem.startswith("incomplete") and folder != current
        if unfinished or (oldest_kept is not None and s.step < oldest_kept):
            with contextlib.suppress(StorageError):
                store.delete_dir(folder)
    for st in store.list():  # leftovers of the earlier layout (rename-based commits)
        if st.is_dir and st.name.startswith((".tmp-step-", ".old-step-")):
            with contextlib.suppress(StorageError):
                store.delete_dir(st.name)


def load_checkpoint(
    path: str | os.PathLike[str],
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    checkpoint_dir: str | os.PathLike[str] | RunStorage | None = None,
) -> CheckpointMeta:
    """Load the checkpoint at ``path`` into this worker's module and optimizer (collective).

    The module may be laid out differently from the writer (sharded, a
    pipeline stage, another worker count): each worker reads what it holds.
    The checkpoint is verified first (see the module docstring).
    """
    loc = os.fspath(path)
    store = _store(_parent(loc) if checkpoint_dir is None else checkpoint_dir)
    if store.local and "://" not in loc:
        loc = os.path.abspath(loc)
    folder = _step_folder(store, loc)
    files = _listing(store).get(folder, {})
    problem = _problem(store, folder, files)
    if problem is not None:
        if problem.startswith("incomplete"):
            raise CheckpointError(
                f"{loc} is not a complete checkpoint (no {META_FILE}); pick one that latest_checkpoint lists"
            )
        raise CheckpointError(f"{loc}: {problem}")
    meta = _read_meta(store, folder)
    return _load(store, folder, module, optimizer, meta)


class _ReadFailed(CheckpointError):
    """The checkpoint's tensors could not be read (damaged data, not a model mismatch)."""


def _load(
    store: RunStorage, folder: str, module: torch.nn.Module, optimizer: torch.optim.Optimizer, meta: CheckpointMeta
) -> CheckpointMeta:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_state_dict

    loc = store.uri_of(folder)
    model_sd, optim_sd = _state(module, optimizer)
    target = {"model": _tensors_only(model_sd), "optim": _tensors_only(optim_sd)}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.load(target, storage_reader=_reader(store, folder), planner=_planner())
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        cause = lines[-1][:300] if lines else type(exc).__name__  # the innermost error
        stage = exc.args[0] if isinstance(exc, CheckpointException) and exc.args else ""
        inner = [f[0] for f in getattr(exc, "failures", {}).values() if isinstance(f, tuple) and f]
        if any(isinstance(e, OSError) for e in inner):  # the storage, not the data: do not blame the checkpoint
            raise StorageError(f"{loc}: cannot read the checkpoint ({cause})") from None
        if stage == "read":
            raise _ReadFailed(f"{loc}: its tensors could not be read ({cause})") from None
        raise CheckpointError(
            f"{loc} does not fit this model/optimizer ({cause}); was it written by another task?"
        ) from None
    model_sd.update(target["model"])
    optim_sd.update(target["optim"])
    set_state_dict(module, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=_options())
    return meta


@dataclass(frozen=True)
class Loaded:
    """What :func:`load_latest` loaded: the record and the checkpoint's location."""

    meta: CheckpointMeta
    location: str


def load_latest(
    checkpoint_dir: str | os.PathLike[str] | RunStorage, module: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> Loaded | None:
    """Load the newest checkpoint that verifies and reads (collective); ``None`` if there is none.

    A checkpoint that fails verification, or whose tensors fail to read, is
    skipped with a warning (and a ``corrupt.json`` note in it, so every later
    reader skips it too) and the next older intact one is tried. A
    checkpoint that reads but does not fit the model is an error, not skipped.
    """
    store = _store(checkpoint_dir)
    steps = _broadcast([s.step for s in _intact(store)] if _rank() == 0 else None)
    for step in steps:
        folder = _name(step)
        try:
            meta = _read_meta(store, folder)
            return Loaded(_load(store, folder, module, optimizer, meta), store.uri_of(folder))
        except _ReadFailed as exc:
            reason = str(exc)
            log.warning("skipping checkpoint %s: %s; trying an older one", store.uri_of(folder), reason)
            if _rank() == 0:
                with contextlib.suppress(StorageError):
                    store.write_json(f"{folder}/{CORRUPT_NOTE}", {"reason": reason[:500], "at": time.time()})
            _barrier()
    return None
