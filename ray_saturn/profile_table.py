"""The profile table: measured cost of every (task, strategy, GPU count, node count).

This is contract 1 of the design brief. One row per configuration; the
columns are

=============  ==========  ==================================================
task           string      task name, unique per task
strategy       string      registered strategy name, e.g. ``ddp``, ``fsdp`` (any case: read lower case)
gpus           int >= 1    GPUs the configuration uses in total, or a share
                           1/2, 1/4 or 1/8 of one device (nodes = 1; written
                           as 0.5, 0.25, 0.125 or "1/4"): the task shares the
                           device with others
nodes          int >= 1    nodes it spans, GPUs split evenly (default 1)
step_time_s    float > 0   seconds per optimizer step (empty if infeasible)
steps          int >= 1    optimizer steps the task still needs
feasible       bool        false: does not fit / failed (default true)
peak_mem_gb    float       optional, peak memory per GPU (per copy for a share)
gpu_type       string      optional: the GPU type the row was measured on
                           (runs only on nodes of that type); empty = any
device_mem_gb  float > 0   optional: the device's memory; a row whose copies
                           (k for a 1/k share, else 1) x peak_mem_gb exceed
                           it is infeasible
startup_s      float >= 0  optional: a segment's launch to its first step
                           (trainer start, model build), default 0
checkpoint_save_s  float   optional, >= 0: one checkpoint save, default 0
checkpoint_load_s  float   optional, >= 0: loading the checkpoint when a
                           segment resumes (after a move or a failure), default 0
weight         float > 0   optional: the task's relative weight for the
                           completion objective, default 1
arrival_s      float >= 0  optional: the task's arrival time (``--arrivals profile``)
reason         string      optional: why a row is infeasible
=============  ==========  ==================================================

A configuration runs ``startup_s + steps x step_time_s`` (:attr:`Config.runtime_s`);
tables without the optional columns keep their old meaning (start-up 0).
Moving a running task costs stop + ``checkpoint_save_s`` + the target's
``startup_s`` + ``checkpoint_load_s`` (see :mod:`ray_saturn.control.replan`).

A share row (``gpus`` = 1/k) is measured with k copies of the job on one
device at once: ``step_time_s`` is the step time under that sharing and
``peak_mem_gb`` the peak memory of one copy. Tables without shares keep a
whole-number ``gpus`` column; tables without ``gpu_type`` fit every node.

Extra columns are allowed and kept. The table is Arrow-backed and reads and
writes CSV and Parquet.

Example:
    >>> table = ProfileTable.from_rows([
    ...     {"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 2.0, "steps": 10},
    ...     {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.1, "steps": 10},
    ... ])
    >>> [c.runtime_s for c in table.configs("a")]
    [20.0, 11.0]
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from ray_saturn.errors import ProfileError, SaturnError, SpecError
from ray_saturn.limits import (
    MAX_GPUS,
    MAX_NODES,
    MAX_RUNTIME_S,
    MAX_STEPS,
    MAX_WEIGHT,
    MIN_WEIGHT,
    number,
    whole,
)
from ray_saturn.spec import canonical_strategy, check_gpu_type, check_name

__all__ = [
    "COLUMNS",
    "COST_COLUMNS",
    "OPTIONAL_COLUMNS",
    "Config",
    "ProfileTable",
    "is_empty_cell",
    "knobs_for",
    "parse_knobs",
]

#: Column name -> Arrow type, in canonical order.
COLUMNS: dict[str, pa.DataType] = {
    "task": pa.string(),
    "strategy": pa.string(),
    "gpus": pa.int64(),
    "nodes": pa.int64(),
    "step_time_s": pa.float64(),
    "steps": pa.int64(),
    "feasible": pa.bool_(),
    "peak_mem_gb": pa.float64(),
}
#: The device shares a row may give as ``gpus`` (1/k of one device), by k.
SHARES = {2: 0.5, 4: 0.25, 8: 0.125}
#: Optional per-segment costs (seconds, >= 0, default 0), kept in the canonical table when present.
COST_COLUMNS = ("startup_s", "checkpoint_save_s", "checkpoint_load_s")
REQUIRED = ("task", "strategy", "gpus", "step_time_s", "steps")
#: Every optional column ray_saturn reads, and what it holds (any other column is kept as it is).
OPTIONAL_COLUMNS: dict[str, str] = {
    "nodes": "nodes the configuration spans (default 1)",
    "feasible": "false: does not fit / failed (default true)",
    "peak_mem_gb": "peak memory per GPU",
    "gpu_type": "the GPU type the row was measured on (empty: any)",
    "device_mem_gb": "the device's memory (a row whose copies exceed it is infeasible)",
    "startup_s": "a segment's launch to its first step (default 0)",
    "checkpoint_save_s": "one checkpoint save (default 0)",
    "checkpoint_load_s": "loading the checkpoint when a segment resumes (default 0)",
    "weight": "the task's relative weight for --objective completion (default 1)",
    "arrival_s": "the task's arrival time, for --arrivals profile",
    "reason": "why a row is infeasible",
}
_TRUE = {"true", "1", "yes", "t", "y"}
_FALSE = {"false", "0", "no", "f", "n"}


@dataclass(frozen=True)
class Config:
    """One row of the table: a way to run a task."""

    task: str
    strategy: str
    gpus: int | float
    nodes: int
    step_time_s: float | None
    steps: int
    feasible: bool = True
    peak_mem_gb: float | None = None
    reason: str | None = None
    startup_s: float = 0.0
    checkpoint_save_s: float = 0.0
    checkpoint_load_s: float = 0.0
    gpu_type: str | None = None

    @property
    def key(self) -> tuple[str, str, int | float, int]:
        """(task, strategy, gpus, nodes): how results are keyed, never by position."""
        return (self.task, self.strategy, self.gpus, self.nodes)

    @property
    def row_key(self) -> tuple[str, str, int | float, int, str | None]:
        """:attr:`key` plus the GPU type: unique per row of a table."""
        return (*self.key, self.gpu_type)

    @property
    def is_share(self) -> bool:
        """True for a share of one device (``gpus`` = 1/k)."""
        return self.gpus < 1

    @property
    def copies(self) -> int:
        """How many copies share the device (k for a 1/k share; 1 for whole GPUs)."""
        return round(1 / self.gpus) if self.is_share else 1

    @property
    def gpus_per_node(self) -> int | float:
        return self.gpus if self.is_share else self.gpus // self.nodes

    def to_row(self) -> dict[str, Any]:
        """The row as a dict of contract-1 columns (plus ``reason`` when set)."""
        row: dict[str, Any] = {
            "task": self.task,
            "strategy": self.strategy,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "step_time_s": self.step_time_s,
            "steps": self.steps,
            "feasible": self.feasible,
            "peak_mem_gb": self.peak_mem_gb,
        }
        if self.reason is not None:
            row["reason"] = self.reason
        if self.gpu_type is not None:
            row["gpu_type"] = self.gpu_type
        for col in COST_COLUMNS:
            if getattr(self, col):
                row[col] = getattr(self, col)
        return row

    @property
    def train_s(self) -> float:
        """steps x step_time_s: the training itself, without start-up."""
        if not self.feasible or self.step_time_s is None:
            raise ProfileError(f"configuration {self.key} is infeasible; it has no runtime")
        return self.steps * self.step_time_s

    @property
    def runtime_s(self) -> float:
        """startup_s + steps x step_time_s: how long the task runs in this configuration from launch."""
        return self.startup_s + self.train_s

    @property
    def move_cost_s(self) -> float:
        """checkpoint_save_s + checkpoint_load_s: what stopping on this configuration and resuming adds
        besides the stop itself and the new configuration's start-up."""
        return self.checkpoint_save_s + self.checkpoint_load_s


