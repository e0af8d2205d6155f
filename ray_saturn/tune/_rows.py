"""A trial's profile rows: what the user's estimate returns for its config, checked.

How a config maps to profiled rows: the estimate is the user's function
``config -> rows`` and returns the rows of the one task that config trains,
in any of these forms:

- :func:`profile_rows` ``(table, name)``: the rows of task ``name`` in a
  profile table (from :func:`ray_saturn.profile`) with every column, so the
  ``knobs`` the profiler chose reach the trial; or a whole
  :class:`~ray_saturn.ProfileTable` (or ``ProfileResult``) of that one task;
- ``Config`` objects, as ``table.configs(name)`` yields them (a ``Config``
  has no knobs: return the table, or :func:`profile_rows`, to keep them);
- mappings with ``strategy``, ``gpus``, ``step_time_s`` and ``steps``
  (optional ``nodes``, ``feasible``, ``knobs`` as a dict or JSON).

``steps`` is the trial's total optimizer steps (its task's ``max_steps``).
``gpus`` may be a share 1/2, 1/4 or 1/8 of one GPU (one worker; the trial's
bundle then asks Ray for that fraction of a GPU, so several trials share the
device), and a row may carry ``gpu_type``: it runs only on nodes of that type
(a type no node has is left out).
A trial is one Tune placement group bundle, so it runs on one node: rows
spanning several nodes, rows needing more GPUs than the largest node has,
infeasible rows and rows whose strategy cannot run on that many GPUs are
left out. A config left with no row, or whose estimate raises, is rejected:
that trial errors with the reason and the search goes on.

Example:
    >>> rows = trial_rows([{"strategy": "single", "gpus": 1, "step_time_s": 0.2, "steps": 100},
    ...                    {"strategy": "ddp", "gpus": 8, "step_time_s": 0.05, "steps": 100}],
    ...                   max_gpus_per_node=4)
    >>> [(r.strategy, r.gpus) for r in rows.rows], rows.steps
    ([('single', 1)], 100)
    >>> rows.left_out
    ('ddp on 8 GPU(s): needs 8 GPUs on one node; the largest node has 4',)
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.errors import SaturnError
from ray_saturn.profile_table import Config, ProfileTable, parse_knobs

__all__ = ["TrialRejected", "TrialRow", "TrialRows", "profile_rows", "trial_rows"]


class TrialRejected(SaturnError, ValueError):
    """A trial's config cannot be estimated or placed; the message says why."""


@dataclass(frozen=True)
class TrialRow:
    """One way to run a trial: a strategy on ``gpus`` GPUs of one node."""

    strategy: str
    gpus: int | float
    step_time_s: float
    knobs: Mapping[str, Any] = field(default_factory=dict)
    gpu_type: str | None = None


@dataclass(frozen=True)
class TrialRows:
    """A trial's usable rows, its total steps, and the rows left out (with why)."""

    rows: tuple[TrialRow, ...]
    steps: int
    left_out: tuple[str, ...] = ()

    def knobs(self, strategy: str, gpus: int | float, gpu_type: str | None = None) -> dict[str, Any]:
        for r in self.rows:
            if (r.strategy, r.gpus, r.gpu_type) == (strategy, gpus, gpu_type):
                return dict(r.knobs)
        return {}

    def to_rows(self, task: str) -> list[dict[str, Any]]:
        """The rows as profile-table rows of a task named ``task`` (for the controller)."""
        return [
            {
                "task": task,
                "strategy": r.strategy,
                "gpus": r.gpus,
                "nodes": 1,
                "step_time_s": r.step_time_s,
                "steps": self.steps,
                **({"gpu_type": r.gpu_type} if r.gpu_type is not None else {}),
            }
            for r in self.rows
        ]


def profile_rows(table: ProfileTable, task: str) -> list[dict[str, Any]]:
    """``task``'s rows of ``table`` as mappings with every column (``knobs`` included).

    Example:
        >>> t = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0,
        ...                              "steps": 5, "knobs": '{"bucket_cap_mb": 50}'}])
        >>> profile_rows(t, "a")[0]["knobs"]
        '{"bucket_cap_mb": 50}'
    """
    table.configs(task)  # a clear error when the task is not in the table
    return [r for r in table.to_arrow().to_pylist() if r["task"] == task]


def _as_mappings(raw: Any) -> list[Mapping[str, Any]]:
    table = getattr(raw, "table", None) if not isinstance(raw, ProfileTable) else raw
    if isinstance(table, ProfileTable):
        if len(table.tasks) != 1:
            raise TrialRejected(
                f"the estimate returned a profile of {len(table.tasks)} tasks ({', '.join(table.tasks[:4])}); "
                "return the rows of the one task this config trains, e.g. profile_rows(table, name)"
            )
        return table.to_arrow().to_pylist()
    if isinstance(raw, Mapping | str | bytes) or not isinstance(raw, Iterable):
        raise TrialRejected(
            f"the estimate returned {type(raw).__name__}; return a list of rows (mappings or Config), "
            "or a ProfileTable of the one task this config trains"
        )
    out: list[Mapping[str, Any]] = []
    for r in raw:
        if isinstance(r, Config):
            out.append(r.to_row())
        elif isinstance(r, Mapping):
            out.append(r)
        else:
            raise TrialRejected(f"an estimate row is a {type(r).__name__}; give mappings or Config objects")
    return out


