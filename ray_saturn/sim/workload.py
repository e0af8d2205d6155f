"""What the simulator draws: true step times, arrival times, node failures.

All draws are seeded and keyed by task (or node) name, so the same seed gives
the same world to every policy, whatever order they run in.

- True step time of configuration ``c`` of task ``t``: the profiled one times
  ``f_t x j_tc``, with a per-task factor ``f_t = exp(sigma z - sigma^2 / 2)``
  (how wrong the profile is about the task: data, convergence, stragglers) and
  a per-configuration jitter ``j_tc`` of a quarter of that spread; both have
  mean 1 and ``sigma = noise``.
- Arrivals: all at 0 (model selection), a Poisson process of a given rate in
  profile order, a trace (task -> time), or the profile's ``arrival_s``
  column.
- Node failures: a node is lost at a time and may come back later.

Example:
    >>> from ray_saturn import ProfileTable
    >>> prof = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1,
    ...                                 "step_time_s": 1.0, "steps": 10}])
    >>> true_step_times(prof, noise=0.0, seed=0)[("a", "ddp", 1, 1)]
    1.0
    >>> parse_arrivals("poisson:60", prof, seed=0)  # the first task arrives at 0
    {'a': 0.0}
"""

from __future__ import annotations

import csv
import itertools
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ray_saturn.errors import SpecError
from ray_saturn.limits import MAX_NOISE, MAX_RUNTIME_S, number, parse_float
from ray_saturn.profile_table import ProfileTable, is_empty_cell
from ray_saturn.spec import ClusterSpec

__all__ = [
    "NodeFailure",
    "check_failures",
    "parse_arrivals",
    "parse_failures",
    "random_failures",
    "true_step_times",
    "truth_key",
]


def _rng(seed: int, *keys: str) -> np.random.Generator:
    return np.random.default_rng([seed, *(zlib.crc32(k.encode()) for k in keys)])


def truth_key(task: str, strategy: str, gpus: int | float, nodes: int, gpu_type: str | None = None) -> tuple:
    """How :func:`true_step_times` keys a row: ``(task, strategy, gpus, nodes)``, plus the GPU type
    for a row measured on one (the row's ``row_key``)."""
    return (task, strategy, gpus, nodes) if gpu_type is None else (task, strategy, gpus, nodes, gpu_type)


def true_step_times(profile: ProfileTable, *, noise: float, seed: int) -> dict[tuple, float]:
    """The step time each feasible configuration really has in the simulated world, keyed by
    :func:`truth_key` (a row of a GPU type has its own)."""
    number(noise, "--noise (relative spread of true step times, 0.2 = 20%)", low=0, high=MAX_NOISE)
    out = {}
    for task in profile.tasks:
        rng = _rng(seed, "task", task)
        f = math.exp(noise * rng.standard_normal() - noise * noise / 2) if noise else 1.0
        for c in profile.configs(task, feasible_only=True):
            assert c.step_time_s is not None
            j = 1.0
            if noise:
                s = noise / 4
                typed = () if c.gpu_type is None else (c.gpu_type,)
                r = _rng(seed, "config", task, c.strategy, str(c.gpus), str(c.nodes), *typed)
                j = math.exp(s * r.standard_normal() - s * s / 2)
            out[truth_key(*c.row_key)] = c.step_time_s * f * j
    return out


