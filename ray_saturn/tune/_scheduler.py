"""SaturnScheduler: a Tune TrialScheduler that decides each trial's strategy, GPUs and start order.

It wraps the user's scheduler (ASHA, HyperBand, FIFO, ...), which keeps
deciding *whether* a trial continues; ray_saturn decides *how* and *when*:

- on_trial_add (a trial arrives online from any search algorithm): the
  trial is held (PAUSED, no actor, no resources) and every trial that has
  not ended is re-planned with ``ray_saturn.plan`` on the cluster: running
  trials are pinned where they run (movable at ``restart_s`` set-up when
  ``allow_moves``), the others get a strategy, a GPU count, a node and a
  start time.
- choose_trial_to_run: held trials are released in planned start order as
  soon as their planned GPUs are free on their planned node (the ledger
  counts only trials this scheduler released and that have not ended). A
  released trial's placement group is one bundle of ``g`` GPUs (STRICT_PACK,
  pinned to the node by its ``node:<ip>`` resource when node IPs are unique)
  and its config carries ``{"_saturn": {"strategy", "gpus"}}`` for
  :func:`saturn_trainable`.
- on_trial_result: progress and the measured step time replace the
  estimate; a trial >10% off its estimate, or ``replan_interval_s`` elapsed,
  triggers a re-plan; if the new plan moves a running trial, the trial is
  PAUSED (Tune checkpoints it and stops its actor, so its GPUs are freed) and
  resumed with the new resources from its checkpoint.
- on_trial_complete / on_trial_error / on_trial_remove (also a trial
  early-stopped by ASHA): its GPUs leave the ledger at once and the
  remaining trials are re-planned.

Traps avoided: the trial never starts a Ray Train run or placement group of
its own (no nested placement group waiting for GPUs its parent holds), and
a held or paused trial has no actor, so it holds no GPUs. ``reuse_actors``
must be False (a cached actor would keep its GPUs); this is checked.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from ray_saturn.context import PlanningContext, RunningTask
from ray_saturn.errors import SaturnError
from ray_saturn.metrics import RunMetrics
from ray_saturn.plan import Plan
from ray_saturn.profile_table import ProfileTable
from ray_saturn.spec import ClusterSpec
from ray_saturn.strategies import get_strategy
from ray_saturn.tune._trainable import tune_strategies

__all__ = ["GpuEvent", "SaturnScheduler", "TuneIntegrationError"]

logger = logging.getLogger(__name__)

#: A trial this far off its estimated step time triggers a re-plan.
OFF_ESTIMATE = 0.10


class TuneIntegrationError(SaturnError, ValueError):
    """The Tune integration was set up or used wrongly (bad estimate, reuse_actors, ...)."""


@dataclass(frozen=True)
class GpuEvent:
    """A change of the scheduler's GPU ledger: ``gpus`` > 0 taken, < 0 given back."""

    time_s: float
    trial: str
    node: str
    gpus: int
    reason: str


@dataclass
class _TrialInfo:
    rows: list[dict[str, Any]]
    total_steps: int
    steps_done: int = 0
    measured_step_s: float | None = None
    current: tuple[str, int, str] | None = None  # (strategy, gpus, node) while released
    ended: bool = False
    resize_to: tuple[str, int, str] | None = None
    arrived_s: float = 0.0

    def estimate(self, strategy: str, gpus: int) -> float | None:
        for r in self.rows:
            if r["strategy"] == strategy and r["gpus"] == gpus:
                return float(r["step_time_s"])
        return None


@dataclass
class _Ledger:
    cluster: ClusterSpec
    held: dict[str, tuple[str, int]] = field(default_factory=dict)  # trial -> (node, gpus)

    def free(self, node: str) -> int:
        return self.cluster.node(node).gpus - sum(g for n, g in self.held.values() if n == node)

    def used(self) -> int:
        return sum(g for _, g in self.held.values())


