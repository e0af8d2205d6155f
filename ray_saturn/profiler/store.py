"""The profile store: measured configurations cached in one Parquet file.

Rows are keyed by (performance signature, strategy, gpus, nodes); a task
whose signature is already there is not measured again. Each row also keeps
what a segment of it costs besides its steps (set-up, checkpoint save and
load; see :mod:`ray_saturn.profiler.segment`). Trainer start-up probes,
keyed by (hardware, gpus, nodes, trainers started side by side), are kept beside the store in a small JSON
file (``<store>.startup.json``); shares of one device (:mod:`ray_saturn.profiler.shares`), keyed by
(signature, strategy, copies), in another (``<store>.shares.json``).

Example:
    >>> import tempfile, os
    >>> store = ProfileStore(os.path.join(tempfile.mkdtemp(), "store.parquet"))
    >>> store.put(StoredTrial("abc", "ddp", 2, 1, 0.5, True, 1.0, None, "{}", 3.0))
    >>> store.flush(); ProfileStore(store.path).get("abc", "ddp", 2, 1).step_time_s
    0.5
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ray_saturn.errors import ProfileError

__all__ = ["ProfileStore", "StoredShare", "StoredStartup", "StoredTrial"]


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
    setup_s: float | None = None
    checkpoint_save_s: float | None = None
    checkpoint_load_s: float | None = None
    data_s: float | None = None

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
        ("setup_s", pa.float64()),
        ("checkpoint_save_s", pa.float64()),
        ("checkpoint_load_s", pa.float64()),
        ("data_s", pa.float64()),
    ]
)
#: Columns a store written before they existed may lack (read as unknown).
_OPTIONAL = ("setup_s", "checkpoint_save_s", "checkpoint_load_s", "data_s")


@dataclass(frozen=True)
class StoredStartup:
    """A kept trainer start-up probe: ``fit()`` to the loop and loop to return (s), the step
    factor of its calibrations (their median; ``None``: probed before probes calibrated step
    times), and ``step_factors``, the factor per calibrated task signature (empty: probed before
    probes calibrated each signature)."""

    start_s: float
    stop_s: float
    step_factor: float | None = None
    step_factors: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredShare:
    """One measured share 1/``copies`` of a device: the slowest copy's step time (the mean beside it),
    the largest copy's peak memory, the device budget it was checked against, or why it is infeasible."""

    signature: str
    strategy: str
    copies: int
    step_time_s: float | None
    mean_step_s: float | None
    peak_mem_gb: float | None
    budget_gb: float | None
    reason: str | None
    cost_gpu_s: float

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.signature, self.strategy, self.copies)

    @property
    def feasible(self) -> bool:
        return self.reason is None and self.step_time_s is not None


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
            missing = [f.name for f in _SCHEMA if f.name not in table.column_names and f.name not in _OPTIONAL]
            if missing:
                raise ProfileError(f"{self.path}: profile store lacks column(s) {', '.join(missing)}; delete it")
            names = [n for n in _SCHEMA.names if n in table.column_names]
            for row in table.select(names).to_pylist():
                trial = StoredTrial(**row)
                self._rows[trial.key] = trial
        self._startup: dict[tuple[str, int, int, int], StoredStartup] = {}
        spath = self.startup_path
        if spath is not None and spath.exists():
            try:
                for r in json.loads(spath.read_text()):
                    key = (str(r["hardware"]), int(r["gpus"]), int(r["nodes"]), int(r.get("side_by_side", 1)))
                    factor = r.get("step_factor")
                    per_sig = {str(k): float(v) for k, v in dict(r.get("step_factors") or {}).items()}
                    self._startup[key] = StoredStartup(
                        float(r["start_s"]), float(r["stop_s"]), None if factor is None else float(factor), per_sig
                    )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ProfileError(f"{spath}: not a readable start-up store ({exc}); delete it") from None
        self._shares: dict[tuple[str, str, int], StoredShare] = {}
        shpath = self.shares_path
        if shpath is not None and shpath.exists():
            try:
                for r in json.loads(shpath.read_text()):
                    share = StoredShare(**r)
                    self._shares[share.key] = share
            except (OSError, ValueError, TypeError) as exc:
                raise ProfileError(f"{shpath}: not a readable share store ({exc}); delete it") from None

    @property
    def startup_path(self) -> Path | None:
        """Where the trainer start-up probes are kept: beside the store (JSON)."""
        return None if self.path is None else self.path.with_name(self.path.stem + ".startup.json")

    @property
    def shares_path(self) -> Path | None:
        """Where measured shares of a device are kept: beside the store (JSON)."""
        return None if self.path is None else self.path.with_name(self.path.stem + ".shares.json")

    def share(self, signature: str, strategy: str, copies: int) -> StoredShare | None:
        return self._shares.get((signature, strategy, copies))

    def put_share(self, share: StoredShare) -> None:
        self._shares[share.key] = share

    def startup(self, hardware: str, gpus: int, nodes: int, side_by_side: int = 1) -> StoredStartup | None:
        """A trainer start-up probe on this hardware with ``side_by_side`` trainers started at once,
        or ``None`` (a store written before probes ran side by side holds 1s)."""
        return self._startup.get((hardware, gpus, nodes, side_by_side))

    def put_startup(
        self,
        hardware: str,
        gpus: int,
        nodes: int,
        start_s: float,
        stop_s: float,
        side_by_side: int = 1,
        step_factor: float | None = None,
        step_factors: Mapping[str, float] | None = None,
    ) -> None:
        self._startup[(hardware, gpus, nodes, side_by_side)] = StoredStartup(
            float(start_s), float(stop_s), None if step_factor is None else float(step_factor),
            {str(k): float(v) for k, v in (step_factors or {}).items()},
        )

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
        if self._startup and self.startup_path is not None:
            rows = [
                {"hardware": h, "gpus": g, "nodes": n, "side_by_side": k, "start_s": p.start_s, "stop_s": p.stop_s,
                 "step_factor": p.step_factor, "step_factors": dict(sorted(p.step_factors.items()))}
                for (h, g, n, k), p in sorted(self._startup.items())
            ]
            tmp = self.startup_path.with_name(self.startup_path.name + ".tmp")
            tmp.write_text(json.dumps(rows, indent=1))
            os.replace(tmp, self.startup_path)
        if self._shares and self.shares_path is not None:
            shares = [asdict(v) for _, v in sorted(self._shares.items())]
            tmp = self.shares_path.with_name(self.shares_path.name + ".tmp")
            tmp.write_text(json.dumps(shares, indent=1))
            os.replace(tmp, self.shares_path)
