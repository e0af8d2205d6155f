"""The profiler: measure every (task, strategy, GPU count) on the real cluster.

Each trial runs as Ray work on a placement group sized to it, several at
once when the cluster has room. A trial searches its strategy's knobs
(warm-up steps excluded, median step time, peak memory per GPU; see
:mod:`ray_saturn.strategies.measure`); an error or out-of-memory makes the
configuration infeasible with the reason, and a trial that does not answer
within ``trial_timeout_s`` is killed and recorded infeasible. For each task
and strategy the GPU counts grow 1, 2, 4, ... up to a whole node and then
whole nodes, and stop growing once the step time stops improving by
``min_improvement``. Results are cached in a Parquet store keyed by the
task's performance signature, so tasks that differ only in learning rate or
seed are measured once. The profiler reports its own cost in GPU-seconds
next to the workload's estimated GPU-seconds (each task's cheapest feasible
configuration, steps x step time x GPUs).

The table carries, besides contract 1's columns, ``reason`` (why a row is
infeasible), ``knobs`` (JSON, for :func:`ray_saturn.strategies.train_worker`),
``signature``, ``cached``, ``cost_gpu_s`` and ``data_s`` (the task's data
factory's time per batch, measured in the trial and included in
``step_time_s``: a run draws a batch every step); and, unless
``segment_costs=False``, what a segment costs besides its steps
(:mod:`ray_saturn.profiler.segment`): ``startup_s`` (a TorchTrainer's start
on that many GPUs, plus the task's model build and strategy set-up before
its first step), ``checkpoint_save_s`` and ``checkpoint_load_s``. The
trainer start is probed under the concurrency the run will have: as many
trainers of that many GPUs started side by side as the cluster holds
(``startup_side_by_side``, default: its GPUs over the trial's, at most 8
and at most the number of tasks),
as a run's first plan starts one segment per free GPU at once; on a small
machine two trainers started together each take far longer than one alone.
Probes are kept in the store per (GPU count, side by side, hardware).

With ``shares=(2, 4)`` (k in 2, 4, 8; default none) each task's ``single``
configuration is also measured on a share 1/k of one device, k copies of the
job running there at once (:mod:`ray_saturn.profiler.shares`): a feasible
share is a row of ``gpus`` = 1/k, ``nodes`` = 1 with the same columns as the
whole-GPU row (its start-up, checkpoint costs, data time and step factor)
plus ``device_mem_gb`` (the budget k copies were checked against); a share
that does not fit, or could not be measured, is reported in
:attr:`ProfileResult.infeasible` and not written.

Example:
    >>> import ray, ray_saturn
    >>> from ray_saturn.toy import mlp_task
    >>> _ = ray.init(num_gpus=2, num_cpus=2, include_dashboard=False)  # doctest: +SKIP
    >>> tasks = [mlp_task("a", lr=0.1)]
    >>> table = ray_saturn.profile(tasks, strategies=["single", "ddp"])  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray_saturn import defaults
from ray_saturn.errors import ProfileError, SaturnError, SpecError
from ray_saturn.limits import number, whole
from ray_saturn.profile_table import SHARES, ProfileTable, knobs_for, parse_knobs
from ray_saturn.profiler.ladder import LadderWalk, gpu_ladder
from ray_saturn.profiler.pool import TrialPool
from ray_saturn.profiler.segment import Calibration
from ray_saturn.profiler.shares import (
    SHARE_STRATEGY,
    ShareSpec,
    check_shares,
    fit_reason,
    query_device_memory_gb,
    run_shares,
    whole_gpu_budget,
)
from ray_saturn.profiler.store import ProfileStore, StoredShare, StoredStartup, StoredTrial
from ray_saturn.spec import ClusterSpec, Task, canonical_strategy, check_unique_names
from ray_saturn.strategies.introspect import check_trainable
from ray_saturn.strategies.registry import get_strategy, strategy_names

__all__ = ["ProfileResult", "Profiler", "knobs_for", "parse_knobs", "profile"]

log = logging.getLogger(__name__)

#: The most trainers the start-up probe starts at once (a GPU node's worth of one-GPU segments).
MAX_SIDE_BY_SIDE = 8
#: Seconds of steps the start-up probe's trainers train to compare a segment's step time with the trial's.
CALIBRATION_S = 2.0
#: The most seconds of calibration steps per probe (per GPU count); signatures past it take the median factor.
CALIBRATION_BUDGET_S = 16.0
#: Step factors outside this range are taken for a measuring accident (logged, clamped).
STEP_FACTOR_RANGE = (0.5, 3.0)


def _calibrations(
    tasks: Sequence[Task], sigs: Mapping[str, str], measured: Mapping[tuple[str, str, int, int], StoredTrial]
) -> dict[tuple[int, int], list[Calibration]]:
    """Per (gpus, nodes) of the feasible trials: the configurations the start-up probe trains, one
    per task signature (its fastest trial of that shape, the row a plan picks first; about
    :data:`CALIBRATION_S` of its steps, 3 to 50). At most :data:`CALIBRATION_BUDGET_S` of steps per
    shape: the signatures with the most work (steps x step time) first; the rest take the median
    factor of those calibrated."""
    by_sig: dict[str, Task] = {}
    for task in tasks:
        by_sig.setdefault(sigs[task.name], task)
    work: dict[str, float] = {}
    for task in tasks:
        work[sigs[task.name]] = work.get(sigs[task.name], 0.0) + float(task.total_steps)
    shapes: dict[tuple[int, int], dict[str, StoredTrial]] = {}
    for t in measured.values():
        if t.feasible and t.step_time_s and t.step_time_s > 0 and t.signature in by_sig:
            best = shapes.setdefault((t.gpus, t.nodes), {})
            old = best.get(t.signature)
            if old is None or (t.step_time_s, t.strategy) < (old.step_time_s, old.strategy):
                best[t.signature] = t
    out: dict[tuple[int, int], list[Calibration]] = {}
    for shape, best in shapes.items():
        ranked = sorted(best.values(), key=lambda x: (-work[x.signature] * x.step_time_s, x.signature))
        cals, spent = [], 0.0
        for t in ranked:
            steps = max(3, min(50, math.ceil(CALIBRATION_S / t.step_time_s)))
            if cals and spent + steps * t.step_time_s > CALIBRATION_BUDGET_S:
                continue
            spent += steps * t.step_time_s
            knobs = parse_knobs(t.knobs, f"the knobs of {t.strategy} on {t.gpus} GPU(s)")
            cals.append(Calibration(by_sig[t.signature], t.strategy, knobs, steps, t.step_time_s, t.signature))
        out[shape] = cals
    return out


def _row_factor(probe: StoredStartup | None, signature: str) -> float:
    """A row's step factor: its signature's, else the probe's median, else 1.0 (no probe)."""
    if probe is None:
        return 1.0
    if signature in probe.step_factors:
        return probe.step_factors[signature]
    return probe.step_factor if probe.step_factor is not None else 1.0


