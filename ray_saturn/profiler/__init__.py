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
``signature``, ``cached`` and ``cost_gpu_s``.

Example:
    >>> import ray, ray_saturn
    >>> from ray_saturn.toy import mlp_task
    >>> _ = ray.init(num_gpus=2, num_cpus=2, include_dashboard=False)  # doctest: +SKIP
    >>> tasks = [mlp_task("a", lr=0.1)]
    >>> table = ray_saturn.profile(tasks, strategies=["single", "ddp"])  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.errors import ProfileError, SaturnError, SpecError
from ray_saturn.profile_table import ProfileTable
from ray_saturn.profiler.store import ProfileStore, StoredTrial
from ray_saturn.profiler.trials import RunningTrial, TrialSpec, launch
from ray_saturn.spec import ClusterSpec, Task, check_unique_names
from ray_saturn.strategies.registry import get_strategy, strategy_names

__all__ = ["ProfileResult", "Profiler", "gpu_ladder", "knobs_for", "profile"]

log = logging.getLogger(__name__)

_MEMORY_WORDS = ("out of memory", "exceeds the")


def gpu_ladder(cluster: ClusterSpec) -> list[tuple[int, int]]:
    """(gpus, nodes) tried in order: 1, 2, 4, ... up to one node, then 2, 3, ... whole nodes.

    Example:
        >>> gpu_ladder(ClusterSpec.uniform(2, 4))
        [(1, 1), (2, 1), (4, 1), (8, 2)]
    """
    per_node = max(n.gpus for n in cluster.nodes)
    out, g = [], 1
    while g < per_node:
        out.append((g, 1))
        g *= 2
    out.append((per_node, 1))
    for k in range(2, len(cluster.nodes) + 1):
        if sum(1 for n in cluster.nodes if n.gpus >= per_node) >= k:
            out.append((k * per_node, k))
    return out


def knobs_for(table: ProfileTable, task: str, strategy: str, gpus: int, nodes: int = 1) -> dict[str, Any]:
    """The knob settings the profiler chose for a configuration (``{}`` if the table has none).

    Example:
        >>> t = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 2,
        ...     "step_time_s": 1.0, "steps": 5, "knobs": '{"bucket_cap_mb": 50}'}])
        >>> knobs_for(t, "a", "ddp", 2)
        {'bucket_cap_mb': 50}
    """
    arrow = table.to_arrow()
    if "knobs" not in arrow.column_names:
        return {}
    cols = arrow.select(["task", "strategy", "gpus", "nodes", "knobs"]).to_pylist()
    for row in cols:
        if (row["task"], row["strategy"], row["gpus"], row["nodes"]) == (
            task,
            strategy,
            gpus,
            nodes,
        ):
            return json.loads(row["knobs"]) if row["knobs"] else {}
    raise ProfileError(f"no row for task {task!r} strategy {strategy!r} with {gpus} GPU(s) on {nodes} node(s)")


@dataclass
class ProfileResult:
    """The table and what profiling cost."""

    table: ProfileTable
    cost_gpu_s: float
    workload_gpu_s: float
    trials_run: int
    trials_cached: int
    wall_s: float
    infeasible: list[tuple[str, str, int, str]] = field(default_factory=list)

    @property
    def cost_ratio(self) -> float:
        """Profiling GPU-seconds over the workload's estimated GPU-seconds."""
        return self.cost_gpu_s / self.workload_gpu_s if self.workload_gpu_s > 0 else math.inf

    def summary(self) -> str:
        return (
            f"profiled {self.trials_run} trial(s) ({self.trials_cached} from the store) "
            f"in {self.wall_s:.1f} s: {self.cost_gpu_s:.1f} GPU-s, "
            f"{100 * self.cost_ratio:.2f}% of the workload's estimated "
            f"{self.workload_gpu_s:.1f} GPU-s"
        )