class SaturnScheduler(TrialScheduler):
    """Let ray_saturn choose each Tune trial's strategy, GPU count and start order.

    Args:
        estimate: ``config -> rows``, each row ``{"strategy", "gpus",
            "step_time_s", "steps"}`` (seconds per optimizer step on that
            many GPUs, and the trial's total steps; optional ``knobs``,
            ``feasible``, ``nodes``). Rows of ``ray_saturn.profile`` fit as
            they are; multi-node rows are ignored (a trial is one bundle).
        base_scheduler: the early-stopping scheduler (e.g. ``ASHAScheduler``);
            default FIFO.
        cluster: the GPUs the trials may use; default: the connected Ray
            cluster's GPU nodes (``ClusterSpec.from_ray()``).
        policy: the planning policy (``saturn``, or a baseline).
        restart_s: set-up seconds a move costs (checkpoint, stop, restart).
        allow_moves: let re-planning resize or move running trials.
        replan_interval_s: re-plan at least this often while trials report.
        cpus_per_trial: CPUs in each trial's bundle besides its GPUs.
        solver_time_limit_s: time limit per plan (plans are made inside
            Tune's event loop, so keep it small).
        run_name: the ``run`` tag of the dashboard metrics.

    Example:
        >>> from ray import tune
        >>> from ray.tune.schedulers import ASHAScheduler
        >>> from ray_saturn.tune import SaturnScheduler, saturn_trainable
        >>> rows = lambda config: [
        ...     {"strategy": "single", "gpus": 1, "step_time_s": 0.2, "steps": 100},
        ...     {"strategy": "ddp", "gpus": 2, "step_time_s": 0.12, "steps": 100}]
        >>> scheduler = SaturnScheduler(rows, base_scheduler=ASHAScheduler(), cluster=None)
        >>> # tune.Tuner(saturn_trainable(make_task), param_space=...,
        >>> #            tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler)).fit()
    """

    def __init__(
        self,
        estimate: Callable[[Mapping[str, Any]], Sequence[Mapping[str, Any]]],
        *,
        base_scheduler: TrialScheduler | None = None,
        cluster: ClusterSpec | None = None,
        policy: str = "saturn",
        restart_s: float = 5.0,
        allow_moves: bool = True,
        replan_interval_s: float = 15.0,
        cpus_per_trial: float = 1.0,
        solver_time_limit_s: float = 1.0,
        run_name: str | None = None,
    ) -> None:
        super().__init__()
        if not callable(estimate):
            raise TuneIntegrationError("estimate must be a function config -> list of profile rows")
        if not (restart_s >= 0 and math.isfinite(restart_s)):
            raise TuneIntegrationError(f"restart_s is {restart_s}; it must be a finite number >= 0")
        if not replan_interval_s > 0:
            raise TuneIntegrationError(f"replan_interval_s is {replan_interval_s}; it must be > 0")
        if cpus_per_trial < 0:
            raise TuneIntegrationError(f"cpus_per_trial is {cpus_per_trial}; it must be >= 0")
        self._estimate = estimate
        self._base = base_scheduler or FIFOScheduler()
        self._cluster = cluster
        self._policy = policy
        self._restart_s = float(restart_s)
        self._allow_moves = bool(allow_moves)
        self._replan_interval_s = float(replan_interval_s)
        self._cpus = float(cpus_per_trial)
        self._time_limit_s = float(solver_time_limit_s)
        self._trials: dict[str, _TrialInfo] = {}
        self._ledger: _Ledger | None = None
        self._node_ips: dict[str, str] = {}
        self._plan: Plan | None = None
        self._plan_at = 0.0
        self._dirty = False
        self._t0 = time.monotonic()
        self.run_name = run_name or f"tune-{uuid.uuid4().hex[:8]}"
        self.metrics = RunMetrics(self.run_name)
        #: Every plan made, in order (the first on the first arrival).
        self.plans: list[Plan] = []
        #: Every change of the GPU ledger.
        self.gpu_events: list[GpuEvent] = []
        #: Trials moved (paused and resized) by re-planning: (trial, from, to).
        self.moves: list[tuple[str, tuple[str, int], tuple[str, int]]] = []

    # ------------------------------------------------------------ Tune hooks
    @property
    def metric(self):
        return getattr(self._base, "_metric", None)

    def set_search_properties(self, metric: str | None, mode: str | None, **spec) -> bool:
        return self._base.set_search_properties(metric, mode, **spec)

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        self._base.on_trial_add(tune_controller, trial)
        if trial.trial_id in self._trials or trial.status in (Trial.TERMINATED, Trial.ERROR):
            return
        user_config = {k: v for k, v in trial.config.items() if k != "_saturn"}
        self._trials[trial.trial_id] = self._rows_for(trial.trial_id, user_config)
        self.metrics.task_state(trial.trial_id, "queued")
        # Held until the plan releases it: a PAUSED trial has no actor and no resources.
        trial.set_status(Trial.PAUSED)
        self._replan("arrival of " + trial.trial_id)

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        info = self._trials.get(trial.trial_id)
        decision = self._base.on_trial_result(tune_controller, trial, result)
        if info is None:
            return decision
        step = result.get("saturn_step")
        if step is not None:
            info.steps_done = int(step)
        step_s = result.get("saturn_step_time_s")
        if step_s is not None and step_s > 0:
            info.measured_step_s = float(step_s)
            if info.current is not None:
                est = info.estimate(info.current[0], info.current[1])
                if est and abs(step_s - est) > OFF_ESTIMATE * est:
                    self._dirty = True
        self.metrics.task_progress(
            trial.trial_id, steps_done=info.steps_done, total_steps=info.total_steps, step_time_s=step_s
        )
        if decision != TrialScheduler.CONTINUE or not self._allow_moves or info.current is None:
            return decision
        if self._dirty or self._now() - self._plan_at >= self._replan_interval_s:
            self._replan("progress" if not self._dirty else "off estimate")
        new = self._planned(trial.trial_id)
        if new is not None and new != info.current and info.steps_done < info.total_steps:
            info.resize_to = new
            self.moves.append((trial.trial_id, info.current[:2], new[:2]))
            self.metrics.moved()
            logger.info("moving trial %s from %s to %s (checkpoint-restart)", trial.trial_id, info.current, new)
            return TrialScheduler.PAUSE
        return decision

    def on_trial_complete(self, tune_controller, trial: Trial, result: dict) -> None:
        self._base.on_trial_complete(tune_controller, trial, result)
        self._ended(trial, "finished")

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        self._base.on_trial_error(tune_controller, trial)
        self._ended(trial, "failed")

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        self._base.on_trial_remove(tune_controller, trial)
        self._ended(trial, "finished")

    def choose_trial_to_run(self, tune_controller) -> Trial | None:
        if getattr(tune_controller, "_reuse_actors", False):
            raise TuneIntegrationError(
                "SaturnScheduler needs reuse_actors=False in tune.TuneConfig (a cached actor keeps its GPUs)"
            )
        trials = {t.trial_id: t for t in tune_controller.get_trials()}
        # Paused trials (moved, or paused by the base scheduler) give their GPUs back.
        for tid, info in self._trials.items():
            t = trials.get(tid)
            if t is not None and t.status == Trial.PAUSED and info.current is not None:
                self._release(tid, "paused" if info.resize_to is None else "moved")
                info.resize_to = None
                self.metrics.task_state(tid, "queued")
        if self._dirty:
            self._replan("trials ended or paused")
        if self._plan is None:
            return None
        ledger = self._get_ledger()
        for a in sorted(self._plan.assignments, key=lambda a: (a.start_s, a.task)):
            t = trials.get(a.task)
            info = self._trials.get(a.task)
            if t is None or info is None or info.ended or info.current is not None or t.status != Trial.PAUSED:
                continue
            node = a.nodes[0]
            if ledger.free(node) < a.gpus:
                continue
            self._take(t, info, a.strategy, a.gpus, node)
            return t
        return None

    def debug_string(self) -> str:
        used = self._ledger.used() if self._ledger else 0
        total = self._ledger.cluster.total_gpus if self._ledger else 0
        plan = f"planned makespan {self._plan.makespan_s:.1f}s" if self._plan else "no plan yet"
        return f"(SaturnScheduler: {used}/{total} GPUs, {plan}, {len(self.moves)} moves) {self._base.debug_string()}"

    def save(self, checkpoint_path: str) -> None:
        from ray import cloudpickle

        with open(checkpoint_path, "wb") as f:
            cloudpickle.dump({k: v for k, v in self.__dict__.items() if k != "metrics"}, f)

    def restore(self, checkpoint_path: str) -> None:
        from ray import cloudpickle

        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(cloudpickle.load(f))
        self.metrics = RunMetrics(self.run_name)

    # ------------------------------------------------------------- internals
    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _get_ledger(self) -> _Ledger:
        if self._ledger is None:
            cluster = self._cluster or ClusterSpec.from_ray()
            self._ledger = _Ledger(cluster)
            self._node_ips = _unique_node_ips(cluster)
        return self._ledger

    def _rows_for(self, trial_id: str, config: Mapping[str, Any]) -> _TrialInfo:
        try:
            raw = list(self._estimate(config))
        except SaturnError:
            raise
        except Exception as exc:
            raise TuneIntegrationError(f"estimate(config) failed for trial {trial_id}: {exc!r}") from None
        rows, steps = [], set()
        for r in raw:
            missing = [k for k in ("strategy", "gpus", "step_time_s", "steps") if k not in r]
            if missing:
                raise TuneIntegrationError(f"estimate row {dict(r)!r} for trial {trial_id} lacks {', '.join(missing)}")
            if r["strategy"] not in tune_strategies() or int(r.get("nodes", 1)) != 1 or not r.get("feasible", True):
                continue
            if get_strategy(r["strategy"]).applies(None, int(r["gpus"])):
                continue  # e.g. single on 2 GPUs
            if not float(r["step_time_s"]) > 0 or int(r["steps"]) < 1:
                raise TuneIntegrationError(f"estimate row {dict(r)!r} for trial {trial_id}: step_time_s and steps > 0")
            knobs = r.get("knobs") or {}
            if isinstance(knobs, str):
                knobs = json.loads(knobs) if knobs else {}
            rows.append({"strategy": str(r["strategy"]), "gpus": int(r["gpus"]), "step_time_s": float(r["step_time_s"]),
                         "knobs": dict(knobs)})
            steps.add(int(r["steps"]))
        if not rows:
            raise TuneIntegrationError(
                f"trial {trial_id}: the estimate has no feasible single-node row with a registered strategy "
                f"({', '.join(tune_strategies())})"
            )
        if len(steps) != 1:
            raise TuneIntegrationError(f"trial {trial_id}: estimate rows disagree on steps ({sorted(steps)})")
        return _TrialInfo(rows=rows, total_steps=steps.pop(), arrived_s=self._now())

    def _replan(self, reason: str) -> None:
        ledger = self._get_ledger()
        live = {tid: i for tid, i in self._trials.items() if not i.ended and i.steps_done < i.total_steps}
        self._dirty = False
        self._plan_at = self._now()
        if not live:
            self._plan = None
            return
        rows, running = [], []
        for tid, info in live.items():
            remaining = info.total_steps - info.steps_done
            ratio = 1.0
            if info.current is not None and info.measured_step_s:
                est = info.estimate(info.current[0], info.current[1])
                ratio = info.measured_step_s / est if est else 1.0
            for r in info.rows:
                if r["gpus"] > max(n.gpus for n in ledger.cluster.nodes):
                    continue
                rows.append({"task": tid, "strategy": r["strategy"], "gpus": r["gpus"], "nodes": 1,
                             "step_time_s": r["step_time_s"] * ratio, "steps": remaining})
            if info.current is not None:
                strategy, gpus, node = info.current
                if not any(r["task"] == tid and r["strategy"] == strategy and r["gpus"] == gpus for r in rows):
                    rows.append({"task": tid, "strategy": strategy, "gpus": gpus, "nodes": 1,
                                 "step_time_s": info.measured_step_s or 1.0, "steps": remaining})
                running.append(RunningTask(tid, strategy, gpus, (node,), restart_s=self._restart_s,
                                           movable=self._allow_moves))
        from ray_saturn.solver import solve

        profile = ProfileTable.from_rows(rows, source="tune trials")
        plan = solve(profile, ledger.cluster, self._policy, context=PlanningContext(running=tuple(running)),
                     time_limit_s=self._time_limit_s)
        self._plan = plan
        self.plans.append(plan)
        if len(self.plans) > 1:
            self.metrics.replanned()
        self.metrics.plan_from(plan)
        logger.info("planned %d trials (%s): makespan %.1fs, lower bound %.1fs", len(live), reason,
                    plan.makespan_s, plan.lower_bound_s)

    def _planned(self, tid: str) -> tuple[str, int, str] | None:
        if self._plan is None:
            return None
        for a in self._plan.assignments:
            if a.task == tid:
                return (a.strategy, a.gpus, a.nodes[0])
        return None

    def _take(self, trial: Trial, info: _TrialInfo, strategy: str, gpus: int, node: str) -> None:
        from ray.tune.execution.placement_groups import PlacementGroupFactory

        bundle: dict[str, float] = {"CPU": self._cpus, "GPU": gpus}
        ip = self._node_ips.get(node)
        if ip:
            bundle[f"node:{ip}"] = 0.001
        trial.placement_group_factory = None
        trial.update_resources(PlacementGroupFactory([bundle], strategy="STRICT_PACK"))
        knobs = next((r["knobs"] for r in info.rows if r["strategy"] == strategy and r["gpus"] == gpus), {})
        trial.config["_saturn"] = {"strategy": strategy, "gpus": gpus, "knobs": knobs}
        trial.invalidate_json_state()
        info.current = (strategy, gpus, node)
        self._get_ledger().held[trial.trial_id] = (node, gpus)
        self.gpu_events.append(GpuEvent(self._now(), trial.trial_id, node, gpus, "start"))
        self.metrics.task_state(trial.trial_id, "running", gpus=gpus)
        logger.info("starting trial %s: %s on %d GPU(s) of %s", trial.trial_id, strategy, gpus, node)

    def _release(self, tid: str, reason: str) -> None:
        info = self._trials[tid]
        ledger = self._get_ledger()
        if tid in ledger.held:
            node, gpus = ledger.held.pop(tid)
            self.gpu_events.append(GpuEvent(self._now(), tid, node, -gpus, reason))
        info.current = None
        self._dirty = True

    def _ended(self, trial: Trial, state: str) -> None:
        info = self._trials.get(trial.trial_id)
        if info is None or info.ended:
            return
        info.ended = True
        if info.current is not None:
            self._release(trial.trial_id, state)
        self._dirty = True
        self.metrics.task_state(trial.trial_id, state)


def _unique_node_ips(cluster: ClusterSpec) -> dict[str, str]:
    """node name -> IP, when every node of the cluster has its own IP (else no pinning)."""
    if not all(n.node_id for n in cluster.nodes):
        return {}
    import ray

    ips = {info["NodeID"]: info.get("NodeManagerAddress") for info in ray.nodes() if info.get("Alive")}
    out = {n.name: ips.get(n.node_id) for n in cluster.nodes}
    values = [v for v in out.values() if v]
    if len(values) != len(cluster.nodes) or len(set(values)) != len(values):
        return {}
    return out