def _sane_factor(factor: float, gpus: int, nodes: int) -> float:
    low, high = STEP_FACTOR_RANGE
    if low <= factor <= high:
        return factor
    log.warning("a segment on %d GPU(s) over %d node(s) stepped %.2fx its trial's time; taken as %.2fx",
                gpus, nodes, factor, min(high, max(low, factor)))
    return min(high, max(low, factor))


@dataclass
class ProfileResult:
    """The table and what profiling cost."""

    table: ProfileTable
    cost_gpu_s: float
    workload_gpu_s: float
    trials_run: int
    trials_cached: int
    wall_s: float
    infeasible: list[tuple[str, str, int | float, str]] = field(default_factory=list)
    #: Trial worker processes started (fewer than the trials' GPUs when warm workers were lent on).
    workers_started: int = 0
    #: Shares of a device measured (k copies at once each) and taken from the store.
    shares_run: int = 0
    shares_cached: int = 0

    @property
    def cost_ratio(self) -> float:
        """Profiling GPU-seconds over the workload's estimated GPU-seconds."""
        return self.cost_gpu_s / self.workload_gpu_s if self.workload_gpu_s > 0 else math.inf

    def summary(self) -> str:
        shares = (
            f" and {self.shares_run + self.shares_cached} share(s) of a device ({self.shares_cached} from the store)"
            if self.shares_run or self.shares_cached
            else ""
        )
        return (
            f"profiled {self.trials_run} trial(s) ({self.trials_cached} from the store){shares} "
            f"in {self.wall_s:.1f} s: {self.cost_gpu_s:.1f} GPU-s, "
            f"{100 * self.cost_ratio:.2f}% of the workload's estimated "
            f"{self.workload_gpu_s:.1f} GPU-s"
        )