class ProfileTable:
    """Arrow-backed, validated profile table (see the module docstring)."""

    def __init__(self, table: pa.Table, source: str = "profile") -> None:
        self.source = source
        self._table, self._configs = _normalise(table, source)
        self._by_task: dict[str, list[Config]] = {}
        for c in self._configs:
            self._by_task.setdefault(c.task, []).append(c)

    # ----------------------------------------------------------------- I/O
    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> ProfileTable:
        """Read a ``.csv`` or ``.parquet`` file."""
        if not isinstance(path, (str, os.PathLike)):
            raise ProfileError(f"profile path is {path!r}; give the path of a .csv or .parquet file")
        p = Path(path)
        try:
            found = p.is_file()
        except (OSError, ValueError) as exc:  # a name too long for the filesystem, a NUL in it
            raise ProfileError(f"{str(p)[:200]}: not a usable profile path ({exc.__class__.__name__}: "
                               f"{getattr(exc, 'strerror', None) or exc}); give the path of a .csv or .parquet file"
                               .splitlines()[0]) from None
        if not found:
            if p.is_dir():
                raise ProfileError(f"{p}: is a folder; give the path of a .csv or .parquet profile file")
            raise ProfileError(f"{p}: no such profile file")
        suffix = p.suffix.lower()
        try:
            if suffix == ".parquet":
                import pyarrow.parquet as pq

                table = pq.read_table(p)
            elif suffix == ".csv":
                import pyarrow.csv as pacsv

                table = pacsv.read_csv(
                    p,
                    convert_options=pacsv.ConvertOptions(
                        column_types={"task": pa.string(), "strategy": pa.string(), "gpu_type": pa.string()},
                        strings_can_be_null=False,
                    ),
                )
            else:
                raise ProfileError(f"{p}: unknown profile format {suffix!r}; use .csv or .parquet")
        except ProfileError:
            raise
        except (pa.ArrowInvalid, OSError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ProfileError(f"{p}: cannot parse the profile ({first})") from None
        return cls(table, source=str(p))

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], source: str = "profile") -> ProfileTable:
        if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
            raise ProfileError(f"{source}: rows is a {type(rows).__name__}; give a list of dicts, one per row "
                               '(e.g. [{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10}])')
        rows = list(rows)
        for i, r in enumerate(rows):
            if not isinstance(r, Mapping):
                raise ProfileError(f"{source} row {i + 1}: a {type(r).__name__}, not a dict of column -> value")
        rows = [dict(r) for r in rows]
        if not rows:
            raise ProfileError(f"{source}: the profile has no rows")
        names: list[str] = []
        for r in rows:
            for k in r:
                if k not in names:
                    names.append(k)
        columns = {}
        for k in names:
            values = [r.get(k) for r in rows]
            try:
                columns[k] = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                # Mixed kinds in one column (e.g. gpus 1 and "1/4"): keep them as text; parsing checks each cell.
                columns[k] = pa.array([None if is_empty_cell(v) else str(v) for v in values], pa.string())
        return cls(pa.table(columns), source=source)

    @classmethod
    def from_configs(cls, configs: Iterable[Config], source: str = "profile") -> ProfileTable:
        """A table of ``configs`` as they are (rows of checked tables, e.g. with steps or step times
        changed by ``dataclasses.replace``): no cell is parsed again, so it is cheap enough for a
        re-plan in a scheduler hook. Only what combining rows can break is checked: no rows, a
        duplicate configuration.

        Example:
            >>> t = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0,
            ...                              "steps": 10}])
            >>> ProfileTable.from_configs(t.configs("a"), source="copy").get("a", "ddp", 1).steps
            10
        """
        configs = list(configs)
        if not configs:
            raise ProfileError(f"{source}: the profile has no rows")
        seen: set[tuple] = set()
        for i, c in enumerate(configs):
            if not isinstance(c, Config):
                raise ProfileError(f"{source} row {i + 1}: expected a Config, got {type(c).__name__}")
            if c.row_key in seen:
                raise ProfileError(
                    f"{source} row {i + 1}: duplicate configuration {c.row_key}; keep one row per configuration"
                )
            seen.add(c.row_key)
        self = cls.__new__(cls)
        self.source = source
        self._configs = configs
        # The columns from_rows would keep of these rows' to_row(): costs where set.
        costs = [k for k in COST_COLUMNS if any(getattr(c, k) for c in configs)]
        self._table = pa.table(_canonical_arrays(configs, costs))
        self._by_task = {}
        for c in configs:
            self._by_task.setdefault(c.task, []).append(c)
        return self

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write as ``.csv`` or ``.parquet`` (by suffix); returns the path."""
        p = Path(path)
        if p.suffix.lower() not in (".csv", ".parquet"):
            raise ProfileError(f"{p}: unknown profile format {p.suffix!r}; use .csv or .parquet")
        tmp = p.with_name(p.name + ".tmp")
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            if p.suffix.lower() == ".parquet":
                import pyarrow.parquet as pq

                pq.write_table(self._table, tmp)
            else:
                import pyarrow.csv as pacsv

                pacsv.write_csv(self._table, tmp)
            os.replace(tmp, p)
        except (OSError, pa.ArrowException) as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            reason = getattr(exc, "strerror", None) or " ".join(str(exc).split())[:200]
            raise ProfileError(f"{p}: cannot write the profile ({reason}); give a path in a folder you can write"
                               ) from None
        return p

    def to_arrow(self) -> pa.Table:
        return self._table

    # -------------------------------------------------------------- access
    def __len__(self) -> int:
        return len(self._configs)

    def __iter__(self):
        return iter(self._configs)

    @property
    def tasks(self) -> list[str]:
        """Task names in order of first appearance (the FIFO order)."""
        return list(self._by_task)

    def configs(self, task: str, *, feasible_only: bool = False) -> list[Config]:
        try:
            rows = self._by_task[task]
        except KeyError:
            raise ProfileError(f"{self.source}: task {task!r} has no rows in the profile") from None
        return [c for c in rows if c.feasible] if feasible_only else list(rows)

    def get(self, task: str, strategy: str, gpus: int | float, nodes: int = 1, gpu_type: str | None = None) -> Config:
        """The row of this configuration (``gpu_type``: the row measured on that type; ``None``: the untyped row)."""
        for c in self._by_task.get(task, ()):
            if c.strategy == strategy and c.gpus == gpus and c.nodes == nodes and c.gpu_type == gpu_type:
                return c
        on = f" measured on {gpu_type}" if gpu_type is not None else ""
        raise ProfileError(
            f"{self.source}: no row for task {task!r} strategy {strategy!r} "
            f"with {gpus} GPU(s) on {nodes} node(s){on}"
        )

    @property
    def has_shares(self) -> bool:
        """True when some row uses a share of a device (``gpus`` < 1)."""
        return any(c.is_share for c in self._configs)

    @property
    def gpu_types(self) -> set[str]:
        """The GPU types rows were measured on (empty for a table without ``gpu_type``)."""
        return {c.gpu_type for c in self._configs if c.gpu_type is not None}

    def strategies(self) -> set[str]:
        return {c.strategy for c in self._configs}

    def check_strategies(self, registered: Sequence[str]) -> None:
        """Raise if a row names a strategy that is not registered (before execution)."""
        known = set(registered)
        for i, c in enumerate(self._configs):
            if c.strategy not in known:
                raise ProfileError(
                    f"{self.source} row {i + 1}: strategy {c.strategy!r} is not registered "
                    f"(registered: {', '.join(sorted(known))})"
                )

    def check_feasible(self) -> None:
        """Raise, naming the task and why its rows are infeasible, if some task has no feasible row."""
        for task, rows in self._by_task.items():
            if not any(c.feasible for c in rows):
                raise ProfileError(
                    f"{self.source}: task {task!r} has no feasible configuration ({self.why_infeasible(task)}); "
                    "profile it on more GPUs or another strategy, or drop it"
                )

    def why_infeasible(self, task: str, limit: int = 2) -> str:
        """The reasons of ``task``'s first ``limit`` infeasible rows, on one line.

        Example:
            >>> t = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1, "steps": 1, "step_time_s": None,
            ...                              "feasible": False, "reason": "out of memory"}])
            >>> t.why_infeasible("a")
            'ddp on 1 GPU(s): out of memory'
        """
        bad = [c for c in self.configs(task) if not c.feasible]
        parts = [f"{c.strategy} on {c.gpus} GPU(s): {' '.join((c.reason or 'no reason given').split())[:160]}"
                 for c in bad[:limit]]
        if len(bad) > limit:
            parts.append(f"{len(bad) - limit} more")
        return "; ".join(parts) or "no rows"

    def replace(self, fn: Callable[[Config], Config | None]) -> ProfileTable:
        """A new table with ``fn`` applied to each row (``None`` drops the row).

        Extra columns are not carried over. Used by re-planning to put in the
        remaining steps and measured step times.
        """
        rows = []
        for c in self._configs:
            new = fn(c)
            if new is not None:
                rows.append(new.to_row())
        return ProfileTable.from_rows(rows, source=self.source)

    def with_rows(self, configs: Iterable[Config]) -> ProfileTable:
        """A new table holding this table's rows followed by ``configs``."""
        rows = [c.to_row() for c in self._configs]
        rows += [c.to_row() for c in configs]
        return ProfileTable.from_rows(rows, source=self.source)

    def __repr__(self) -> str:
        return f"ProfileTable({len(self._by_task)} tasks, {len(self)} rows, source={self.source!r})"


