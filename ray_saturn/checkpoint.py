"""Checkpoints that move between strategies and worker counts.

A checkpoint is a folder ``step-<9 digits>`` under the task's checkpoint
folder, written with ``torch.distributed.checkpoint`` (DCP): each worker
writes its own shard, and DCP's metadata lets any other layout read it back
(FSDP on 2 workers -> DDP on 1 -> a pipeline on 2, ...). Model and optimizer
state are keyed by the model's own parameter names (optimizer state flattened
per parameter), so a pipeline stage or an FSDP shard simply holds a subset or
a slice. Beside the tensors, ``meta.json`` holds the step count and the data
position (global batches consumed), so a restart neither repeats nor skips a
sample.

Writes are atomic: everything goes into ``.tmp-step-...`` first, and only
after every worker has finished does rank 0 rename it to ``step-...``; a crash
mid-write leaves the previous checkpoint as the latest. Loading never runs
arbitrary pickles: tensors are read with ``torch.load(weights_only=True)``
(by DCP) and DCP's metadata file with an unpickler that only accepts DCP's own
metadata classes. Every path stays under the given folder.

Example:
    >>> import tempfile
    >>> latest_step(tempfile.mkdtemp()) is None
    True
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import re
import shutil
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ray_saturn.errors import SaturnError

__all__ = [
    "CheckpointError",
    "CheckpointMeta",
    "checkpoint_path",
    "latest_checkpoint",
    "latest_step",
    "load_checkpoint",
    "save_checkpoint",
]

log = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^step-(\d{9})$")
_META = "meta.json"
FORMAT = 1


class CheckpointError(SaturnError, ValueError):
    """A checkpoint folder is missing, unsafe or does not fit the model being loaded."""


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


# ------------------------------------------------------------------ paths
def _root(checkpoint_dir: str | os.PathLike[str]) -> Path:
    return Path(checkpoint_dir).resolve()


def _inside(path: Path, root: Path) -> Path:
    resolved = path.resolve()
    if resolved != root and root not in resolved.parents:
        raise CheckpointError(f"{path} is outside the checkpoint folder {root}; refusing to use it")
    return resolved


def checkpoint_path(checkpoint_dir: str | os.PathLike[str], step: int) -> Path:
    """The folder of the checkpoint at ``step`` (it may not exist)."""
    root = _root(checkpoint_dir)
    return _inside(root / f"step-{int(step):09d}", root)


def _committed(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = _STEP_RE.match(entry.name)
        if m and entry.is_dir() and not entry.is_symlink() and (entry / _META).is_file():
            found.append((int(m.group(1)), entry))
    return sorted(found)


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint folder, or ``None``."""
    found = _committed(_root(checkpoint_dir))
    return found[-1][1] if found else None


def latest_step(checkpoint_dir: str | os.PathLike[str]) -> int | None:
    """The step of the newest complete checkpoint in ``checkpoint_dir``, or ``None``.

    Example:
        >>> import tempfile
        >>> latest_step(tempfile.mkdtemp()) is None
        True
    """
    found = _committed(_root(checkpoint_dir))
    return found[-1][0] if found else None


def read_meta(path: str | os.PathLike[str]) -> CheckpointMeta:
    p = Path(path) / _META
    try:
        data = json.loads(p.read_text())
        return CheckpointMeta(
            **{k: data[k] for k in CheckpointMeta.__dataclass_fields__ if k in data}
        )
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{p}: not a readable checkpoint record ({exc})") from None


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