def parse_arrivals(spec: str | None, profile: ProfileTable, *, seed: int) -> dict[str, float]:
    """Arrival time per task from ``spec``: ``batch`` / ``0`` / ``None`` (all at 0), ``poisson:R``
    (R tasks per hour), ``profile`` (the profile's ``arrival_s`` column) or a CSV file
    with columns ``task,arrival_s``."""
    tasks = profile.tasks
    if spec is None or spec.strip() in ("", "0", "zero", "batch"):
        return dict.fromkeys(tasks, 0.0)
    spec = spec.strip()
    if spec.startswith("poisson:"):
        try:
            rate = parse_float(spec.split(":", 1)[1])
        except ValueError:
            rate = -1.0
        if not (rate > 0 and math.isfinite(rate)):
            raise SpecError(f"--arrivals {spec!r}: give poisson:R with R > 0 tasks per hour")
        gaps = _rng(seed, "arrivals").exponential(3600.0 / rate, size=len(tasks))
        gaps[0] = 0.0
        times = np.cumsum(gaps).tolist()
        if times[-1] > MAX_RUNTIME_S:  # the limit a trace's times have: beyond it, runtimes vanish in rounding
            raise SpecError(f"--arrivals {spec!r}: at {rate:g} tasks per hour the last of {len(tasks)} tasks arrives "
                            f"at {times[-1]:.3g} s, beyond {MAX_RUNTIME_S:g} s (about 31,700 years); give a larger R")
        return dict(zip(tasks, times, strict=False))
    if spec == "profile":
        return _checked(_from_profile_column(profile), tasks, f"{profile.source}: the arrival_s column")
    path = Path(spec)
    if not path.is_file():
        raise SpecError(f"--arrivals {spec!r}: not 0, poisson:R, profile, or an existing CSV file (task,arrival_s)")
    return _checked(_from_trace(path), tasks, str(path), trace=True)


def _arrival(value: object, task: str, where: str) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise SpecError(f"{where}: arrival_s of task {task!r} is empty; give its arrival time in seconds >= 0")
    return number(value, f"{where}: arrival_s of task {task!r}", low=0, high=MAX_RUNTIME_S)


def _from_profile_column(profile: ProfileTable) -> dict[str, float]:
    """Each task's ``arrival_s`` (empty cells skipped; every row of a task that gives one gives the same)."""
    table = profile.to_arrow()
    if "arrival_s" not in table.column_names:
        raise SpecError("--arrivals profile: the profile has no arrival_s column")
    where = profile.source
    out: dict[str, float] = {}
    for t, a in zip(table.column("task").to_pylist(), table.column("arrival_s").to_pylist(), strict=False):
        if is_empty_cell(a):  # None, blank or NaN: as the table reads an empty cell
            continue
        a = _arrival(a, t, where)
        if t in out and out[t] != a:
            raise SpecError(f"{where}: task {t!r} has two arrival times ({out[t]:g}, {a:g}); give one per task")
        out[t] = a
    return out