def is_empty_cell(value: Any) -> bool:
    """An empty cell: None, blank text, or NaN (how Arrow and pandas hand over a missing number)."""
    return (value is None or (isinstance(value, str) and not value.strip())
            or (isinstance(value, float) and math.isnan(value)))


def _cell_str(value: Any) -> str:
    return "" if is_empty_cell(value) else str(value).strip()


def _parse_int(value: Any, col: str, where: str, default: int | None = None, high: int | None = None) -> int:
    if is_empty_cell(value):
        if default is not None:
            return default
        raise ProfileError(f"{where}: {col} is empty; give a whole number >= 1")
    return whole(value, f"{where}: {col}", high=high, error=ProfileError)


def _parse_gpus(value: Any, where: str) -> int | float:
    """A whole number >= 1, or a share 1/2, 1/4, 1/8 of one device (as a number or ``"1/k"``)."""
    hint = "give a whole number >= 1, or a share of one device: 1/2, 1/4 or 1/8 (0.5, 0.25, 0.125)"
    if is_empty_cell(value):
        raise ProfileError(f"{where}: gpus is empty; {hint}")
    text = str(value).strip()
    try:
        if isinstance(value, str) and "_" in text:
            raise ValueError(text)
        if isinstance(value, str) and "/" in text:
            num, den = text.split("/", 1)
            f = float(num) / float(den)
        else:
            f = float(value)
    except (TypeError, ValueError, ZeroDivisionError):
        raise ProfileError(f"{where}: gpus is {value!r}; {hint}") from None
    if math.isfinite(f) and f >= 1 and f == int(f):
        return whole(value if "/" not in text else f, f"{where}: gpus", high=MAX_GPUS, error=ProfileError)
    for share in SHARES.values():
        if math.isfinite(f) and abs(f - share) <= 1e-9:
            return share
    if f <= 0:
        whole(value, f"{where}: gpus", high=MAX_GPUS, error=ProfileError)  # raises: below 1
    raise ProfileError(f"{where}: gpus is {value!r}; {hint}")