def _reasons_by_count(why: Mapping[tuple[int, int], str | None]) -> str:
    """Each distinct reason a strategy does not apply, with the GPU counts it was given for (the reason
    on 1 GPU, "needs at least 2 GPUs", alone would hide why the wider counts do not fit either)."""
    counts: dict[str, list[str]] = {}
    for (g, n), reason in why.items():
        if reason:
            where = f"{g} GPU{'s' if g != 1 else ''}" + (f" over {n} nodes" if n > 1 else "")
            counts.setdefault(reason, []).append(where)
    if not counts:
        return "no GPU count fits"
    return "; ".join(f"on {', '.join(gs)}: {reason}" for reason, gs in counts.items())


class Profiler:
    """Runs the trials (see the module docstring); use :func:`profile` for the one-call form.

    Example:
        >>> p = Profiler(ClusterSpec.uniform(1, 2), strategies=["single"], trial_timeout_s=60)
        >>> p.min_improvement
        0.05
    """

    def __init__(
        self,
        cluster: ClusterSpec | None = None,
        *,
        strategies: Sequence[str] | None = None,
        store: str | None = None,
        warmup: int = defaults.PROFILE_WARMUP_STEPS,
        steps: int = defaults.PROFILE_TIMED_STEPS,
        min_measure_s: float = defaults.PROFILE_MIN_MEASURE_S,
        trial_timeout_s: float = defaults.PROFILE_TRIAL_TIMEOUT_S,
        placement_timeout_s: float = 120.0,
        min_improvement: float = 0.05,
        memory_limit_gb: float | None = None,
        max_concurrent: int | None = None,
        segment_costs: bool = True,
        startup_side_by_side: int | None = None,
        warm_workers: bool = True,
        shares: Iterable[int] | None = None,
    ) -> None:
        self.shares = check_shares(shares)
        warmup = whole(warmup, "warmup (untimed steps per knob setting)", low=0)
        steps = whole(steps, "steps (timed steps per knob setting)", low=1)
        min_measure_s = number(min_measure_s, "min_measure_s (least timed seconds per knob setting)", low=0)
        trial_timeout_s = number(trial_timeout_s, "trial_timeout_s", low=0, low_open=True)
        placement_timeout_s = number(placement_timeout_s, "placement_timeout_s", low=0, low_open=True)
        if memory_limit_gb is not None:  # checked, kept as given: it is part of the trials' cache key
            number(memory_limit_gb, "memory_limit_gb (GB per GPU)", low=0, low_open=True)
        if not 0 <= min_improvement < 1:
            raise SpecError(f"min_improvement is {min_improvement}; give a fraction in [0, 1), e.g. 0.05")
        self.cluster = cluster
        self.strategies = [canonical_strategy(s) for s in strategies] if strategies is not None else None
        if self.strategies is not None:
            for s in self.strategies:
                get_strategy(s)
        self.store = ProfileStore(store)
        self.measure_kw = {
            "warmup": warmup,
            "steps": steps,
            "min_time_s": float(min_measure_s),
            "memory_limit_gb": memory_limit_gb,
        }
        self.trial_timeout_s = trial_timeout_s
        self.placement_timeout_s = placement_timeout_s
        self.min_improvement = float(min_improvement)
        self.max_concurrent = max_concurrent
        self.segment_costs = bool(segment_costs)
        if startup_side_by_side is not None and (
            isinstance(startup_side_by_side, bool)
            or not isinstance(startup_side_by_side, int)
            or startup_side_by_side < 1
        ):
            raise SpecError(
                f"startup_side_by_side is {startup_side_by_side!r}; give a whole number >= 1 (trainers "
                "started at once by the start-up probe) or None (as many as the cluster holds)"
            )
        self.startup_side_by_side = startup_side_by_side
        self.warm_workers = bool(warm_workers)

    def side_by_side(self, cluster: ClusterSpec, gpus: int, tasks: int | None = None) -> int:
        """Trainers of ``gpus`` GPUs the start-up probe starts at once: ``startup_side_by_side``, else as
        many as ``cluster`` holds (a run's first plan starts that many segments together), at most 8,
        and no more than the ``tasks`` being profiled (a run of one task never starts two segments).

        Example:
            >>> p = Profiler(ClusterSpec.uniform(1, 2))
            >>> p.side_by_side(ClusterSpec.uniform(1, 2), 1), p.side_by_side(ClusterSpec.uniform(1, 2), 2)
            (2, 1)
            >>> p.side_by_side(ClusterSpec.uniform(1, 4), 1, tasks=1)
            1
        """
        if self.startup_side_by_side is not None:
            return self.startup_side_by_side
        most = cluster.total_gpus // max(1, gpus)
        return max(1, min(MAX_SIDE_BY_SIDE, most, most if tasks is None else tasks))

    # ------------------------------------------------------------------ planning
    def _hardware(self) -> str:
        import ray

        kinds = sorted(k for k in ray.cluster_resources() if k.startswith("accelerator_type:"))
        return ",".join(kinds) or "no-accelerator-type"

    def _strategies_for(self, task: Task) -> list[str]:
        names = list(task.strategies) if task.strategies else (self.strategies or strategy_names())
        for n in names:
            get_strategy(n)
        if self.strategies is not None and task.strategies:
            names = [n for n in names if n in self.strategies]
        return names

    def run(self, tasks: Iterable[Task]) -> ProfileResult:
        """Profile ``tasks`` on the connected Ray cluster; returns the table and the cost."""
        import ray

        from ray_saturn.profiler.signature import performance_signature

        if not ray.is_initialized():
            raise SaturnError(
                "Ray is not initialised; call ray.init() first (on a laptop: "
                "ray.init(num_gpus=N, include_dashboard=False) gives N logical GPUs)"
            )
        tasks = check_unique_names(tasks)
        for task in tasks:  # every trial would fail (and the task be called infeasible on this many GPUs)
            check_trainable(task)
        cluster = self.cluster or ClusterSpec.from_ray()
        t0 = time.monotonic()
        hardware = self._hardware()
        settings = {k: v for k, v in self.measure_kw.items()}
        sigs: dict[str, str] = {}
        chains: dict[tuple[str, str], LadderWalk] = {}
        ladder = gpu_ladder(cluster)
        for task in tasks:
            sig = performance_signature(task, hardware=hardware, settings=settings)
            sigs[task.name] = sig
            for strat_name in self._strategies_for(task):
                if (sig, strat_name) in chains:
                    continue
                strat = get_strategy(strat_name)
                why = {(g, n): strat.applies(task, g) for g, n in ladder}
                steps = [gn for gn, reason in why.items() if reason is None]
                if steps:
                    chains[(sig, strat_name)] = LadderWalk(task, sig, strat_name, steps)
                else:
                    log.warning("%s does not apply to %s on any GPU count here: %s", strat_name, task.name,
                                _reasons_by_count(why))
        pool = TrialPool(
            self.store,
            dict(self.measure_kw),
            self.trial_timeout_s,
            self.placement_timeout_s,
            self.min_improvement,
            self.max_concurrent,
            self.warm_workers,
        )
        outcome = pool.run(list(chains.values()), cluster)
        startup: dict[tuple[int, int], StoredStartup] | None = None
        if self.segment_costs:
            calibrations = _calibrations(tasks, sigs, outcome.measured)
            startup = self._trainer_startup(hardware, calibrations, cluster, len(tasks))
        shares = self._measure_shares(tasks, sigs, outcome.measured, cluster) if self.shares else _Shares()
        self.store.flush()
        table = self._table(tasks, sigs, outcome.measured, outcome.cached, startup, shares)
        infeasible: list[tuple[str, str, int | float, str]] = [
            (c.task, c.strategy, c.gpus, c.reason or "") for c in table if not c.feasible
        ]
        for task in tasks:  # a share that does not fit (or was not measured) is reported, not written
            for share in shares.found.get(sigs[task.name], []):
                if not share.feasible:
                    infeasible.append((task.name, share.strategy, SHARES[share.copies], share.reason or ""))
        result = ProfileResult(
            table,
            outcome.cost_gpu_s + shares.cost_gpu_s,
            _workload_gpu_s(table),
            outcome.trials_run,
            len(outcome.cached),
            time.monotonic() - t0,
            infeasible,
            outcome.workers_started + shares.workers_started,
            shares.run,
            len(shares.cached),
        )
        log.info("%s", result.summary())
        return result

    def _trainer_startup(
        self, hardware: str, calibrations: dict[tuple[int, int], list[Calibration]], cluster: ClusterSpec,
        tasks: int,
    ) -> dict[tuple[int, int], StoredStartup]:
        """Per (gpus, nodes): trainer start (``fit()`` to the loop) and step factors, with as many trainers
        started side by side as :meth:`side_by_side` says: from the store, else probed now. A kept
        probe without a factor for some signature probes again, calibrating only those, and keeps the
        factors it had."""
        from ray_saturn.profiler.segment import median_factor, probe_trainer_startup

        out = {}
        backend: str | None = None  # the first probe asks the cluster; the next ones reuse its answer
        for (g, n), cals in sorted(calibrations.items(), key=lambda kv: kv[0]):
            k = self.side_by_side(cluster, g, tasks)
            known = self.store.startup(hardware, g, n, k)
            kept = dict(known.step_factors) if known is not None and known.step_factor is not None else {}
            todo = [c for c in cals if c.signature not in kept]
            if known is None or known.step_factor is None or todo:
                try:
                    probe = probe_trainer_startup(g, n, backend=backend, side_by_side=k, calibrate=todo)
                except Exception as exc:
                    raise ProfileError(
                        f"the trainer start-up probe on {g} GPU(s) failed ({type(exc).__name__}: "
                        f"{str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}); "
                        "profile with segment_costs=False to leave start-up out of the plan"
                    ) from None
                backend = probe.backend or backend
                kept.update({sig: _sane_factor(f, g, n) for sig, f in probe.step_factors.items()})
                factor = median_factor(kept.values())
                self.store.put_startup(hardware, g, n, probe.start_s, probe.stop_s, k, factor, kept)
                known = StoredStartup(probe.start_s, probe.stop_s, factor, kept)
            out[(g, n)] = known
        return out

    def _measure_shares(
        self,
        tasks: Sequence[Task],
        sigs: Mapping[str, str],
        measured: Mapping[tuple[str, str, int, int], StoredTrial],
        cluster: ClusterSpec,
    ) -> _Shares:
        """Every (signature, k) of :attr:`shares`: from the store, refused (no feasible whole-GPU
        ``single`` row, or k copies of its peak memory exceed the device's budget), else measured."""
        out = _Shares()
        limit = self.measure_kw["memory_limit_gb"]
        device_mem: list[float | None] = []  # asked of the cluster once, when a share needs it
        todo: list[ShareSpec] = []
        for task in tasks:
            sig = sigs[task.name]
            if sig in out.found:
                continue
            found = out.found.setdefault(sig, [])
            whole_row = measured.get((sig, SHARE_STRATEGY, 1, 1))
            for k in self.shares:
                hit = self.store.share(sig, SHARE_STRATEGY, k)
                if hit is not None:
                    found.append(hit)
                    out.cached.add(hit.key)
                    continue
                if SHARE_STRATEGY not in self._strategies_for(task):
                    why = (f"a share runs the {SHARE_STRATEGY} strategy, which {task.name} is not profiled with; "
                           f"add {SHARE_STRATEGY} to its strategies")
                elif whole_row is None or not whole_row.feasible:
                    got = "was not measured" if whole_row is None else f"is infeasible ({whole_row.reason})"
                    why = f"its whole-GPU {SHARE_STRATEGY} row {got}"
                else:
                    if not device_mem:
                        device_mem.append(query_device_memory_gb(self.placement_timeout_s))
                    budget = whole_gpu_budget(limit, device_mem[0])
                    why = fit_reason(k, whole_row.peak_mem_gb, budget)
                    if why is None:
                        knobs = parse_knobs(whole_row.knobs, f"the knobs of {task.name} {SHARE_STRATEGY}")
                        todo.append(ShareSpec(task, sig, k, knobs, whole_row.step_time_s or 0.0))
                        continue
                    why = f"{why} (the whole-GPU row's peak; not run)"
                    share = StoredShare(sig, SHARE_STRATEGY, k, None, None, whole_row.peak_mem_gb, budget, why, 0.0)
                    self.store.put_share(share)
                    found.append(share)
                    continue
                found.append(StoredShare(sig, SHARE_STRATEGY, k, None, None, None, None, why, 0.0))
        total = cluster.total_gpus
        concurrent = max(1, min(total, self.max_concurrent or total))
        for o in run_shares(todo, self.measure_kw, timeout_s=self.trial_timeout_s,
                            placement_timeout_s=self.placement_timeout_s, concurrent=concurrent):
            k = o.spec.copies
            budget = whole_gpu_budget(limit, o.device_mem_gb if o.device_mem_gb is not None else device_mem[0])
            why = o.reason or fit_reason(k, o.peak_mem_gb, budget)
            share = StoredShare(o.spec.signature, SHARE_STRATEGY, k, o.step_time_s, o.mean_step_s, o.peak_mem_gb,
                                budget, why, o.cost_gpu_s)
            self.store.put_share(share)
            out.found[o.spec.signature].append(share)
            out.cost_gpu_s += o.cost_gpu_s
            out.run += 1
            out.workers_started += k
        for found in out.found.values():
            found.sort(key=lambda s: s.copies)
        return out

    # ------------------------------------------------------------------ output
    def _table(self, tasks, sigs, measured, cached_keys, startup=None, shares=None) -> ProfileTable:
        rows: list[dict[str, Any]] = []
        for task in tasks:
            sig = sigs[task.name]
            found = sorted((t for k, t in measured.items() if k[0] == sig), key=lambda t: (t.strategy, t.gpus))
            # A trial that could not save or load (multi-node: no shared folder) takes its signature's worst.
            save = max((t.checkpoint_save_s for t in found if t.checkpoint_save_s is not None), default=0.0)
            load = max((t.checkpoint_load_s for t in found if t.checkpoint_load_s is not None), default=0.0)
            for t in found:
                # A run's step also draws its batch: the data factory's time per batch counts.
                step = None if not t.feasible or t.step_time_s is None else t.step_time_s + (t.data_s or 0.0)
                probe = startup.get((t.gpus, t.nodes)) if startup is not None else None
                factor = _row_factor(probe, sig)
                trial_step = step
                if step is not None:
                    step *= factor  # as fast as a segment steps, not as fast as the trial did
                row = {
                    "task": task.name,
                    "strategy": t.strategy,
                    "gpus": t.gpus,
                    "nodes": t.nodes,
                    "step_time_s": step,
                    "steps": task.total_steps,
                    "feasible": t.feasible,
                    "peak_mem_gb": t.peak_mem_gb,
                    "reason": t.reason,
                    "knobs": t.knobs,
                    "signature": sig,
                    "cached": t.key in cached_keys,
                    "cost_gpu_s": t.cost_gpu_s,
                    "data_s": t.data_s,
                }
                if startup is not None:
                    # The cold first step is one of the task's steps: only what comes before it is start-up.
                    setup = max(0.0, (t.setup_s or 0.0) - (trial_step or 0.0)) if t.feasible else 0.0
                    row["startup_s"] = (probe.start_s if probe is not None else 0.0) + setup
                    row["trial_step_time_s"] = trial_step
                    row["step_factor"] = factor
                    row["checkpoint_save_s"] = t.checkpoint_save_s if t.checkpoint_save_s is not None else save
                    row["checkpoint_load_s"] = t.checkpoint_load_s if t.checkpoint_load_s is not None else load
                rows.append(row)
                if (t.strategy, t.gpus, t.nodes) == (SHARE_STRATEGY, 1, 1) and t.feasible and shares is not None:
                    rows.extend(_share_rows(row, shares.found.get(sig, []), shares.cached))
            if not found:
                names = ", ".join(self._strategies_for(task))
                rows.append(
                    {
                        "task": task.name,
                        "strategy": self._strategies_for(task)[0],
                        "gpus": 1,
                        "nodes": 1,
                        "step_time_s": None,
                        "steps": task.total_steps,
                        "feasible": False,
                        "peak_mem_gb": None,
                        "reason": f"none of the strategies ({names}) applies on this cluster",
                        "knobs": "{}",
                        "signature": sig,
                        "cached": False,
                        "cost_gpu_s": 0.0,
                    }
                )
        return ProfileTable.from_rows(rows, source="profiler")