@dataclass
class _Chain:
    """One (signature, strategy): its ladder of GPU counts, walked while step time improves."""

    spec_task: Task
    signature: str
    strategy: str
    ladder: list[tuple[int, int]]
    pos: int = 0
    best: float | None = None
    done: bool = False

    def next(self) -> tuple[int, int] | None:
        return None if self.done or self.pos >= len(self.ladder) else self.ladder[self.pos]

    def advance(self, trial: StoredTrial, min_improvement: float) -> None:
        self.pos += 1
        if trial.feasible and trial.step_time_s is not None:
            if self.best is not None and trial.step_time_s > self.best * (1 - min_improvement):
                self.done = True
            self.best = trial.step_time_s if self.best is None else min(self.best, trial.step_time_s)
        elif not any(w in (trial.reason or "") for w in _MEMORY_WORDS):
            self.done = True  # a failure that more GPUs will not fix


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
        warmup: int = 2,
        steps: int = 5,
        trial_timeout_s: float = 600.0,
        placement_timeout_s: float = 120.0,
        min_improvement: float = 0.05,
        memory_limit_gb: float | None = None,
        max_concurrent: int | None = None,
    ) -> None:
        if warmup < 0 or steps < 1:
            raise SpecError(f"warmup={warmup}, steps={steps}: give warmup >= 0 and steps >= 1")
        if trial_timeout_s <= 0 or placement_timeout_s <= 0:
            raise SpecError("trial_timeout_s and placement_timeout_s must be positive seconds")
        if not 0 <= min_improvement < 1:
            raise SpecError(f"min_improvement is {min_improvement}; give a fraction in [0, 1), e.g. 0.05")
        self.cluster = cluster
        self.strategies = list(strategies) if strategies is not None else None
        if self.strategies is not None:
            for s in self.strategies:
                get_strategy(s)
        self.store = ProfileStore(store)
        self.measure_kw = {
            "warmup": int(warmup),
            "steps": int(steps),
            "memory_limit_gb": memory_limit_gb,
        }
        self.trial_timeout_s = float(trial_timeout_s)
        self.placement_timeout_s = float(placement_timeout_s)
        self.min_improvement = float(min_improvement)
        self.max_concurrent = max_concurrent

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
        cluster = self.cluster or ClusterSpec.from_ray()
        t0 = time.monotonic()
        hardware = self._hardware()
        settings = {k: v for k, v in self.measure_kw.items()}
        sigs: dict[str, str] = {}
        chains: dict[tuple[str, str], _Chain] = {}
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
                    chains[(sig, strat_name)] = _Chain(task, sig, strat_name, steps)
                else:
                    first = next((r for r in why.values() if r), "no GPU count fits")
                    log.warning("%s does not apply to %s on any GPU count here: %s", strat_name, task.name, first)
        measured: dict[tuple[str, str, int, int], StoredTrial] = {}
        cached_keys: set[tuple[str, str, int, int]] = set()
        cost, run_count = self._walk(list(chains.values()), cluster, measured, cached_keys)
        self.store.flush()
        table = self._table(tasks, sigs, chains, measured, cached_keys)
        result = ProfileResult(
            table,
            cost,
            _workload_gpu_s(table),
            run_count,
            len(cached_keys),
            time.monotonic() - t0,
            [(c.task, c.strategy, c.gpus, c.reason or "") for c in table if not c.feasible],
        )
        log.info("%s", result.summary())
        return result

    # ------------------------------------------------------------------ running
    def _walk(self, chains: list[_Chain], cluster: ClusterSpec, measured, cached_keys) -> tuple[float, int]:
        import ray

        from ray_saturn.strategies.base import Infeasible

        free = cluster.total_gpus
        limit = self.max_concurrent or len(chains) or 1
        waiting_pg: dict[Any, tuple[_Chain, RunningTrial]] = {}
        running: dict[Any, tuple[_Chain, RunningTrial]] = {}
        busy: set[int] = set()
        cost, run_count = 0.0, 0
        last_release = time.monotonic()

        def finish(chain: _Chain, trial: RunningTrial, outcome, spent: float) -> None:
            nonlocal free, cost, last_release
            trial.release()
            last_release = time.monotonic()
            free += trial.spec.gpus
            busy.discard(id(chain))
            cost += spent
            stored = _stored(trial.spec, outcome, spent)
            self.store.put(stored)
            measured[stored.key] = stored
            chain.advance(stored, self.min_improvement)

        def fail(chain: _Chain, trial: RunningTrial, reason: str) -> None:
            finish(chain, trial, Infeasible(trial.spec.strategy, trial.spec.gpus, reason), trial.gpu_seconds())

        while True:
            # launch what fits (cached configurations are taken from the store at once)
            progressed = True
            while progressed:
                progressed = False
                for chain in chains:
                    if id(chain) in busy:
                        continue
                    nxt = chain.next()
                    if nxt is None:
                        continue
                    g, n = nxt
                    hit = self.store.get(chain.signature, chain.strategy, g, n)
                    if hit is not None:
                        measured[hit.key] = hit
                        cached_keys.add(hit.key)
                        chain.advance(hit, self.min_improvement)
                        progressed = True
                        continue
                    if g <= free and len(busy) < limit:
                        spec = TrialSpec(
                            chain.spec_task,
                            chain.signature,
                            chain.strategy,
                            g,
                            n,
                            dict(self.measure_kw),
                        )
                        trial = launch(spec)
                        waiting_pg[trial.ready_ref] = (chain, trial)
                        busy.add(id(chain))
                        free -= g
                        run_count += 1
                        progressed = True
            if not waiting_pg and not running:
                if any(c.next() is not None for c in chains):
                    raise ProfileError(
                        f"a trial needs more GPUs than the cluster's {cluster.total_gpus}; "
                        "check the ClusterSpec against the Ray cluster"
                    )
                return cost, run_count
            refs = list(waiting_pg) + list(running)
            ready, _ = ray.wait(refs, num_returns=1, timeout=1.0)
            now = time.monotonic()
            for ref in ready:
                if ref in waiting_pg:
                    chain, trial = waiting_pg.pop(ref)
                    try:
                        trial.start(self.trial_timeout_s)
                    except Exception as exc:
                        fail(chain, trial, f"workers failed to start: {exc}")
                        continue
                    running[trial.result_ref] = (chain, trial)
                else:
                    chain, trial = running.pop(ref)
                    try:
                        outcome = ray.get(ref)
                    except Exception as exc:
                        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
                        fail(chain, trial, f"trial worker died: {first}")
                        continue
                    finish(chain, trial, outcome, trial.gpu_seconds())
            for ref, (chain, trial) in list(waiting_pg.items()):
                # our own running trials may hold the bundles it waits for: only time it out when
                # none runs and none finished within the timeout (then the cluster cannot place it)
                waited = now - max(trial.created_s, last_release)
                if not running and waited > self.placement_timeout_s:
                    waiting_pg.pop(ref)
                    fail(
                        chain,
                        trial,
                        f"no placement for {trial.spec.gpus} GPU(s) on {trial.spec.nodes} node(s) "
                        f"within {self.placement_timeout_s:g} s",
                    )
            for ref, (chain, trial) in list(running.items()):
                if trial.started_s is not None and now - trial.started_s > self.trial_timeout_s:
                    running.pop(ref)
                    log.warning(
                        "trial %s %s on %d GPU(s) hung; killed after %g s",
                        trial.spec.task.name,
                        trial.spec.strategy,
                        trial.spec.gpus,
                        self.trial_timeout_s,
                    )
                    fail(chain, trial, f"hung: no result within {self.trial_timeout_s:g} s; killed")

    # ------------------------------------------------------------------ output
    def _table(self, tasks, sigs, chains, measured, cached_keys) -> ProfileTable:
        rows: list[dict[str, Any]] = []
        for task in tasks:
            sig = sigs[task.name]
            found = sorted((t for k, t in measured.items() if k[0] == sig), key=lambda t: (t.strategy, t.gpus))
            for t in found:
                rows.append(
                    {
                        "task": task.name,
                        "strategy": t.strategy,
                        "gpus": t.gpus,
                        "nodes": t.nodes,
                        "step_time_s": t.step_time_s if t.feasible else None,
                        "steps": task.total_steps,
                        "feasible": t.feasible,
                        "peak_mem_gb": t.peak_mem_gb,
                        "reason": t.reason,
                        "knobs": t.knobs,
                        "signature": sig,
                        "cached": t.key in cached_keys,
                        "cost_gpu_s": t.cost_gpu_s,
                    }
                )
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


def _stored(spec: TrialSpec, outcome, spent: float) -> StoredTrial:
    if outcome.feasible:
        return StoredTrial(
            spec.signature,
            spec.strategy,
            spec.gpus,
            spec.nodes,
            outcome.step_time_s,
            True,
            outcome.peak_mem_gb,
            None,
            json.dumps(dict(outcome.knobs), sort_keys=True),
            spent,
        )
    return StoredTrial(
        spec.signature,
        spec.strategy,
        spec.gpus,
        spec.nodes,
        None,
        False,
        None,
        outcome.reason,
        "{}",
        spent,
    )


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
    ``warmup``, ``steps``, ``trial_timeout_s``, ``min_improvement``,
    ``memory_limit_gb``, ...). ``output`` also writes the table (.csv or
    .parquet). The cost is logged; use ``Profiler(...).run(tasks)`` to get it.

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