def _parse_float(value: Any, col: str, where: str) -> float | None:
    """A number, or None for an empty cell; NaN and infinities are errors, not missing values."""
    if is_empty_cell(value):
        return None
    return number(value, f"{where}: {col}", error=ProfileError)


def _parse_bool(value: Any, where: str) -> bool:
    if is_empty_cell(value):
        return True
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s == "":
        return True
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ProfileError(f"{where}: feasible is {value!r}; use true or false")


def _normalise(table: pa.Table, source: str) -> tuple[pa.Table, list[Config]]:
    if not isinstance(table, pa.Table):
        raise ProfileError(f"{source}: expected a pyarrow.Table, got {type(table).__name__}")
    cols = set(table.column_names)
    twice = sorted({c for c in table.column_names if table.column_names.count(c) > 1})
    if twice:
        raise ProfileError(f"{source}: column(s) {', '.join(twice)} appear more than once in the header; "
                           "keep one column of each name")
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        near = [c for c in table.column_names if c.strip().lower() in missing]  # " task", "Steps"
        raise ProfileError(
            f"{source}: missing column(s) {', '.join(missing)}; a profile needs "
            f"{', '.join(REQUIRED)} (optional: {', '.join(OPTIONAL_COLUMNS)})"
            + (f"; the header has {', '.join(repr(c) for c in near)}: write each name exactly, in lower case "
               "and without spaces" if near else "")
        )
    if table.num_rows == 0:
        raise ProfileError(f"{source}: the profile has no rows")
    table = _text_columns(table, source)
    data = table.to_pydict()
    n = table.num_rows
    configs: list[Config] = []
    weights: list[float | None] = []  # the weight column, parsed: its consumers read floats or nulls only
    seen: dict[tuple[str, str, int, int], int] = {}
    task_steps: dict[str, tuple[int, int]] = {}  # task -> (its steps, the first row that gave them)
    for i in range(n):
        where = f"{source} row {i + 1}"
        task = _cell_str(data["task"][i])
        try:
            check_name(task)
        except SpecError as exc:
            raise ProfileError(f"{where}: {exc}") from None
        strategy = canonical_strategy(_cell_str(data["strategy"][i]))  # DDP is ddp, as feasible's TRUE is true
        if not strategy:
            raise ProfileError(f"{where}: strategy is empty; name a registered strategy such as ddp")
        gpus = _parse_gpus(data["gpus"][i], where)
        nodes = _parse_int(data["nodes"][i] if "nodes" in data else None, "nodes", where, default=1, high=MAX_NODES)
        if gpus < 1 and nodes != 1:
            raise ProfileError(
                f"{where}: gpus={gpus} is a share of one device but nodes={nodes}; "
                "a share runs on one node: set nodes to 1"
            )
        try:
            typed = data["gpu_type"][i] if "gpu_type" in data else None
            gpu_type = check_gpu_type(None if is_empty_cell(typed) else typed, "gpu_type")
        except SpecError as exc:
            raise ProfileError(f"{where}: {exc}") from None
        if gpus >= 1 and gpus % nodes:
            raise ProfileError(
                f"{where}: {gpus} GPUs over {nodes} nodes do not split evenly; "
                "make gpus a multiple of nodes"
            )
        steps = _parse_int(data["steps"][i], "steps", where, high=MAX_STEPS)
        feasible = _parse_bool(data["feasible"][i] if "feasible" in data else None, where)
        step_time = _parse_float(data["step_time_s"][i], "step_time_s", where)
        if step_time is not None and not step_time > 0:
            raise ProfileError(f"{where}: step_time_s is {step_time!r}; it must be a finite number > 0")
        if feasible and step_time is not None and steps * step_time > MAX_RUNTIME_S:
            raise ProfileError(
                f"{where}: steps x step_time_s = {steps} x {step_time:g} s = {steps * step_time:.3g} s, beyond "
                f"{MAX_RUNTIME_S:g} s (about 31,700 years); check the units (step_time_s is seconds per step)"
            )
        if feasible and step_time is None:
            raise ProfileError(
                f"{where}: step_time_s is empty but the row is feasible; "
                "give the measured seconds per step or set feasible=false"
            )
        peak = _parse_float(data["peak_mem_gb"][i], "peak_mem_gb", where) if "peak_mem_gb" in data else None
        if peak is not None and peak < 0:
            raise ProfileError(f"{where}: peak_mem_gb is {peak!r}; it must be >= 0")
        reason = _cell_str(data["reason"][i]) if "reason" in data else None
        device_mem = _parse_float(data["device_mem_gb"][i], "device_mem_gb", where) if "device_mem_gb" in data else None
        if device_mem is not None and not (device_mem > 0 and math.isfinite(device_mem)):
            raise ProfileError(f"{where}: device_mem_gb is {device_mem!r}; it must be a finite number of GB > 0")
        copies = round(1 / gpus) if gpus < 1 else 1
        if feasible and peak is not None and device_mem is not None and copies * peak > device_mem * (1 + 1e-9):
            # k copies of a 1/k share must fit in the device together.
            feasible = False
            reason = (f"{copies} cop{'ies' if copies > 1 else 'y'} x {peak:g} GB peak memory > "
                      f"{device_mem:g} GB device memory")
        costs = {}
        for col in COST_COLUMNS:
            v = _parse_float(data[col][i], col, where) if col in data else None
            if v is not None and not (0 <= v <= MAX_RUNTIME_S):
                raise ProfileError(f"{where}: {col} is {v!r}; it must be a finite number of seconds >= 0 and <= "
                                   f"{MAX_RUNTIME_S:g} (about 31,700 years); check the units")
            costs[col] = v or 0.0
        weight = _parse_float(data["weight"][i], "weight", where) if "weight" in data else None
        if weight is not None and not (MIN_WEIGHT <= weight <= MAX_WEIGHT):
            raise ProfileError(f"{where}: weight is {weight!r}; weights are relative: give a number from "
                               f"{MIN_WEIGHT:g} to {MAX_WEIGHT:g} (scale them all alike)")
        weights.append(weight)
        key = (task, strategy, gpus, nodes, gpu_type)
        if key in seen:
            on = f" on {gpu_type}" if gpu_type is not None else ""
            raise ProfileError(
                f"{where}: duplicate of row {seen[key] + 1} (task {task!r}, strategy {strategy!r}, "
                f"{gpus} GPUs, {nodes} node(s){on}); keep one row per configuration"
            )
        seen[key] = i
        first = task_steps.setdefault(task, (steps, i))
        if first[0] != steps:
            # steps is the task's (what it trains to the end): rows that differ would make each plan's
            # runtime depend on the row it picks, and a run train another number of steps on each row.
            raise ProfileError(
                f"{where}: steps is {steps}, but row {first[1] + 1} of task {task!r} says {first[0]}; every row of "
                "a task has its step count (the steps it trains in all): give the same steps on each"
            )
        configs.append(
            Config(task, strategy, gpus, nodes, step_time, steps, feasible, peak,
                   None if reason in (None, "") else str(reason), **costs, gpu_type=gpu_type)
        )
    # Canonical Arrow table: known columns with their types, extras kept as they are.
    arrays = _canonical_arrays(configs, table.column_names)
    if "weight" in data:
        arrays["weight"] = pa.array(weights, pa.float64())
    for name in table.column_names:
        if name not in arrays:
            arrays[name] = table.column(name)
    return pa.table(arrays), configs


