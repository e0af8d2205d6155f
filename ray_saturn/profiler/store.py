"""The profile store: measured configurations cached in one Parquet file.

Rows are keyed by (performance signature, strategy, gpus, nodes); a task
whose signature is already there is not measured again.

Example:
    >>> import tempfile, os
    >>> store = ProfileStore(os.path.join(tempfile.mkdtemp(), "store.parquet"))
    >>> store.put(StoredTrial("abc", "ddp", 2, 1, 0.5, True, 1.0, None, "{}", 3.0))
    >>> store.flush(); ProfileStore(store.path).get("abc", "ddp", 2, 1).step_time_s
    0.5
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ray_saturn.errors import ProfileError

__all__ = ["ProfileStore", "StoredTrial"]


@dataclass(frozen=True)
class StoredTrial:
    """One measured (signature, strategy, gpus, nodes) with its outcome."""

    signature: str
    strategy: str
    gpus: int
    nodes: int
    step_time_s: float | None
    feasible: bool
    peak_mem_gb: float | None
    reason: str | None
    knobs: str
    cost_gpu_s: float

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.signature, self.strategy, self.gpus, self.nodes)


_SCHEMA = pa.schema(
    [
        ("signature", pa.string()),
        ("strategy", pa.string()),
        ("gpus", pa.int64()),
        ("nodes", pa.int64()),
        ("step_time_s", pa.float64()),
        ("feasible", pa.bool_()),
        ("peak_mem_gb", pa.float64()),
        ("reason", pa.string()),
        ("knobs", pa.string()),
        ("cost_gpu_s", pa.float64()),
    ]
)


class ProfileStore:
    """A Parquet-backed cache of measured trials (``path=None``: in memory only)."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        self._rows: dict[tuple[str, str, int, int], StoredTrial] = {}
        if self.path is not None and self.path.exists():
            try:
                table = pq.read_table(self.path)
            except (pa.ArrowInvalid, OSError) as exc:
                raise ProfileError(f"{self.path}: not a readable profile store ({exc}); delete it") from None
            missing = [f.name for f in _SCHEMA if f.name not in table.column_names]
            if missing:
                raise ProfileError(f"{self.path}: profile store lacks column(s) {', '.join(missing)}; delete it")
            for row in table.select(_SCHEMA.names).to_pylist():
                trial = StoredTrial(**row)
                self._rows[trial.key] = trial

    def get(self, signature: str, strategy: str, gpus: int, nodes: int) -> StoredTrial | None:
        return self._rows.get((signature, strategy, gpus, nodes))

    def put(self, trial: StoredTrial) -> None:
        self._rows[trial.key] = trial

    def __len__(self) -> int:
        return len(self._rows)

    def flush(self) -> None:
        """Write the store atomically (temp file, then rename)."""
        if self.path is None:
            return
        names = [f.name for f in fields(StoredTrial)]
        rows = [asdict(t) for t in self._rows.values()]
        table = pa.table({n: [r[n] for r in rows] for n in names}, schema=_SCHEMA)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, self.path)
