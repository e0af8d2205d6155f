"""Settings of a run: :class:`DriverConfig` (how the driver runs) and :class:`RunSettings`
(what a run was asked to do, persisted in the run folder so it can be resumed).

Defaults come from :mod:`ray_saturn.defaults`, the one place they are
defined; :func:`emulation_config` gives the settings ``ray-saturn emulate``
and :func:`ray_saturn.emulate` use (checkpoint and restart scaled to the
time scale). :func:`check_policy` rejects an unknown policy name up front,
before anything is profiled or started (``DriverConfig`` checks its own).

Example:
    >>> DriverConfig().policy
    'saturn-replan'
    >>> emulation_config(0.01).checkpoint_interval_s
    100.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ray_saturn import defaults
from ray_saturn.errors import SaturnError
from ray_saturn.limits import MAX_NOISE, MAX_SEED, number, solver_gap, whole
from ray_saturn.spec import check_name

__all__ = ["DriverConfig", "RunSettings", "check_policy", "emulation_config"]


def check_policy(name: str) -> str:
    """``name`` if it is a known re-planning policy, else a one-line :class:`SaturnError` naming the choices."""
    from ray_saturn.control.replan import get_replan_policy, replan_policy_names

    if not isinstance(name, str):
        raise SaturnError(f"unknown policy {name!r}; choose from: {', '.join(replan_policy_names())}")
    get_replan_policy(name)
    return name


@dataclass(frozen=True)
class DriverConfig:
    """Settings of one run. Times are driver-clock (profile) seconds unless they say wall.

    ``restart_s`` is the cost of a move (besides the target's start-up)
    assumed until the run measures one; ``min_replan_gap_s`` the least run
    time between two re-plans; ``drift_replan_gap_s`` and
    ``drift_replan_gap_fraction`` (of the longest plan's makespan so far) the least
    between a re-plan and one that only drift asked for (a task off its
    estimate, idle GPUs); see :class:`~ray_saturn.control.Controller`.
    ``solver_gap``: each (re-)plan's search stops once its makespan is within
    this fraction of the lower bound (the driver's solver shares the CPU with
    the training it plans; 0: every plan searches its whole time limit).
    ``reuse_workers``: a finished segment's Ray Train workers run the next
    task planned on exactly its GPUs instead of a new trainer starting (see
    :mod:`ray_saturn.runtime.train_launcher`); ``False``: a trainer per segment.

    Example:
        >>> DriverConfig(policy="saturn-static").policy
        'saturn-static'
    """

    policy: str = defaults.POLICY
    solver_time_limit_s: float = defaults.SOLVER_TIME_LIMIT_S
    checkpoint_interval_s: float = defaults.CHECKPOINT_INTERVAL_S
    restart_s: float = defaults.RESTART_S
    max_failures: int = 3
    min_replan_gap_s: float = 0.0
    drift_replan_gap_s: float = 0.0
    drift_replan_gap_fraction: float = defaults.DRIFT_REPLAN_GAP_FRACTION
    #: step-time reports of a segment before it may be judged off its estimate (real ones are
    #: noisy: 8 reports at the reporter's 0.5 s are 4 s of a segment's steps; at most
    #: :data:`~ray_saturn.control.state.RECENT_REPORTS`, the window the measurement is the mean of)
    min_reports: int = 8
    poll_wall_s: float = 0.2
    node_check_wall_s: float = 1.0
    persist_wall_s: float = 1.0
    seed: int = 0
    #: What plans optimise: makespan, completion or online (ray_saturn.solver.objective).
    objective: str = "makespan"
    solver_gap: float = defaults.RUN_SOLVER_GAP
    reuse_workers: bool = True
    #: let queued tasks run ahead of the plan on idle GPUs (the Controller's ``backfill``);
    #: ``None``: on for the ``online`` objective
    backfill: bool | None = None

    def __post_init__(self) -> None:
        from ray_saturn.solver.objective import parse_objective

        check_policy(self.policy)  # here, not only when a run starts
        object.__setattr__(self, "objective", parse_objective(self.objective))
        for name in ("solver_time_limit_s", "checkpoint_interval_s", "poll_wall_s"):
            number(getattr(self, name), f"DriverConfig.{name}", low=0, low_open=True, error=SaturnError)
        for name in ("restart_s", "min_replan_gap_s", "drift_replan_gap_s", "drift_replan_gap_fraction",
                     "node_check_wall_s", "persist_wall_s"):
            number(getattr(self, name), f"DriverConfig.{name}", low=0, error=SaturnError)
        solver_gap(self.solver_gap, "DriverConfig.solver_gap", error=SaturnError)
        whole(self.min_reports, "DriverConfig.min_reports", low=1, error=SaturnError)
        whole(self.max_failures, "DriverConfig.max_failures", low=0, error=SaturnError)
        whole(self.seed, "DriverConfig.seed", low=0, high=MAX_SEED, error=SaturnError)
        if not isinstance(self.reuse_workers, bool):
            raise SaturnError(f"DriverConfig.reuse_workers is {self.reuse_workers!r}; give True or False")
        if self.backfill is not None and not isinstance(self.backfill, bool):
            raise SaturnError(f"DriverConfig.backfill is {self.backfill!r}; give True, False or None")

    def with_policy(self, policy: str | None) -> DriverConfig:
        """This config with ``policy`` (``None``: unchanged)."""
        if policy is None or policy == self.policy:
            return self
        return DriverConfig(**{**asdict(self), "policy": policy})


def emulation_config(
    time_scale: float,
    *,
    policy: str = defaults.POLICY,
    seed: int = 0,
    solver_time_limit_s: float = defaults.EMULATE_SOLVER_TIME_LIMIT_S,
) -> DriverConfig:
    """The settings of an emulated run: a checkpoint and a restart cost of one wall second each."""
    if not (time_scale > 0 and math.isfinite(time_scale) and math.isfinite(1.0 / time_scale)):
        raise SaturnError(f"--time-scale is {time_scale}; give a finite factor > 0 (wall seconds per profile second)")
    return DriverConfig(
        policy=policy,
        seed=seed,
        checkpoint_interval_s=1.0 / time_scale,
        restart_s=1.0 / time_scale,
        solver_time_limit_s=solver_time_limit_s,
        poll_wall_s=0.1,
        min_reports=3,
    )


@dataclass(frozen=True)
class RunSettings:
    """What a run was asked to do (persisted in the run folder so it can be resumed)."""

    name: str
    mode: str  # "train" or "emulate"
    driver: DriverConfig = field(default_factory=DriverConfig)
    time_scale: float = 1.0
    noise: float = 0.0
    workload: str | None = None
    workload_digest: str | None = None  # sha256 of the workload file at `run` (resume refuses another)
    report_interval_s: float = 0.5
    cpus_per_worker: float = 0.0
    emulated_cluster: dict[str, Any] | None = None  # {"nodes": N, "gpus_per_node": G[, "gpu_types": [T, ...]]}
    arrivals: dict[str, float] = field(default_factory=dict)  # task -> arrival (profile s)

    def __post_init__(self) -> None:
        check_name(self.name, "run name")
        if self.mode not in ("train", "emulate"):
            raise SaturnError(f"run mode {self.mode!r} must be train or emulate")
        number(self.time_scale, "time scale (wall seconds per profile second)", low=0, low_open=True,
               error=SaturnError)
        number(self.noise, "noise (relative spread of true step times)", low=0, high=MAX_NOISE, error=SaturnError)
        number(self.report_interval_s, "report_interval_s", low=0, low_open=True, error=SaturnError)
        number(self.cpus_per_worker, "cpus_per_worker", low=0, error=SaturnError)
        if not isinstance(self.arrivals, Mapping):
            raise SaturnError(f"arrivals is {self.arrivals!r}; give an object of task name -> arrival (s)")
        for task, at in self.arrivals.items():
            number(at, f"arrivals[{task!r}]", error=SaturnError)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["driver"] = asdict(self.driver)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSettings:
        """The settings ``to_dict`` wrote; a one-line :class:`SaturnError` saying what is wrong otherwise."""
        if not isinstance(d, Mapping):
            raise SaturnError(f"it holds a JSON {_json_kind(d)}, not an object of run settings")
        missing = [n for n in ("name", "mode") if n not in d]
        if missing:
            raise SaturnError(f"it has no {' or '.join(missing)} (an object of run settings has both)")
        _check_fields(d, cls, "field")
        driver = d.get("driver", {})
        if not isinstance(driver, Mapping):
            raise SaturnError(f"driver is a JSON {_json_kind(driver)}, not an object of driver settings")
        _check_fields(driver, DriverConfig, "driver field")
        return cls(**{**d, "driver": DriverConfig(**driver)})


def _json_kind(value: Any) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _check_fields(d: Mapping[str, Any], cls: type, what: str) -> None:
    unknown = sorted(str(k) for k in d if k not in {f.name for f in fields(cls)})
    if unknown:
        raise SaturnError(f"unknown {what}(s) {', '.join(unknown[:5])}")