def _text_columns(table: pa.Table, source: str) -> pa.Table:
    """The name columns as text: Parquet writers that leave text unannotated (bytes) would give the task
    name ``"b'a'"``."""
    for name in ("task", "strategy", "gpu_type", "reason"):
        if name in table.column_names and (pa.types.is_binary(table.schema.field(name).type)
                                           or pa.types.is_large_binary(table.schema.field(name).type)):
            try:
                column = table.column(name).cast(pa.string())
            except pa.ArrowInvalid:
                raise ProfileError(f"{source}: column {name} holds bytes that are not UTF-8 text; "
                                   "write it as a string column") from None
            table = table.set_column(table.column_names.index(name), name, column)
    return table


def _canonical_arrays(configs: list[Config], columns: Collection[str]) -> dict[str, pa.Array]:
    """The known columns of ``configs`` with their types; the optional ones (costs, GPU type, reason)
    where named in ``columns`` (the input's) or set in some row."""
    arrays: dict[str, pa.Array] = {
        "task": pa.array([c.task for c in configs], pa.string()),
        "strategy": pa.array([c.strategy for c in configs], pa.string()),
        # Whole GPUs stay an integer column (old tables keep their schema); shares make it float.
        "gpus": pa.array([float(c.gpus) for c in configs], pa.float64()) if any(c.gpus < 1 for c in configs)
        else pa.array([c.gpus for c in configs], pa.int64()),
        "nodes": pa.array([c.nodes for c in configs], pa.int64()),
        "step_time_s": pa.array([c.step_time_s for c in configs], pa.float64()),
        "steps": pa.array([c.steps for c in configs], pa.int64()),
        "feasible": pa.array([c.feasible for c in configs], pa.bool_()),
        "peak_mem_gb": pa.array([c.peak_mem_gb for c in configs], pa.float64()),
    }
    for col in COST_COLUMNS:
        if col in columns:
            arrays[col] = pa.array([getattr(c, col) for c in configs], pa.float64())
    if "gpu_type" in columns or any(c.gpu_type for c in configs):
        arrays["gpu_type"] = pa.array([c.gpu_type for c in configs], pa.string())
    if "reason" in columns or any(c.reason for c in configs):
        arrays["reason"] = pa.array([c.reason for c in configs], pa.string())
    return arrays