# ------------------------------------------------------- safe metadata
_SAFE_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
)
_SAFE_GLOBALS = {
    ("collections", "OrderedDict"),
    ("torch", "Size"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("torch", "device"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Accepts DCP's metadata dataclasses, torch dtypes and sizes; nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _SAFE_MODULES and not name.startswith("__"):
            return super().find_class(module, name)
        if module == "torch" and isinstance(
            getattr(torch, name, None), (torch.dtype, torch.memory_format, torch.layout)
        ):
            return getattr(torch, name)
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"checkpoint metadata refers to {module}.{name}, which is not allowed"
        )


def _safe_reader(path: Path):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            rank = kwargs.get("rank")
            meta_path = self._get_metadata_path(rank)
            with self.fs.create_stream(meta_path, "rb") as f:
                try:
                    metadata = _MetadataUnpickler(io.BytesIO(f.read())).load()
                except pickle.UnpicklingError as exc:
                    raise CheckpointError(f"{meta_path}: {exc}") from None
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(str(path))


# --------------------------------------------------------------- collectives
def _dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _dist() else 0


def _barrier() -> None:
    if _dist():
        dist.barrier()


# ------------------------------------------------------------------- save/load
def save_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    data_position: int,
    strategy: str,
    task: str,
    loss: float | None = None,
    keep: int = 2,
) -> Path:
    """Write a checkpoint atomically (collective: every worker calls it); returns its folder.

    Keeps the newest ``keep`` checkpoints and removes older ones and leftovers
    of interrupted writes.

    Example:
        >>> import tempfile, torch
        >>> m = torch.nn.Linear(2, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        >>> d = tempfile.mkdtemp()
        >>> save_checkpoint(d, m, opt, step=3, data_position=3, strategy="single", task="t").name
        'step-000000003'
    """
    import torch.distributed.checkpoint as dcp

    root = _root(checkpoint_dir)
    final = checkpoint_path(root, step)
    tmp = _inside(root / f".tmp-{final.name}", root)
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
    _barrier()
    model_sd, optim_sd = _state(module, optimizer)
    with warnings.catch_warnings():  # one process without a process group is a supported case
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.save(
            {"model": _tensors_only(model_sd), "optim": _tensors_only(optim_sd)},
            storage_writer=dcp.FileSystemWriter(str(tmp)),
        )
    _barrier()
    if _rank() == 0:
        meta = CheckpointMeta(
            step,
            data_position,
            strategy,
            dist.get_world_size() if _dist() else 1,
            task,
            loss,
            FORMAT,
            time.time(),
        )
        with open(tmp / _META, "w") as f:
            json.dump(asdict(meta), f)
            f.flush()
            os.fsync(f.fileno())
        old = None
        if final.exists():  # re-writing a step: move the old one aside, then swap
            old = _inside(root / f".old-{final.name}", root)
            if old.exists():
                shutil.rmtree(old)
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        _prune(root, keep)
    _barrier()
    return final


def _prune(root: Path, keep: int) -> None:
    committed = _committed(root)
    for _, path in committed[: max(0, len(committed) - max(1, keep))]:
        shutil.rmtree(_inside(path, root), ignore_errors=True)
    for entry in root.iterdir():
        if (
            entry.name.startswith((".tmp-step-", ".old-step-"))
            and entry.is_dir()
            and not entry.is_symlink()
        ):
            shutil.rmtree(_inside(entry, root), ignore_errors=True)


def load_checkpoint(
    path: str | os.PathLike[str],
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    checkpoint_dir: str | os.PathLike[str] | None = None,
) -> CheckpointMeta:
    """Load a checkpoint folder into this worker's module and optimizer (collective).

    The module may be laid out differently from the writer (sharded, a
    pipeline stage, another worker count): each worker reads what it holds.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = Path(path)
    if checkpoint_dir is not None:
        path = _inside(path, _root(checkpoint_dir))
    if not (path / _META).is_file():
        raise CheckpointError(
            f"{path} is not a complete checkpoint (no {_META}); "
            "pick one that latest_checkpoint lists"
        )
    meta = read_meta(path)
    if meta.format != FORMAT:
        raise CheckpointError(
            f"{path}: checkpoint format {meta.format}, this ray_saturn reads format {FORMAT}"
        )
    _safe_reader(path).read_metadata()  # refuse foreign pickles before DCP wraps the error
    model_sd, optim_sd = _state(module, optimizer)
    target = {"model": _tensors_only(model_sd), "optim": _tensors_only(optim_sd)}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.load(target, storage_reader=_safe_reader(path))
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        cause = lines[-1][:300] if lines else type(exc).__name__  # the innermost error
        raise CheckpointError(
            f"{path} does not fit this model/optimizer ({cause}); was it written by another task?"
        ) from None
    model_sd.update(target["model"])
    optim_sd.update(target["optim"])
    set_state_dict(
        module, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=_options()
    )
    return meta