def trial_rows(
    raw: Any,
    *,
    max_gpus_per_node: int,
    registered: Collection[str] | None = None,
    gpu_types: Collection[str | None] | None = None,
) -> TrialRows:
    """Check an estimate's rows for one trial (see the module docstring); raises :class:`TrialRejected`.

    ``registered``: the registered strategy names (default: looked up); ``gpu_types``: the GPU
    types of the cluster's nodes (default: rows of any type are kept).
    """
    from ray_saturn.limits import MAX_NODES, MAX_RUNTIME_S, MAX_STEPS
    from ray_saturn.profile_table import _parse_bool, _parse_gpus, _parse_int
    from ray_saturn.spec import canonical_strategy, check_gpu_type
    from ray_saturn.strategies import get_strategy, strategy_names

    mappings = _as_mappings(raw)
    if not mappings:
        raise TrialRejected("the estimate returned no rows")
    tasks = sorted({str(r["task"]).strip() for r in mappings if r.get("task") not in (None, "")})
    if len(tasks) > 1:
        raise TrialRejected(
            f"the estimate's rows are of {len(tasks)} tasks ({', '.join(tasks[:4])}); "
            "return the rows of the one task this config trains, e.g. profile_rows(table, name)"
        )
    registered = set(strategy_names() if registered is None else registered)
    rows: list[TrialRow] = []
    left_out: list[str] = []
    steps_seen: set[int] = set()
    seen: set[tuple[str, int | float, str | None]] = set()
    for i, r in enumerate(mappings):
        where = f"estimate row {i + 1}"
        missing = [k for k in ("strategy", "gpus", "steps") if r.get(k) in (None, "")]
        if missing:
            raise TrialRejected(f"{where} {dict(r)!r} lacks {', '.join(missing)}")
        strategy = str(canonical_strategy(str(r["strategy"])))  # DDP is ddp, as in a profile table
        try:
            # The profile table's own rules: whole numbers within its limits, feasible as a bool
            # (numpy's False and 0 too); else the controller's table would refuse the rows later.
            gpus = _parse_gpus(r["gpus"], where)
            nodes = _parse_int(r.get("nodes"), "nodes", where, default=1, high=MAX_NODES)
            steps = _parse_int(r["steps"], "steps", where, high=MAX_STEPS)
            feasible = _parse_bool(r.get("feasible"), where)
            gpu_type = check_gpu_type(r.get("gpu_type"), f"{where}: gpu_type")
        except SaturnError as exc:
            raise TrialRejected(str(exc)) from None
        steps_seen.add(steps)
        label = f"{strategy} on {gpus} GPU(s)" + (f" of {gpu_type}" if gpu_type else "")
        if not feasible:
            left_out.append(f"{label}: infeasible ({r.get('reason') or 'no reason given'})")
            continue
        step_time = r.get("step_time_s")
        try:
            step_time = float(step_time)
        except (TypeError, ValueError):
            raise TrialRejected(f"{where}: step_time_s is {step_time!r}; give seconds per step > 0") from None
        if not (step_time > 0 and math.isfinite(step_time)):
            raise TrialRejected(f"{where}: step_time_s is {step_time!r}; give seconds per step > 0")
        if steps * step_time > MAX_RUNTIME_S:
            raise TrialRejected(
                f"{where}: steps x step_time_s = {steps} x {step_time:g} s = {steps * step_time:.3g} s, beyond "
                f"{MAX_RUNTIME_S:g} s; check the units (step_time_s is seconds per step)"
            )
        if nodes != 1:
            left_out.append(f"{label}: spans {nodes} nodes; a Tune trial is one bundle on one node")
            continue
        if gpu_type is not None and gpu_types is not None and gpu_type not in set(gpu_types):
            have = ", ".join(sorted({str(t) for t in gpu_types if t})) or "none"
            left_out.append(f"{label}: no node is of type {gpu_type} (types: {have})")
            continue
        if gpus > max_gpus_per_node:
            left_out.append(f"{label}: needs {gpus} GPUs on one node; the largest node has {max_gpus_per_node}")
            continue
        if strategy not in registered:
            left_out.append(f"{label}: strategy {strategy!r} is not registered ({', '.join(sorted(registered))})")
            continue
        why = get_strategy(strategy).applies(None, 1 if gpus < 1 else gpus)  # a share: one worker
        if why:
            left_out.append(f"{label}: {why}")
            continue
        if (strategy, gpus, gpu_type) in seen:
            raise TrialRejected(f"{where}: a second row for {label}; keep one row per configuration")
        seen.add((strategy, gpus, gpu_type))
        knobs = parse_knobs(r.get("knobs"), f"{where}: knobs", error=TrialRejected)
        rows.append(TrialRow(strategy, gpus, step_time, knobs, gpu_type))
    if len(steps_seen) > 1:
        raise TrialRejected(f"the estimate's rows disagree on steps ({sorted(steps_seen)}); give the trial's total")
    if not rows:
        raise TrialRejected("no row fits a node of this cluster: " + "; ".join(left_out[:4]))
    return TrialRows(tuple(rows), steps_seen.pop(), tuple(left_out))