def knobs_for(table: ProfileTable, task: str, strategy: str, gpus: int, nodes: int = 1) -> dict[str, Any]:
    """The knob settings the profiler chose for a configuration (``{}`` if the table has no
    ``knobs`` column or the row none); the one reader of the ``knobs`` column.

    Raises :class:`ProfileError` when the configuration has no row or its knobs are not a
    JSON object.

    Example:
        >>> t = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 2,
        ...     "step_time_s": 1.0, "steps": 5, "knobs": '{"bucket_cap_mb": 50}'}])
        >>> knobs_for(t, "a", "ddp", 2)
        {'bucket_cap_mb': 50}
    """
    key = (task, strategy, gpus, nodes)
    table.get(*key)  # raises, naming the configuration, when there is no such row
    arrow = table.to_arrow()
    if "knobs" not in arrow.column_names:
        return {}
    for row in arrow.select(["task", "strategy", "gpus", "nodes", "knobs"]).to_pylist():
        if (row["task"], row["strategy"], row["gpus"], row["nodes"]) != key:
            continue
        return parse_knobs(row["knobs"], f"{table.source}: knobs of {key}")
    return {}


def parse_knobs(raw: Any, where: str, *, error: type[SaturnError] = ProfileError) -> dict[str, Any]:
    """A ``knobs`` value (empty, a mapping or a JSON object) as a dict; anything else is ``error``
    naming ``where``. The one parser of knob settings, wherever a table's rows come from.

    Example:
        >>> parse_knobs('{"bucket_cap_mb": 50}', "row 1"), parse_knobs(None, "row 1")
        ({'bucket_cap_mb': 50}, {})
    """
    if raw is None or raw == "":
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        out = json.loads(raw)
    except (TypeError, ValueError):
        raise error(f"{where} are not JSON: {str(raw)[:80]!r}; give a JSON object (or a dict)") from None
    if not isinstance(out, Mapping):
        raise error(f"{where} must be a JSON object (or a dict), got {str(raw)[:80]!r}")
    return dict(out)