@dataclass
class _Shares:
    """The shares of a run, by signature: found (measured, cached or refused), and what they cost."""

    found: dict[str, list[StoredShare]] = field(default_factory=dict)
    cached: set[tuple[str, str, int]] = field(default_factory=set)
    cost_gpu_s: float = 0.0
    run: int = 0
    workers_started: int = 0


def _share_rows(
    whole_row: Mapping[str, Any], shares: Sequence[StoredShare], cached: set
) -> list[dict[str, Any]]:
    """The feasible shares as rows: the whole-GPU ``single`` row's columns with the share's
    ``gpus``, step time (its batch draws measured with it; the whole row's step factor), peak memory
    per copy, cost, and ``device_mem_gb``."""
    out = []
    for share in shares:
        if not share.feasible or share.step_time_s is None:
            continue
        trial_step = share.step_time_s
        row = dict(whole_row)
        row.update(
            gpus=SHARES[share.copies],
            step_time_s=trial_step * float(whole_row.get("step_factor", 1.0)),
            peak_mem_gb=share.peak_mem_gb,
            cached=share.key in cached,
            cost_gpu_s=share.cost_gpu_s,
            device_mem_gb=share.budget_gb,
        )
        if "trial_step_time_s" in row:
            row["trial_step_time_s"] = trial_step
        out.append(row)
    return out


