"""The trial pool: runs the profiler's ladder walks as concurrent Ray trials on the cluster.

Each step of a :class:`~ray_saturn.profiler.ladder.LadderWalk` is one trial
(:mod:`ray_saturn.profiler.trials`) on a placement group sized to it; the
pool launches as many at once as the cluster's GPUs and ``max_concurrent``
allow, takes configurations already in the store without running them,
records a trial that cannot be placed, fails, or hangs as infeasible with
the reason, and stores every result. On a one-node cluster trials run on
warm workers lent from trial to trial (``warm_workers``, default on; see
:class:`~ray_saturn.profiler.trials.WarmWorkers`), killed when the pool is done.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.errors import ProfileError
from ray_saturn.profiler.ladder import LadderWalk
from ray_saturn.profiler.segment import SegmentCosts
from ray_saturn.profiler.store import ProfileStore, StoredTrial
from ray_saturn.profiler.trials import RunningTrial, TrialSpec, WarmWorkers, launch, launch_warm
from ray_saturn.spec import ClusterSpec

__all__ = ["PoolOutcome", "TrialPool", "group_intact"]

log = logging.getLogger(__name__)

TrialKey = tuple[str, str, int, int]


def group_intact(outcome: Any) -> bool:
    """Whether a multi-GPU trial's workers may be lent to the next trial: a search that ran every
    knob setting to the end (feasible, or refused by the memory budget after measuring) or never
    started one leaves their process group as it was; a setting that raised may have left a
    collective half done, so those workers are ended."""
    if outcome.feasible:
        return True
    return all(t.step_time_s is not None for t in getattr(outcome, "trials", ()))


@dataclass
class PoolOutcome:
    """What the pool measured: every trial by (signature, strategy, gpus, nodes), and its cost."""

    measured: dict[TrialKey, StoredTrial] = field(default_factory=dict)
    cached: set[TrialKey] = field(default_factory=set)
    cost_gpu_s: float = 0.0
    trials_run: int = 0
    #: Trial worker processes started (warm workers are started once and lent to several trials).
    workers_started: int = 0


@dataclass
class TrialPool:
    """Runs ladder walks' trials concurrently; see the module docstring.

    Example:
        >>> pool = TrialPool(ProfileStore(None), {"warmup": 1, "steps": 2}, 60.0, 30.0, 0.05)
        >>> pool.max_concurrent is None
        True
    """

    store: ProfileStore
    measure_kw: dict[str, Any]
    trial_timeout_s: float
    placement_timeout_s: float
    min_improvement: float
    max_concurrent: int | None = None
    warm_workers: bool = True

    def run(self, chains: list[LadderWalk], cluster: ClusterSpec) -> PoolOutcome:
        """Walk every ladder to its end on ``cluster``; returns what was measured."""
        import ray

        # warm workers hold their GPUs without a placement group: only where Ray has every GPU the spec claims
        has = ray.cluster_resources().get("GPU", 0) if ray.is_initialized() else 0
        one_node = len(cluster.nodes) == 1 and cluster.total_gpus <= has
        warm = WarmWorkers() if self.warm_workers and one_node else None
        try:
            out = self._run(chains, cluster, warm)
        finally:
            if warm is not None:
                warm.close()
        if warm is not None:
            out.workers_started = warm.created
            log.info("%d trial(s) on %d warm worker(s) lent from trial to trial", out.trials_run, warm.created)
        return out

    def _run(self, chains: list[LadderWalk], cluster: ClusterSpec, warm: WarmWorkers | None) -> PoolOutcome:
        import ray

        from ray_saturn.strategies.base import Infeasible

        free = cluster.total_gpus
        limit = self.max_concurrent or len(chains) or 1
        waiting_pg: dict[Any, tuple[LadderWalk, RunningTrial]] = {}
        running: dict[Any, tuple[LadderWalk, RunningTrial]] = {}
        busy: set[int] = set()
        out = PoolOutcome()
        last_release = time.monotonic()

        def finish(
            chain: LadderWalk, trial: RunningTrial, outcome, spent: float, costs=None, healthy: bool = True
        ) -> None:
            nonlocal free, last_release
            trial.release(healthy)
            last_release = time.monotonic()
            free += trial.spec.gpus
            busy.discard(id(chain))
            out.cost_gpu_s += spent
            stored = _stored(trial.spec, outcome, spent, costs)
            self.store.put(stored)
            out.measured[stored.key] = stored
            chain.advance(stored, self.min_improvement)

        def fail(chain: LadderWalk, trial: RunningTrial, reason: str) -> None:
            finish(
                chain,
                trial,
                Infeasible(trial.spec.strategy, trial.spec.gpus, reason),
                trial.gpu_seconds(),
                healthy=False,
            )

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
                        out.measured[hit.key] = hit
                        out.cached.add(hit.key)
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
                        trial = launch_warm(spec, warm) if warm is not None else launch(spec)
                        waiting_pg[trial.ready_ref] = (chain, trial)
                        busy.add(id(chain))
                        free -= g
                        out.trials_run += 1
                        if warm is None:
                            out.workers_started += g
                        progressed = True
            if not waiting_pg and not running:
                if any(c.next() is not None for c in chains):
                    raise ProfileError(
                        f"a trial needs more GPUs than the cluster's {cluster.total_gpus}; "
                        "check the ClusterSpec against the Ray cluster"
                    )
                return out
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
                        outcome, costs = ray.get(ref)
                    except Exception as exc:
                        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
                        fail(chain, trial, f"trial worker died: {first}")
                        continue
                    healthy = trial.spec.gpus == 1 or group_intact(outcome)
                    finish(chain, trial, outcome, trial.gpu_seconds(), costs, healthy)
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


def _stored(spec: TrialSpec, outcome, spent: float, costs: SegmentCosts | None = None) -> StoredTrial:
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
            None if costs is None else costs.setup_s,
            None if costs is None else costs.save_s,
            None if costs is None else costs.load_s,
            None if costs is None else costs.data_s,
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