def _from_trace(path: Path) -> dict[str, float]:
    """``task,arrival_s`` rows of a CSV file (UTF-8, a BOM allowed): one row per task, each as long as the header."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            rows = list(csv.reader(f))
    except (UnicodeDecodeError, csv.Error, OSError) as exc:
        raise SpecError(f"{path}: cannot read the arrivals trace ({exc}); give a UTF-8 CSV file") from None
    header = [c.strip() for c in rows[0]] if rows else []
    if not {"task", "arrival_s"} <= set(header) or len(set(header)) != len(header):
        raise SpecError(f"{path}: an arrivals trace needs the columns task,arrival_s (each once)")
    col_task, col_time = header.index("task"), header.index("arrival_s")
    out: dict[str, float] = {}
    for i, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise SpecError(f"{path} line {i}: {len(row)} field(s) under a header of {len(header)}; "
                            "write one value per column")
        task = row[col_task].strip()
        if task in out:
            raise SpecError(f"{path} line {i}: task {task!r} is listed twice; give one arrival time per task")
        out[task] = _arrival(row[col_time], task, f"{path} line {i}")
    return out


def _checked(
    arrivals: Mapping[str, float], tasks: Sequence[str], where: str, *, trace: bool = False
) -> dict[str, float]:
    missing = [t for t in tasks if t not in arrivals]
    if missing:
        raise SpecError(f"{where}: no arrival time for task(s) {', '.join(missing[:5])}; give every task one")
    unknown = [t for t in arrivals if t not in set(tasks)] if trace else []
    if unknown:
        raise SpecError(
            f"{where}: task(s) {', '.join(repr(t) for t in unknown[:5])} are not in the profile; "
            "drop them or fix their names"
        )
    bad = [t for t in tasks if not math.isfinite(arrivals[t]) or arrivals[t] < 0]
    if bad:
        raise SpecError(f"{where}: arrival time of {bad[0]!r} is {arrivals[bad[0]]}; give a time >= 0")
    return {t: float(arrivals[t]) for t in tasks}


@dataclass(frozen=True)
class NodeFailure:
    """``node`` is lost at ``at_s`` and comes back at ``back_s`` (``None``: never)."""

    node: str
    at_s: float
    back_s: float | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.at_s) or self.at_s < 0:
            raise SpecError(f"node failure of {self.node!r} at {self.at_s}; give a time >= 0")
        if self.back_s is not None and not (math.isfinite(self.back_s) and self.back_s > self.at_s):
            raise SpecError(f"node {self.node!r} comes back at {self.back_s}, not after its failure at {self.at_s}")


def parse_failures(spec: str, cluster: ClusterSpec) -> list[NodeFailure]:
    """``NODE@AT[:BACK],...`` (seconds), e.g. ``node-1@3600:7200,node-2@5000``."""
    out = []
    for part in _failure_parts(spec):
        node, sep, times = part.rpartition("@")  # the last @: a node name may hold one
        at, _, back = times.partition(":")
        try:
            if not sep or not node:
                raise ValueError
            at_s, back_s = parse_float(at), parse_float(back) if back else None
        except ValueError:
            raise SpecError(f"--failures {part!r}: write NODE@AT or NODE@AT:BACK (seconds)") from None
        failure = NodeFailure(node, at_s, back_s)  # its own one-line error for times out of order
        cluster.node(failure.node)
        out.append(failure)
    check_failures(out)
    return out


_TIMES_TAIL = re.compile(r"@[^@,]*$")


def _failure_parts(spec: str) -> list[str]:
    """Split ``NODE@AT[:BACK],...`` at the commas between failures; a node name may hold a comma.

    A piece with no ``@TIMES`` at its end is the start of a node name and joins the next piece.
    """
    parts: list[str] = []
    pending = ""
    for piece in spec.split(","):
        pending = f"{pending},{piece}" if pending else piece
        if _TIMES_TAIL.search(pending):
            parts.append(pending.strip())
            pending = ""
    if pending.strip():
        parts.append(pending.strip())  # no times at all: its own one-line error
    return [p for p in parts if p]


def check_failures(failures: Sequence[NodeFailure]) -> None:
    """A one-line :class:`SpecError` unless each node fails again only after it came back."""
    by_node: dict[str, list[NodeFailure]] = {}
    for f in failures:
        by_node.setdefault(f.node, []).append(f)
    for node, fs in by_node.items():
        fs.sort(key=lambda f: f.at_s)
        for a, b in itertools.pairwise(fs):
            if a.back_s is None or b.at_s < a.back_s:
                until = "for good" if a.back_s is None else f"until {a.back_s:g}"
                raise SpecError(f"node failures: node {node!r} fails at {b.at_s:g} while it is down (from {a.at_s:g} "
                                f"{until}); give each node's failures one after another, each after it came back")


def random_failures(
    cluster: ClusterSpec, count: int, *, horizon_s: float, recovery_s: float | None, seed: int
) -> list[NodeFailure]:
    """``count`` failures of distinct random nodes at uniform times in [0, horizon_s)."""
    if count < 0 or count >= len(cluster.nodes):
        raise SpecError(f"{count} node failures on {len(cluster.nodes)} nodes; give 0 to {len(cluster.nodes) - 1}")
    rng = _rng(seed, "failures")
    nodes = rng.choice(len(cluster.nodes), size=count, replace=False)
    times = np.sort(rng.uniform(0.05 * horizon_s, horizon_s, size=count))
    return [
        NodeFailure(
            cluster.nodes[int(i)].name,
            float(t),
            None if recovery_s is None else float(t + recovery_s),
        )
        for i, t in zip(nodes, times, strict=False)
    ]