def _workload_gpu_s(table: ProfileTable) -> float:
    total = 0.0
    for task in table.tasks:
        costs = [c.runtime_s * c.gpus for c in table.configs(task, feasible_only=True)]
        if costs:
            total += min(costs)
    return total


def profile(
    tasks: Iterable[Task],
    cluster: ClusterSpec | None = None,
    *,
    output: str | None = None,
    **options: Any,
) -> ProfileTable:
    """Measure ``tasks`` on the connected Ray cluster and return the profile table.

    ``cluster`` defaults to :meth:`ClusterSpec.from_ray`; ``options`` go to
    :class:`Profiler` (``strategies``, ``store`` (Parquet cache path),
    ``warmup``, ``steps``, ``min_measure_s`` (least seconds of timed steps per knob setting, 0.5),
    ``trial_timeout_s``, ``min_improvement``,
    ``memory_limit_gb``, ``segment_costs`` (start-up and checkpoint columns,
    default on), ``startup_side_by_side`` (trainers the start-up probe starts
    at once; default as many as the cluster holds), ``warm_workers`` (on one
    node, lend trial workers from trial to trial; default on), ``shares`` (k's of
    the shares 1/k of one device to measure, e.g. ``(2, 4)``; default none), ...).
    ``output`` also writes the table (.csv or .parquet). The cost is logged; use ``Profiler(...).run(tasks)`` to get it.

    Example:
        >>> import ray_saturn
        >>> from ray_saturn.errors import SaturnError
        >>> try:
        ...     ray_saturn.profile([], ray_saturn.ClusterSpec.uniform(1, 1))
        ... except SaturnError as exc:
        ...     print(str(exc)[:26])
        Ray is not initialised; ca
    """
    result = Profiler(cluster, **options).run(tasks)
    if output:
        result.table.write(output)
    return result.table
