"""SaturnScheduler: Tune's scheduler hooks driven by ray_saturn's control plane.

It wraps the user's scheduler (ASHA, MedianStoppingRule, FIFO, ...), which
keeps deciding *whether* a trial continues; the
:class:`~ray_saturn.control.Controller` that ``run`` and ``simulate`` use
decides *how* (strategy, GPU count, node) and *when*. The hooks turn Tune's
events into the controller's and its actions into Tune's:

=====================================  ==========================================
Tune                                    control plane
=====================================  ==========================================
``on_trial_add``                        the trial's rows join the run; ``TaskArrived``
``on_trial_result``                     progress (steps done, measured s/step)
``on_trial_complete`` (also ASHA stop)  ``TaskFinished``
``on_trial_error`` / ``on_trial_remove``  ``TaskFailed`` (final unless Tune retries it)
``Launch``                              the trial is released with a bundle of its
                                        GPUs on its node and ``config["_saturn"]``
``Stop`` (a move)                       ``PAUSE`` at its next result, then
                                        ``update_resources`` and a restart from its
                                        checkpoint on the new GPUs
=====================================  ==========================================

The move rule is the controller's: a running trial moves only when the
predicted gain exceeds the measured restart cost; if its target GPUs are
busy it waits for them held PAUSED, like a trial not started yet.
Re-planning never blocks a hook: the controller's solve calls return the
best cheap plan at once, and a background actor (a thread without Ray) runs
the full solver (:mod:`ray_saturn.tune._planner`). A hook does at most one
costly planning step (a re-plan, handing its input to the background, taking
a finished background plan in, applying it); the rest waits for the next
hook. Events are batched per Tune step (all trials a searcher adds
in one step are planned together).

Tune-only parts stay here: trials waiting for their GPUs are held as PAUSED
trials (no actor, no resources); a trial's GPUs count as free only once Tune
has really let them go (a moved trial is paused, a finished one ended), so a
launch waits for them. With ``reuse_actors=True`` Tune keeps a finished trial's
actor, with its bundle, for the next trial of the same bundle (the same GPU
count on the same node): that trial starts on it without a new actor, and any
other trial's bundle makes Tune end the kept actor in the same step. A launch
on a reused actor is not a measure of what a move costs (a move always starts
a new actor: it changes the trial's GPUs). A config that cannot
be estimated or placed errors that trial alone: it is released with no GPU
and ``config["_saturn"]["error"]``, which :func:`saturn_trainable` (and
:func:`trial_decision` in a trainable of your own) raises as its error.
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from ray_saturn.control import Controller, Launch, Stop, TaskArrived, TaskFailed, TaskFinished, TaskState, Tick
from ray_saturn.control.occupancy import Occupancy
from ray_saturn.control.replan import OFF_ESTIMATE
from ray_saturn.control.state import Placement
from ray_saturn.errors import SaturnError
from ray_saturn.metrics import RunMetrics
from ray_saturn.profile_table import ProfileTable
from ray_saturn.spec import ClusterSpec
from ray_saturn.tune._early_stops import EarlyStopModel, early_stop_model, rung_standing
from ray_saturn.tune._planner import START_ORDERS, BackgroundPlanner, same_decisions
from ray_saturn.tune._rows import TrialRejected, TrialRows, trial_rows

__all__ = ["GpuEvent", "Move", "SaturnScheduler", "SchedulerStats", "TuneIntegrationError"]

logger = logging.getLogger(__name__)

#: Key of ray_saturn's decision in a trial's config.
DECISION_KEY = "_saturn"
#: The least wall time between two re-plans (a hook re-plans at most once; a re-plan costs a quick plan).
HOOK_REPLAN_GAP_S = 0.25
#: An estimate call longer than this (ms) is warned about once: Tune's event loop waits for it.
SLOW_ESTIMATE_MS = 1000.0
#: Tune retries are Tune's to decide (FailureConfig); the controller never gives up on its own.
_NO_LIMIT = 10**9


class TuneIntegrationError(SaturnError, ValueError):
    """The Tune integration was set up or used wrongly (a bad argument, a base scheduler it cannot wrap, ...)."""


@dataclass(frozen=True)
class GpuEvent:
    """A change of the GPUs Tune holds for trials: ``gpus`` > 0 taken, < 0 given back."""

    time_s: float
    trial: str
    node: str
    gpus: int | float
    reason: str


@dataclass(frozen=True)
class Move:
    """A running trial moved (paused and restarted) from one placement to another."""

    time_s: float
    trial: str
    from_strategy: str
    from_gpus: int | float
    from_node: str
    to_strategy: str
    to_gpus: int | float
    to_node: str
    reason: str

    @property
    def changed_size(self) -> bool:
        return self.from_gpus != self.to_gpus

    def describe(self) -> str:
        return (
            f"{self.from_strategy} x{self.from_gpus} on {self.from_node} -> "
            f"{self.to_strategy} x{self.to_gpus} on {self.to_node} ({self.reason})"
        )


@dataclass
class SchedulerStats:
    """What the scheduler did and what its hooks cost (wall milliseconds).

    ``max_hook_ms`` is the longest call of a hook of Tune's event loop
    (``on_trial_add``/``_result``/``_complete``/``_error``/``_remove`` and
    ``choose_trial_to_run``), ``hook_ms`` the longest per hook; ``setup_ms``
    the one-off set-up in ``set_search_properties`` (before any trial: it
    starts the background planner). ``max_estimate_ms`` is the longest call of
    the user's ``estimate`` (inside ``on_trial_add``, so also in its hook time).
    ``hook_cpu_ms`` is, per hook, the CPU time of its longest call: what the
    scheduler computed (garbage collection included); the rest of that call's
    wall time the thread waited for a core (other processes, the GIL).
    ``hook_process_cpu_ms`` is, per hook, the CPU time of the whole driver
    process (every thread, Ray's included) during that same longest call: far
    above ``hook_cpu_ms``, other threads of the driver ran meanwhile (and may
    have held the GIL); close to it and far below the wall time, the process
    waited (for other processes, or on Ray).
    """

    trials: int
    rejected: int
    replans: int
    moves: int
    resizes_that_changed_size: int
    max_gpus_in_use: int | float
    restart_s: float
    max_hook_ms: float
    hook_ms: dict[str, float]
    setup_ms: float
    hook_calls: int
    planner: dict[str, float]
    max_estimate_ms: float = 0.0
    #: every measured launch latency (release to first result, less the steps trained), seconds,
    #: of launches that started a new actor (what the restart cost is measured from)
    launch_latencies_s: list[float] = field(default_factory=list)
    #: launches Tune made on a finished trial's actor (``reuse_actors=True``), and their latencies
    reused_actor_launches: int = 0
    reused_launch_latencies_s: list[float] = field(default_factory=list)
    hook_cpu_ms: dict[str, float] = field(default_factory=dict)
    hook_process_cpu_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass
class _TrialState:
    trial: Any
    config: dict[str, Any]
    rows: TrialRows | None = None
    rejected: str | None = None
    #: held | launching | running | stopping | ended (Tune's side of the trial)
    phase: str = "held"
    in_controller: bool = False
    placement: tuple[str, int | float, str] | None = None  # (strategy, gpus, node) while it holds GPUs
    steps_done: int = 0
    released_at: float | None = None
    steps_at_release: int = 0
    #: other trials whose launch overlapped this one's (released, no result yet)
    launch_crowd: int = 0
    pause_at: float | None = None
    warned_steps: bool = False
    #: result keys the trial reported values of that are no step count / step time (warned about once)
    bad_reports: set[str] = field(default_factory=set)
    paused_by_base: bool = False
    errors: list[str] = field(default_factory=list)
    #: the base scheduler's early stops for this trial (None: it is planned for all its steps)
    stops: EarlyStopModel | None = None
    #: the steps the controller plans it for, and its time_attr units per step (measured)
    horizon: int | None = None
    units_per_step: float | None = None


class SaturnScheduler(TrialScheduler):
    """Let ray_saturn choose each Tune trial's strategy, GPU count, node and start order.

    Args:
        estimate: ``config -> rows`` for the task a trial's config trains: a
            list of mappings (``strategy``, ``gpus``, ``step_time_s``,
            ``steps``; optional ``nodes``, ``feasible``, ``knobs``), of
            ``Config`` rows, or a :class:`~ray_saturn.ProfileTable` of that one
            task (see :mod:`ray_saturn.tune._rows` for how a config maps to
            profiled rows). Step times are seconds per optimizer step.
        base_scheduler: the early-stopping scheduler (e.g. ``ASHAScheduler``);
            default FIFO. It must stop trials, not pause them.
        cluster: the GPUs the trials may use; default: the connected Ray
            cluster's GPU nodes (``ClusterSpec.from_ray()``), read at the first trial.
        policy: the re-planning policy, as for ``ray_saturn.run``
            (``saturn-replan``, ``saturn-static``, ``saturn-periodic``, or a
            baseline such as ``fifo-min-gpus``).
        objective: what plans optimise, as for ``ray_saturn.run``:
            ``makespan`` (the search's end), ``completion`` (the trials' mean
            completion time) or ``online`` (completion within a few percent
            of the best makespan); see :mod:`ray_saturn.solver.objective`.
        restart_s: seconds a move costs until measured; from the first
            measurement on, the median measured restart (pause, actor start,
            checkpoint restore) is used: of the launches no other launch
            overlapped (a move restarts one trial), else of every launch.
        measure_restart: ``False`` keeps ``restart_s`` as the cost of every
            move (when you know it better than a few launches on a busy
            cluster can tell); the launches are still measured and reported
            in :meth:`stats`.
        expect_early_stops: plan each trial for the steps its base scheduler
            is expected to let it train (ASHA: to its next rung, past each
            later rung with probability 1 / reduction_factor, or by its rank
            at the last rung it passed; see
            :mod:`ray_saturn.tune._early_stops`), raised as it passes rungs;
            ``False`` plans every trial for all its steps.
        cpus_per_trial: CPUs in each trial's bundle besides its GPUs.
        solver_time_limit_s: time limit of each background solve.
        start_order: ``"searcher"`` (default): trials start in the order the
            search algorithm added them, as under plain Tune, and ray_saturn
            decides their GPUs, nodes and moves; ``"plan"``: in the order
            that shortens the plan (longest first). Under ASHA the first
            trials at a rung always go on, so a plan that starts the longest
            trials first lets them pass rungs they would not pass in the
            searcher's order (see :func:`~ray_saturn.tune._planner.in_arrival_order`).
            Objective ``makespan`` only: the completion objectives order by
            remaining work (``"plan"`` with another objective is refused).
        run_name: the ``run`` tag of the dashboard metrics.
        clock: seconds now (for tests); default ``time.monotonic``.

    Example:
        >>> from ray.tune.schedulers import ASHAScheduler
        >>> from ray_saturn.tune import SaturnScheduler
        >>> rows = lambda config: [
        ...     {"strategy": "single", "gpus": 1, "step_time_s": 0.2, "steps": 100},
        ...     {"strategy": "ddp", "gpus": 2, "step_time_s": 0.12, "steps": 100}]
        >>> scheduler = SaturnScheduler(rows, base_scheduler=ASHAScheduler(), cluster=None)
        >>> # tune.Tuner(saturn_trainable(make_task), param_space=...,
        >>> #            tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler)).fit()
    """

    #: A re-plan's input waits to be handed to the background (see ``_step``).
    _flush_due = False

    def __init__(
        self,
        estimate: Callable[[Mapping[str, Any]], Any],
        *,
        base_scheduler: TrialScheduler | None = None,
        cluster: ClusterSpec | None = None,
        policy: str = "saturn-replan",
        objective: str = "makespan",
        restart_s: float = 5.0,
        measure_restart: bool = True,
        expect_early_stops: bool = True,
        cpus_per_trial: float = 1.0,
        solver_time_limit_s: float = 0.5,
        start_order: str = "searcher",
        run_name: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__()
        from ray_saturn.control import get_replan_policy
        from ray_saturn.solver.objective import parse_objective

        if not callable(estimate):
            raise TuneIntegrationError("estimate must be a function config -> the rows of that config's task")
        # Numbers are finite (cpus_per_trial=inf asked Ray for a bundle no node has: the search hung) and
        # not booleans; flags are booleans (measure_restart="no" was read as True).
        _check_number("restart_s", restart_s, positive=False)
        _check_number("cpus_per_trial", cpus_per_trial, positive=False)
        _check_number("solver_time_limit_s", solver_time_limit_s, positive=True)
        for name, flag in (("measure_restart", measure_restart), ("expect_early_stops", expect_early_stops)):
            if not isinstance(flag, bool):
                raise TuneIntegrationError(f"{name} is {flag!r}; give True or False")
        if clock is not None and not callable(clock):
            raise TuneIntegrationError(f"clock is a {type(clock).__name__}; give a function () -> seconds, or None")
        if base_scheduler is not None and (not isinstance(base_scheduler, TrialScheduler)
                                           or isinstance(base_scheduler, SaturnScheduler)):
            raise TuneIntegrationError(
                f"base_scheduler is a {type(base_scheduler).__name__}; give a Tune scheduler such as "
                "ASHAScheduler() (a SaturnScheduler cannot wrap another), or None"
            )
        if cluster is not None and not isinstance(cluster, ClusterSpec):
            raise TuneIntegrationError(f"cluster is a {type(cluster).__name__}; give a ClusterSpec "
                                       "(ClusterSpec.uniform(nodes, gpus_per_node)) or None for Ray's own")
        if start_order not in START_ORDERS:
            raise TuneIntegrationError(f"start_order is {start_order!r}; choose one of: {', '.join(START_ORDERS)}")
        try:
            self._replan_policy = get_replan_policy(policy)
            self._objective = parse_objective(objective)
        except SaturnError as exc:
            raise TuneIntegrationError(str(exc)) from None
        if start_order == "plan" and self._objective != "makespan":
            # The completion objectives order trials by remaining work; the flag would be ignored.
            raise TuneIntegrationError(
                f"start_order='plan' applies to objective 'makespan' only; objective {self._objective!r} orders "
                "trials by their remaining work: leave start_order out, or give objective='makespan'"
            )
        self._estimate = estimate
        self._base = base_scheduler or FIFOScheduler()
        self._cluster = cluster
        self._restart_s = float(restart_s)
        self._measure_restart = bool(measure_restart)
        self._expect_early_stops = bool(expect_early_stops)
        self._cpus = float(cpus_per_trial)
        self._time_limit_s = float(solver_time_limit_s)
        self._clock = clock or time.monotonic
        self._t0: float | None = None
        self._ctl: Controller | None = None
        self._planner = BackgroundPlanner(
            time_limit_s=self._time_limit_s, allows_moves=self._replan_policy.allows_moves
        )
        self._planner.start_order = start_order
        self._trials: dict[str, _TrialState] = {}
        self._arrivals: list[str] = []
        self._ended: list[tuple[str, bool, str, bool]] = []  # (trial, finished, reason, retry)
        self._launches: dict[str, Launch] = {}
        self._warned_own_resources = False
        self._held: dict[str, tuple[str, int | float]] = {}  # trial -> (node, GPUs) Tune holds for it
        self._held_at: dict[str, Placement] = {}  # trial -> the placement (devices) Tune holds for it
        self._node_ids: dict[str, str] = {}
        self._latencies: list[float] = []
        self._reused_latencies: list[float] = []  # launches on a finished trial's actor (reuse_actors=True)
        self._actor_processes: set[tuple[Any, Any]] = set()  # (host, pid) of every trial actor seen
        self._alone_latencies: list[float] = []  # launches no other launch overlapped: what a move costs
        self._stop_costs: list[float] = []
        self._hook_ms: dict[str, float] = {}
        self._hook_cpu_ms: dict[str, float] = {}
        self._hook_process_cpu_ms: dict[str, float] = {}
        self._estimate_ms = 0.0
        self._setup_ms = 0.0
        self._hook_calls = 0
        self._max_in_use = 0
        self.run_name = run_name or f"tune-{uuid.uuid4().hex[:8]}"
        self.metrics = RunMetrics(self.run_name)
        #: Every change of the GPUs Tune holds for trials.
        self.gpu_events: list[GpuEvent] = []
        #: Every move made (a running trial paused and restarted elsewhere).
        self.moves: list[Move] = []
        from ray_saturn.strategies import strategy_names

        self._strategies = frozenset(strategy_names())
        _warm_up_solver()

    # ------------------------------------------------------------ public views
    @property
    def controller(self) -> Controller | None:
        """The control plane (``None`` until the first trial arrives)."""
        return self._ctl

    @property
    def plans(self) -> list:
        """Every re-plan record of the controller (reasons, solver time, moves decided)."""
        return list(self._ctl.replans) if self._ctl else []

    def stats(self) -> SchedulerStats:
        changed = sum(m.changed_size for m in self.moves)
        return SchedulerStats(
            trials=len(self._trials),
            rejected=sum(s.rejected is not None for s in self._trials.values()),
            replans=len(self._ctl.replans) if self._ctl else 0,
            moves=len(self.moves),
            resizes_that_changed_size=changed,
            max_gpus_in_use=self._max_in_use,
            restart_s=self._ctl.restart_s if self._ctl else self._restart_s,
            max_hook_ms=max(self._hook_ms.values(), default=0.0),
            hook_ms=dict(self._hook_ms),
            setup_ms=self._setup_ms,
            hook_calls=self._hook_calls,
            planner=self._planner.stats.to_dict(),
            max_estimate_ms=self._estimate_ms,
            launch_latencies_s=[round(x, 3) for x in self._latencies],
            reused_actor_launches=len(self._reused_latencies),
            reused_launch_latencies_s=[round(x, 3) for x in self._reused_latencies],
            hook_cpu_ms=dict(self._hook_cpu_ms),
            hook_process_cpu_ms=dict(self._hook_process_cpu_ms),
        )

    def close(self) -> None:
        """Stop the background planner (Tune does not tell a scheduler that the run ended)."""
        self._planner.close()

    # ------------------------------------------------------------ Tune hooks
    @property
    def metric(self):
        return getattr(self._base, "_metric", None)

    def set_search_properties(self, metric: str | None, mode: str | None, **spec) -> bool:
        # Tune calls this once, with Ray up, before any trial: start the background planner here, not in a hook.
        import ray

        if isinstance(spec.get("num_samples"), int) and spec["num_samples"] >= sys.maxsize:
            # Tune adds trials while fewer than its limit are PENDING, and every trial waiting for its
            # GPUs is held PAUSED: an endless searcher was asked for trials without end, none ran.
            raise TuneIntegrationError(
                "num_samples=-1 (sample until stopped) cannot be used with SaturnScheduler: every trial the "
                "searcher adds is held until the plan starts it, so Tune would add trials without end; "
                "give TuneConfig(num_samples=N)"
            )
        if ray.is_initialized():
            # A bundle no node can hold is never placed: Tune would wait for it for ever.
            check_fits_ray(self._cluster, self._cpus, ray.nodes())
        t0 = time.perf_counter()
        # The base scheduler first: if it refuses (Tune's metric/mode checks raise), no planner actor
        # is started, since Tune would never close this scheduler.
        accepted = self._base.set_search_properties(metric, mode, **spec)
        self._planner.start()
        self._setup_ms += 1000 * (time.perf_counter() - t0)
        return accepted

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        with self._hook("on_trial_add"):
            self._base.on_trial_add(tune_controller, trial)
            st = self._trials.get(trial.trial_id)
            if st is not None:  # Tune re-adds a trial it retries after an error: hold it again
                if st.phase != "ended" and trial.status == Trial.PENDING:
                    tune_controller._set_trial_status(trial, Trial.PAUSED)
                return
            if trial.status in (Trial.TERMINATED, Trial.ERROR):
                return
            config = {k: v for k, v in trial.config.items() if k != DECISION_KEY}
            st = _TrialState(trial, config)
            self._trials[trial.trial_id] = st
            self._now()  # the clock starts at the first trial
            self._warn_own_resources(trial)
            try:
                if DECISION_KEY in trial.config:  # a key of the user's: it would be overwritten at launch
                    raise TrialRejected(
                        f"its config has the key {DECISION_KEY!r}, where SaturnScheduler puts its decision; "
                        "rename that key in param_space"
                    )
                st.rows = trial_rows(
                    self._timed_estimate(config), max_gpus_per_node=self._max_gpus_per_node(),
                    registered=self._strategies, gpu_types=self._cluster_spec().gpu_types
                )
            except TrialRejected as exc:
                st.rejected = str(exc)
            except SaturnError:
                raise  # a set-up error (no cluster): the whole search is wrong, say so
            except Exception as exc:
                st.rejected = f"the estimate raised {type(exc).__name__}: {exc}"
            if self._expect_early_stops and st.rows is not None:
                st.stops = early_stop_model(self._base, trial.trial_id)
                st.horizon = st.stops.horizon_steps(0, 0, None, st.rows.steps) if st.stops else None
                self._set_extra_steps(st)
            # Held until the plan releases it: a PAUSED trial has no actor and no resources.
            trial.set_status(Trial.PAUSED)
            if st.rejected is not None:
                st.rejected = f"trial {trial.trial_id} (config {_short(config)}) cannot run: {st.rejected}"
                logger.warning("%s", st.rejected)
                st.phase = "launching"
            else:
                self._arrivals.append(trial.trial_id)
                self.metrics.task_state(trial.trial_id, "queued")

    def choose_trial_to_run(self, tune_controller) -> Trial | None:
        with self._hook("choose_trial_to_run"):
            now = self._now()
            self._observe_pauses(now)
            self._step(now)
            return self._release(tune_controller, now)

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        with self._hook("on_trial_result"):
            decision = self._base.on_trial_result(tune_controller, trial, result)
            st = self._trials.get(trial.trial_id)
            if st is None or st.phase not in ("running", "stopping") or not st.in_controller:
                return decision
            now = self._now()
            # What a trainable of the user's own reports may be anything: a value that is no step count
            # (or step time) is warned about once and left out, never an exception in Tune's loop.
            step = self._reported(st, result, "saturn_step", whole=True)
            step_time = self._reported(st, result, "saturn_step_time_s", whole=False)
            self._check_steps(st, self._reported(st, result, "saturn_total_steps", whole=True))
            if step is None:
                return decision
            if st.released_at is not None and step_time:
                # Launch to first result, less the steps it trained: the start-up a (re)launch costs.
                latency = max(0.0, now - st.released_at - (step - st.steps_at_release) * step_time)
                if self._on_reused_actor(result):
                    self._reused_latencies.append(latency)  # no actor start: not what a move costs
                else:
                    self._latencies.append(latency)
                    if st.launch_crowd == 0:
                        self._alone_latencies.append(latency)
                    self._update_restart_cost()
                st.released_at = None
            st.steps_done = step
            grew = self._update_horizon(st, result, step, decision)
            stopping = st.phase == "stopping"
            # While it waits to be paused, it still runs where it was: its speed is not the target's.
            self._step(now, progress=(trial.trial_id, step, None if stopping else step_time), replan=grew)
            total = st.rows.steps if st.rows else math.inf
            if decision == TrialScheduler.PAUSE and st.phase == "running":
                st.paused_by_base = True  # its GPUs come back once paused; it waits to be planned again
            if st.phase == "stopping" and decision == TrialScheduler.CONTINUE and step < total:
                st.pause_at = now
                return TrialScheduler.PAUSE
            return decision

    def on_trial_complete(self, tune_controller, trial: Trial, result: dict) -> None:
        with self._hook("on_trial_complete"):
            self._base.on_trial_complete(tune_controller, trial, result)
            self._trial_ended(trial, finished=True, reason="completed")

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        with self._hook("on_trial_error"):
            self._base.on_trial_error(tune_controller, trial)
            # Tune marks a trial it will retry ERROR before telling the scheduler; a final error comes first.
            retry = trial.status == Trial.ERROR
            self._trial_ended(trial, finished=False, reason="the trial raised an error", retry=retry)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        with self._hook("on_trial_remove"):
            self._base.on_trial_remove(tune_controller, trial)
            self._trial_ended(trial, finished=False, reason="removed by Tune")

    def debug_string(self) -> str:
        used = sum(g for _, g in self._held.values())
        total = self._ctl.cluster().total_gpus if self._ctl else 0
        running = ", ".join(f"{tid}: {p[0]}x{p[1]}" for tid, st in sorted(self._trials.items()) if (p := st.placement))
        waiting = sum(st.phase in ("held", "launching") and st.rejected is None for st in self._trials.values())
        return (
            f"SaturnScheduler: {used}/{total} GPUs in use, {waiting} trial(s) waiting for GPUs (shown PAUSED), "
            f"{len(self.moves)} move(s); running {running or 'none'}. {self._base.debug_string()}"
        )

    def save(self, checkpoint_path: str) -> None:
        raise NotImplementedError(
            "SaturnScheduler cannot be checkpointed yet: restoring a Tune experiment would lose which trial "
            "holds which GPUs; start the search again"
        )

    def restore(self, checkpoint_path: str) -> None:
        raise NotImplementedError("SaturnScheduler cannot be restored from a checkpoint; start the search again")

    # ------------------------------------------------------------ control plane
    def _now(self) -> float:
        if self._t0 is None:
            self._t0 = self._clock()
        return self._clock() - self._t0

    def _cluster_spec(self) -> ClusterSpec:
        if self._cluster is None:
            self._cluster = ClusterSpec.from_ray()
        return self._cluster

    def _max_gpus_per_node(self) -> int:
        return max(n.gpus for n in self._cluster_spec().nodes)

    def _step(
        self, now: float, progress: tuple[str, int, float | None] | None = None, replan: str | None = None
    ) -> None:
        """Hand the batched events (and a progress report) to the controller and execute its actions."""
        events = []
        if self._arrivals:
            arrived, self._arrivals = self._arrivals, []
            rows = ProfileTable.from_rows(
                [r for tid in arrived for r in self._trials[tid].rows.to_rows(tid)], source="tune trials"
            )
            if self._ctl is None:
                self._ctl = self._make_controller(rows)
            else:
                self._ctl.add_tasks(rows)
            for tid in arrived:
                st = self._trials[tid]
                st.in_controller = True
                if st.horizon is not None:
                    self._ctl.set_total_steps(tid, st.horizon)
                events.append(TaskArrived(time_s=now, task=tid))
        if self._ended:
            ended, self._ended = self._ended, []
            events.extend(ev for e in ended if (ev := self._end_event(now, *e)) is not None)
        if self._ctl is None:
            return
        ctl = self._ctl
        replans = len(ctl.replans)
        actions = ctl.handle(*events) if events else []
        if progress is not None:
            actions += ctl.report_progress(progress[0], progress[1], now, progress[2])
        if replan is not None:
            actions += ctl.request_replan(now, replan)
        wake = ctl.next_wakeup_s()
        if wake is not None and now >= wake:
            actions += ctl.handle(Tick(time_s=now))
        # At most one costly planning step per hook (each a few ms; together they made the longest
        # hooks): a re-plan, handing its input to the background, taking a finished background plan
        # in, or applying it. What is left waits for the next hook; Tune calls choose_trial_to_run
        # many times a second.
        if len(ctl.replans) > replans:
            self._flush_due = True  # solve the newest state in the background, from the next hook
            newest = None
        elif self._flush_due:
            self._flush_due = False
            self._planner.flush()
            newest = None
        elif self._planner.receive():
            newest = None  # taken in (unpickled) in this hook: applied in the next
        else:
            newest = self._planner.newest if self._planner.fresh else None
        if newest is not None and (ctl.done or (ctl.plan is not None and same_decisions(newest, ctl.plan))):
            self._planner.consume(applied=False)  # nothing to change
        elif newest is not None:
            self._planner.refine = False
            try:
                before = len(ctl.replans)
                actions += ctl.request_replan(now, "a plan finished in the background")
                if len(ctl.replans) > before:
                    self._planner.consume()
            finally:
                self._planner.refine = True
        self._execute(actions, now)
        if len(ctl.replans) > replans:
            plan = ctl.plan
            if plan is not None:
                self.metrics.plan(planned_makespan_s=now + plan.makespan_s, lower_bound_s=now + plan.lower_bound_s)
            self.metrics.replanned(len(ctl.replans) - replans)

    def _make_controller(self, rows) -> Controller:
        from ray_saturn.runtime.config import DriverConfig

        run = DriverConfig()  # the re-planning rate limits of ray_saturn.run
        return Controller(
            rows,
            self._cluster_spec(),
            self._replan_policy,
            restart_s=self._restart_s,
            solver_time_limit_s=self._time_limit_s,
            # At most one re-plan per hook: the ones asked for in the same hook wait for the next one.
            min_replan_gap_s=max(run.min_replan_gap_s, HOOK_REPLAN_GAP_S),
            drift_replan_gap_s=run.drift_replan_gap_s,
            drift_replan_gap_fraction=run.drift_replan_gap_fraction,
            min_reports=run.min_reports,
            max_failures=_NO_LIMIT,
            solve=self._planner,
            objective=self._objective,
            relocations=False,  # a move is a pause and a resize: one that keeps the trial's GPUs is churn
        )

    def _end_event(self, now: float, tid: str, finished: bool, reason: str, retry: bool):
        st = self._trials[tid]
        if not st.in_controller or self._ctl is None:
            return None
        p = self._ctl.state(tid)
        if finished and p.can_finish:
            return TaskFinished(time_s=now, task=tid)  # also one the base scheduler stopped while it was moved
        if p.state in (TaskState.RUNNING, TaskState.QUEUED):
            return TaskFailed(time_s=now, task=tid, reason=reason, steps_done=st.steps_done, final=not retry)
        return None

    def _execute(self, actions: Sequence[Launch | Stop], now: float) -> None:
        for a in actions:
            st = self._trials[a.task]
            if isinstance(a, Stop):
                self._launches.pop(a.task, None)
                if st.phase == "running":
                    st.phase = "stopping"
                    strategy, gpus, node = st.placement
                    t = a.target
                    move = Move(now, a.task, strategy, gpus, node, t.strategy, t.gpus, t.nodes[0], a.reason)
                    self.moves.append(move)
                    self.metrics.moved()
                    logger.info("moving trial %s: %s", a.task, move.describe())
                elif st.phase == "launching":
                    st.phase = "held"
            else:
                self._launches[a.task] = a
                if st.phase == "held":
                    st.phase = "launching"

    # ------------------------------------------------------------ Tune side
    def _observe_pauses(self, now: float) -> None:
        """Trials paused for a move give their GPUs back once Tune has really paused them."""
        for tid, st in self._trials.items():
            if st.paused_by_base and st.phase == "running" and st.trial.status == Trial.PAUSED:
                # The base scheduler paused it: its GPUs are free, and it waits in the queue to be planned again.
                st.paused_by_base = False
                self._give_back(tid, "paused", now)
                st.released_at = None
                st.phase = "held"
                self._ended.append((tid, False, f"paused by {type(self._base).__name__}", True))
                continue
            if st.phase == "stopping" and st.trial.status == Trial.PAUSED:
                if st.pause_at is not None:
                    self._stop_costs.append(now - st.pause_at)
                    st.pause_at = None
                self._give_back(tid, "moved", now)
                st.released_at = None
                st.phase = "launching" if tid in self._launches else "held"
                self.metrics.task_state(tid, "queued")

    def _release(self, tune_controller, now: float) -> Trial | None:
        """Release every trial whose launch fits the GPUs Tune has free now; Tune starts them all."""
        ready: list[Trial] = []
        for st in self._trials.values():
            if st.phase == "launching" and st.rejected is not None:
                self._prepare(st, {DECISION_KEY: {"error": st.rejected}}, {"CPU": self._cpus or 0.01})
                st.phase = "running"
                ready.append(st.trial)
        occupancy = self._occupancy()
        for launch in sorted(self._launches.values(), key=lambda a: (a.planned_start_s, a.task)):
            st = self._trials[launch.task]
            pl = launch.placement
            node, gpus = pl.nodes[0], pl.gpus
            if st.phase != "launching":
                continue
            # Only once Tune has let go of the devices the controller gave it (a share: its part of one).
            got = occupancy.fit(pl)
            if got is None or (pl.devices is not None and got.devices != pl.devices):
                continue
            occupancy.take(got)
            del self._launches[launch.task]
            knobs = st.rows.knobs(pl.strategy, gpus, pl.gpu_type) if st.rows else {}
            decision = {"strategy": pl.strategy, "gpus": gpus, "knobs": knobs, "node": node}
            if pl.gpu_type is not None:
                decision["gpu_type"] = pl.gpu_type
            if pl.devices is not None:
                decision["devices"] = [d for d, _ in pl.device_map()[node]]
            # A share 1/k of one GPU is Ray's fractional GPU resource: up to k such trials share the device.
            bundle: dict[str, Any] = {"CPU": self._cpus, "GPU": gpus}
            self._prepare(st, {DECISION_KEY: decision}, bundle, node)
            st.phase, st.placement = "running", (launch.placement.strategy, gpus, node)
            in_flight = [o for o in self._trials.values() if o.released_at is not None and o is not st]
            for o in in_flight:
                o.launch_crowd += 1
            # It resumes from its newest checkpoint: a moved trial trains on until Tune pauses it, past the
            # step the controller's launch was decided at (counting those steps would make its start-up 0).
            resume_at = max(launch.steps_done, st.steps_done)
            st.released_at, st.steps_at_release, st.launch_crowd = now, resume_at, len(in_flight)
            self._held[launch.task] = (node, gpus)
            self._held_at[launch.task] = pl
            self.gpu_events.append(GpuEvent(now, launch.task, node, gpus, "start"))
            self._max_in_use = max(self._max_in_use, sum(g for _, g in self._held.values()))
            self.metrics.task_state(launch.task, "running", gpus=gpus)
            logger.info("starting trial %s: %s on %g GPU(s) of %s", launch.task, decision["strategy"], gpus, node)
            ready.append(st.trial)
        if not ready:
            return None
        for trial in ready[:-1]:  # Tune starts PENDING trials itself; the last one is returned
            tune_controller._set_trial_status(trial, Trial.PENDING)
        return ready[-1]

    def _prepare(self, st: _TrialState, decision: dict, bundle: dict, node: str | None = None) -> None:
        from ray.tune.execution.placement_groups import PlacementGroupFactory

        kwargs: dict[str, Any] = {}
        node_id = self._node_id(node) if node else None
        if node_id:
            kwargs["bundle_label_selector"] = [{"ray.io/node-id": node_id}]
        st.trial.update_resources(PlacementGroupFactory([bundle], strategy="STRICT_PACK", **kwargs))
        st.trial.config.update(decision)
        st.trial.invalidate_json_state()

    def _node_id(self, node: str) -> str | None:
        if not self._node_ids:
            self._node_ids = {n.name: n.node_id for n in self._cluster_spec().nodes if n.node_id}
        return self._node_ids.get(node)

    def _occupancy(self) -> Occupancy:
        """The devices Tune holds for trials now (the controller's rule: shares add up per device)."""
        return Occupancy({n.name: n.gpus for n in self._cluster_spec().nodes}, self._held_at.values())

    def _give_back(self, tid: str, reason: str, now: float) -> None:
        held = self._held.pop(tid, None)
        self._held_at.pop(tid, None)
        if held is not None:
            self.gpu_events.append(GpuEvent(now, tid, held[0], -held[1], reason))
        self._trials[tid].placement = None

    def _trial_ended(self, trial: Trial, *, finished: bool, reason: str, retry: bool = False) -> None:
        st = self._trials.get(trial.trial_id)
        if st is None or st.phase == "ended":
            return
        now = self._now()
        self._give_back(trial.trial_id, "finished" if finished else ("retried" if retry else "ended"), now)
        self._launches.pop(trial.trial_id, None)
        st.released_at = None  # no longer launching (if it never reported)
        st.phase = "held" if retry else "ended"
        if st.rejected is not None:
            st.phase = "launching" if retry else "ended"  # a retry is rejected again, at once
            return
        if trial.trial_id in self._arrivals:  # it never reached the controller
            self._arrivals.remove(trial.trial_id)
            return
        self._ended.append((trial.trial_id, finished, reason, retry))
        if not retry:
            self.metrics.task_state(trial.trial_id, "finished" if finished else "failed")

    def _warn_own_resources(self, trial: Trial) -> None:
        """Once per search: the trainable asks for GPUs of its own (``tune.with_resources``), which the
        plan's bundle replaces."""
        if self._warned_own_resources:
            return
        pgf = getattr(trial, "placement_group_factory", None)
        bundles = getattr(pgf, "bundles", None) or []
        gpus = sum(float(b.get("GPU", 0)) for b in bundles)
        if gpus > 0:
            self._warned_own_resources = True
            logger.warning(
                "trial %s asks for %g GPU(s) of its own (tune.with_resources or resources_per_trial); "
                "SaturnScheduler decides each trial's GPUs and node and replaces them with its planned bundle "
                "(give the GPU counts a config can use as rows of the estimate instead)", trial.trial_id, gpus,
            )

    def _reported(self, st: _TrialState, result: Mapping[str, Any], key: str, *, whole: bool) -> Any:
        """``result[key]`` as a step count >= 0 (``whole``) or a step time > 0, finite; else ``None``
        (warned about once per trial and key)."""
        value = result.get(key)
        if value is None:
            return None
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        if ok and whole:
            ok = value >= 0 and value == int(value)
        elif ok:
            ok = value > 0
        if ok:
            return int(value) if whole else float(value)
        if key not in st.bad_reports:
            st.bad_reports.add(key)
            want = "a whole number of steps >= 0" if whole else "seconds per step > 0"
            logger.warning(
                "trial %s reported %s=%r, not %s; ray_saturn leaves it out of the trial's progress (report it as "
                "saturn_trainable does, or not at all)", st.trial.trial_id, key, value, want,
            )
        return None

    def _check_steps(self, st: _TrialState, total: Any) -> None:
        if st.warned_steps or total is None or st.rows is None:
            return
        st.warned_steps = True
        if int(total) != st.rows.steps:
            logger.warning(
                "trial %s (config %s): the estimate says %d steps but its task runs %d (max_steps); "
                "the plan assumes %d: make the estimate's steps the task's max_steps",
                st.trial.trial_id,
                _short(st.config),
                st.rows.steps,
                int(total),
                st.rows.steps,
            )

    def _update_horizon(self, st: _TrialState, result: Mapping[str, Any], step: int, decision: str) -> str | None:
        """Raise (or lower) the steps the trial is planned for by the rungs it has passed; the reason
        to re-plan when its horizon grew."""
        if st.stops is None or st.rows is None or self._ctl is None:
            return None
        t = result.get(st.stops.time_attr)
        if not isinstance(t, int | float) or isinstance(t, bool) or not math.isfinite(t):
            return None
        if step > 0 and t > 0:
            st.units_per_step = float(t) / step
        if decision == TrialScheduler.STOP:
            return None  # it ends now: its finish tells the controller
        standing = rung_standing(self._base, st.trial.trial_id)
        horizon = st.stops.horizon_steps(float(t), step, st.units_per_step, st.rows.steps, standing)
        if horizon == st.horizon:
            return None
        # It grows at a rung it passes, and between rungs as its standing at the last one firms up: only a
        # growth past the off-estimate tolerance is worth a new plan.
        grew = st.horizon is not None and horizon > st.horizon * (1 + OFF_ESTIMATE)
        st.horizon = horizon
        self._ctl.set_total_steps(st.trial.trial_id, horizon)
        self._set_extra_steps(st)
        if grew:
            return f"{st.trial.trial_id} passed a rung of {type(self._base).__name__} ({st.stops.time_attr}={t:g})"
        return None

    def _set_extra_steps(self, st: _TrialState) -> None:
        """Tell the planner how many steps past its horizon the trial may train (all of its steps if
        the base scheduler keeps it): near-equal plans are ranked by when its end would be then."""
        tid = st.trial.trial_id
        if st.horizon is None or st.rows is None:
            self._planner.extra_steps.pop(tid, None)
        else:
            self._planner.extra_steps[tid] = max(0, st.rows.steps - st.horizon)

    def _on_reused_actor(self, result: Mapping[str, Any]) -> bool:
        """Whether a (re)launch's first result came from the process of an actor an earlier trial ran in
        (Tune's ``reuse_actors=True``): Tune fills every result's ``pid`` and ``hostname``."""
        pid = result.get("pid")
        if pid is None:
            return False
        key = (result.get("hostname") or result.get("node_ip"), pid)
        seen = key in self._actor_processes
        self._actor_processes.add(key)
        return seen

    def _update_restart_cost(self) -> None:
        if not self._measure_restart:
            return
        if not (self._alone_latencies or self._latencies):
            return
        # A move restarts one trial; a mass start (every trial of a search's first plan at once) is slower.
        cost = statistics.median(self._alone_latencies or self._latencies)
        if self._stop_costs:
            cost += statistics.median(self._stop_costs)
        if self._ctl is not None:
            self._ctl.set_restart_cost(cost)

    def _timed_estimate(self, config: Mapping[str, Any]) -> Any:
        """The user's estimate for ``config``; one warning the first time a call holds Tune's loop too long."""
        t0 = time.perf_counter()
        try:
            return self._estimate(config)
        finally:
            ms = 1000 * (time.perf_counter() - t0)
            if ms > SLOW_ESTIMATE_MS and self._estimate_ms <= SLOW_ESTIMATE_MS:
                logger.warning(
                    "the estimate for config %s took %.1f s inside Tune's on_trial_add, and Tune's event loop waited "
                    "for it: measure or load what it needs before Tuner.fit() and let estimate only look it up",
                    _short(dict(config)), ms / 1000,
                )
            self._estimate_ms = max(self._estimate_ms, ms)

    @contextlib.contextmanager
    def _hook(self, name: str) -> Iterator[None]:
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        try:
            yield
        finally:
            ms = 1000 * (time.perf_counter() - t0)
            self._hook_calls += 1
            if ms > self._hook_ms.get(name, 0.0):
                self._hook_ms[name] = ms
                self._hook_cpu_ms[name] = 1000 * (time.thread_time() - c0)
                self._hook_process_cpu_ms[name] = 1000 * (time.process_time() - p0)


def check_fits_ray(cluster: ClusterSpec | None, cpus_per_trial: float, ray_nodes: Sequence[Mapping[str, Any]]) -> None:
    """Raise :class:`TuneIntegrationError` when a trial's bundle could never be placed on the Ray cluster
    (``ray.nodes()``): ``cpus_per_trial`` more CPUs than any GPU node has, or a node of an explicit
    ``cluster`` with more GPUs than any Ray node (or a ``node_id`` no alive Ray node has)."""
    alive = [n for n in ray_nodes if n.get("Alive")]
    res = {n.get("NodeID"): n.get("Resources") or {} for n in alive}
    gpu_nodes = [r for r in res.values() if r.get("GPU", 0) > 0]
    if gpu_nodes and cpus_per_trial > 0:
        most = max(r.get("CPU", 0) for r in gpu_nodes)
        if cpus_per_trial > most:
            raise TuneIntegrationError(
                f"cpus_per_trial is {cpus_per_trial:g}, but no GPU node of the Ray cluster has more than {most:g} "
                f"CPUs: no trial could ever start; give cpus_per_trial <= {most:g}"
            )
    if cluster is None:
        return
    most_gpus = max((r.get("GPU", 0) for r in res.values()), default=0)
    for node in cluster.nodes:
        if node.node_id:
            have = res.get(node.node_id)
            if have is None:
                raise TuneIntegrationError(
                    f"cluster node {node.name!r} has node_id {node.node_id[:12]}..., which no alive node of the "
                    "Ray cluster has; pass cluster=None (Ray's own nodes) or ClusterSpec.from_ray()"
                )
            gpus = have.get("GPU", 0)
        else:
            gpus = most_gpus
        if node.gpus > gpus:
            where = "that Ray node has" if node.node_id else "the largest Ray node has"
            raise TuneIntegrationError(
                f"cluster node {node.name!r} has {node.gpus} GPUs but {where} {gpus:g}: trials planned on it "
                "could never start; pass cluster=None (Ray's own nodes) or a ClusterSpec Ray's nodes can hold"
            )


def _check_number(name: str, value: Any, *, positive: bool) -> None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not (ok and (value > 0 if positive else value >= 0)):
        raise TuneIntegrationError(f"{name} is {value!r}; it must be a finite number {'> 0' if positive else '>= 0'}")


def _warm_up_solver() -> None:
    """One tiny plan, so the solver's imports (the LP of the lower bound) are not paid in a hook."""
    from ray_saturn.profile_table import ProfileTable
    from ray_saturn.solver import solve

    rows = [{"task": "warm-up", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 1}]
    solve(ProfileTable.from_rows(rows), ClusterSpec.uniform(1, 1), time_limit_s=1e-3)


def _short(config: Mapping[str, Any], limit: int = 160) -> str:
    text = repr(dict(config))
    return text if len(text) <= limit else text[: limit - 3] + "..."
