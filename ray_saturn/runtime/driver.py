"""The driver: an explicit state machine that executes a plan and keeps it current.

States (one small class each; :meth:`Driver.step` runs one iteration)::

    Planning --> Launching --> Running --> Replanning --> Moving --> Launching ...
                                  |                                     |
                                  +--> Finished / Failed <--------------+

- :class:`Planning`: the control plane makes the first plan and says what to
  launch now.
- :class:`Launching`: every pending launch whose GPUs the ledger can give is
  reserved (placement-group hold) and, once the hold is placed, launched.
- :class:`Running`: polls the launcher; progress goes to the control plane
  (which flags tasks >10% off their estimate), exits, node changes and
  wake-ups are collected as events.
- :class:`Replanning`: the collected events go to the control plane, which
  re-plans when they call for it and answers with stops (moves) and launches.
- :class:`Moving`: moved tasks are checkpointed and stopped; their GPUs come
  back to the ledger when they have exited.
- :class:`Finished` / :class:`Failed`: terminal.

The decisions (when to re-plan, what the solver is given, whether a move
pays for its restart, what to launch now) are the control plane's
(:class:`ray_saturn.control.controller.Controller`), the same objects the
simulator runs on its clock. The driver does what only a runtime can:
reserve GPUs, launch and stop segments, measure, persist, log.

Clock: the driver works in *profile seconds* since the run started,
``(wall - start) / time_scale`` (``time_scale`` is 1 except in emulation).

Example:
    >>> from ray_saturn import ProfileTable, ClusterSpec
    >>> from ray_saturn.runtime.fake import FakeLauncher, LedgerManager
    >>> import tempfile
    >>> prof = ProfileTable.from_rows([
    ...     {"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10}])
    >>> cluster = ClusterSpec.uniform(1, 1)
    >>> d = Driver(prof, LedgerManager(cluster), FakeLauncher(), RunStorage(tempfile.mkdtemp()),
    ...            DriverConfig(solver_time_limit_s=1))
    >>> d.run().state
    'finished'
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ray_saturn.control.state import Placement, Segment, TaskState
from ray_saturn.errors import SaturnError
from ray_saturn.profile_table import ProfileTable
from ray_saturn.runtime.config import DriverConfig
from ray_saturn.runtime.journal import EVENTS_FILE, STATE_FILE, Journal, RunFolderUnwritable
from ray_saturn.runtime.launcher import Exited, Launcher, LaunchSpec, Progress, Started
from ray_saturn.runtime.ledger import LedgerError
from ray_saturn.runtime.records import DriverResult, TaskRecord
from ray_saturn.runtime.storage import RunStorage

__all__ = [
    "EVENTS_FILE",
    "STATE_FILE",
    "Driver",
    "DriverConfig",
    "DriverResult",
    "Failed",
    "Finished",
    "Launching",
    "Moving",
    "Planning",
    "Replanning",
    "Running",
    "TaskRecord",
]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------- states
class DriverState(ABC):
    """One state of the driver; :meth:`step` does one iteration and returns the next state."""

    name: ClassVar[str]
    terminal: ClassVar[bool] = False

    @abstractmethod
    def step(self, d: Driver) -> DriverState: ...

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


class Planning(DriverState):
    name = "planning"

    def step(self, d: Driver) -> DriverState:
        if d.controller.done:
            return Finished()
        d.launcher.prepare()
        d.restart_clock(at=d.clock_origin_s)
        t = d.now()
        actions = d.controller.start(t, arrived=d.arrived_by(t))
        # The clock stands still while the first plan is solved (its time is reported apart).
        d.restart_clock(at=t)
        d.execute(actions)
        d.after_control()
        return Moving() if d.stopping else Launching()


class Launching(DriverState):
    name = "launching"

    def step(self, d: Driver) -> DriverState:
        d.start_ready_launches()
        # Every parked worker group has been through the control plane by now (its finish is
        # re-planned before the next launch pass): the ones no launch claimed end, freeing their GPUs.
        d.launcher.release_parked()
        return Running()


class Running(DriverState):
    name = "running"

    def step(self, d: Driver) -> DriverState:
        d.pump(d.config.poll_wall_s)
        if d.inbox:
            return Replanning()
        if d.stopping:
            return Moving()
        if d.controller.done and not d.active_segments() and d.all_arrived():
            return Finished()
        if d.pending_launches():
            return Launching()
        return self


class Replanning(DriverState):
    name = "replanning"

    def step(self, d: Driver) -> DriverState:
        events, d.inbox = d.inbox, []
        d.execute(d.controller.handle(*events))
        d.after_control()
        if d.stopping:
            return Moving()
        return Launching()


class Moving(DriverState):
    name = "moving"

    def step(self, d: Driver) -> DriverState:
        if d.stopping:
            d.pump(d.config.poll_wall_s)
            # Launches whose GPUs are free need not wait for the moves to finish.
            d.start_ready_launches()
        if d.stopping:
            return self
        return Replanning() if d.inbox else Launching()


class Finished(DriverState):
    name = "finished"
    terminal = True

    def step(self, d: Driver) -> DriverState:
        return self


@dataclass
class Failed(DriverState):
    reason: str = ""
    name: ClassVar[str] = "failed"
    terminal: ClassVar[bool] = True

    def step(self, d: Driver) -> DriverState:
        return self


# ---------------------------------------------------------------- driver
class Driver:
    """Executes a run with a placement manager, a launcher and the control plane.

    Args:
        profile: the profile of every task (total steps, profiled step times).
        manager: a :class:`~ray_saturn.runtime.pg_manager.PlacementGroupManager`
            (or the Ray-free :class:`~ray_saturn.runtime.fake.LedgerManager`).
        launcher: starts and stops segments.
        storage: the run folder.
        config: run settings.
        records: task records persisted by an earlier driver of this run
            (resume): finished and failed tasks are not re-run, others restart
            from their latest checkpoint.
        clock_offset_s: driver-clock time already spent (resume).
        arrivals: driver-clock time at which a task arrives (default: all at
            the start); each arrival is an event the control plane re-plans on.

    Each record's state is the controller's (see
    :mod:`ray_saturn.runtime.records`); progress is counted in the task's
    absolute steps everywhere (the controller starts from the steps a
    resumed task has already done).
    """

    def __init__(
        self,
        profile: ProfileTable,
        manager: Any,
        launcher: Launcher,
        storage: RunStorage,
        config: DriverConfig | None = None,
        *,
        records: Mapping[str, TaskRecord] | None = None,
        clock_offset_s: float = 0.0,
        planned_makespan_s: float | None = None,
        counters: Mapping[str, int] | None = None,
        arrivals: Mapping[str, float] | None = None,
    ) -> None:
        from ray_saturn.control.controller import Controller

        self.config = config or DriverConfig()
        self.profile = profile
        self.manager = manager
        self.launcher = launcher
        self.storage = storage
        self.journal = Journal(storage)
        self._t0 = launcher.now()
        self._offset = float(clock_offset_s)
        self.clock_origin_s = float(clock_offset_s)
        self.records: dict[str, TaskRecord] = {}
        steps_done: dict[str, int] = {}
        failed: dict[str, str] = {}
        old = dict(records or {})
        for t in profile.tasks:
            total = max(c.steps for c in profile.configs(t))
            rec = old.get(t) or TaskRecord(t, total)
            self.records[t] = rec
            if t not in old:
                continue
            # Resume: finished and failed tasks stay so; the others continue from their checkpoint.
            if rec.state == "finished":
                steps_done[t] = rec.total_steps
                continue
            if rec.state == "failed":
                failed[t] = rec.reason or "failed before the driver restarted"
                continue
            ck = min(rec.total_steps, launcher.checkpointed_step(storage.task_dir(t)))
            rec.checkpointed_step = ck
            rec.steps_done = ck
            rec.waiting = False
            if rec.current is not None:  # the segment died with the previous driver
                seg = rec.current
                seg.end_s, seg.status, seg.steps_end = self._offset, "interrupted", ck
                seg.reason = "the driver stopped"
            steps_done[t] = ck
        self.controller = Controller(
            profile,
            manager.ledger.cluster(),
            self.config.policy,
            restart_s=self.config.restart_s,
            solver_time_limit_s=self.config.solver_time_limit_s,
            seed=self.config.seed,
            min_replan_gap_s=self.config.min_replan_gap_s,
            drift_replan_gap_s=self.config.drift_replan_gap_s,
            drift_replan_gap_fraction=self.config.drift_replan_gap_fraction,
            min_reports=self.config.min_reports,
            max_failures=self.config.max_failures,
            steps_done=steps_done,
            failed=failed,
            objective=self.config.objective,
            solver_gap=self.config.solver_gap,
            backfill=self.config.backfill,
        )
        for t, rec in self.records.items():
            rec.progress = self.controller.state(t)  # one task state: the controller's
        self.state: DriverState = Planning()
        self.inbox: list[Any] = []
        self.stopping: dict[str, Any] = {}
        self._pending: dict[str, Any] = {}
        self._attempt: dict[str, int] = {}
        self._latencies: list[float] = []
        self._reused: set[str] = set()  # tasks booked onto parked workers, until launched
        self._reused_segments: set[tuple[str, int]] = set()  # (task, attempt) launched onto them
        self._stop_costs: list[float] = []
        self._log_seen = 0
        self._last_node_check = -math.inf
        self._last_persist = -math.inf
        self._failed_seen: set[str] = set(failed)
        #: The makespan of the first plan made once every task had arrived (a resumed run keeps its own);
        #: plans made before that knew only some of the tasks.
        self.planned_makespan_s = planned_makespan_s
        self._planned_knows_all = planned_makespan_s is not None
        counters = counters or {}
        self._replans0 = int(counters.get("replans", 0))
        self._moves0 = int(counters.get("moves", 0))
        self.finished_at: float | None = None
        # Live dashboard metrics, tagged by run (the run folder's name) and task; no-ops outside Ray.
        from ray_saturn.metrics import RunMetrics

        self.metrics = RunMetrics(storage.name)
        for t, rec in self.records.items():
            self.metrics.task_state(t, rec.state if rec.state in ("finished", "failed") else "queued")
            self.metrics.task_progress(t, steps_done=rec.steps_done, total_steps=rec.total_steps)
        self._to_arrive = {t for t, p in self.controller.tasks.items() if p.state is TaskState.PENDING}
        self._arrivals = {t: float(s) for t, s in (arrivals or {}).items() if t in self._to_arrive}
        self._arrived: set[str] = set()

    def arrived_by(self, now: float) -> list[str]:
        """Tasks that have arrived by ``now`` and were not announced yet (marks them announced)."""
        out = [
            t for t in self.controller.tasks
            if t in self._to_arrive and t not in self._arrived and self._arrivals.get(t, 0.0) <= now
        ]
        self._arrived.update(out)
        return out

    # ----------------------------------------------------------- clock
    def now(self) -> float:
        return self._offset + (self.launcher.now() - self._t0) / self.launcher.time_scale

    def restart_clock(self, at: float) -> None:
        """Make ``now()`` read ``at`` at this instant."""
        self._offset = float(at)
        self._t0 = self.launcher.now()

    # ----------------------------------------------------------- loop
    def step(self) -> DriverState:
        """Run one iteration of the current state; returns the new state."""
        prev = self.state
        try:
            self.state = self.state.step(self)
        except SaturnError as exc:
            logger.error("driver failed in %s: %s", prev.name, exc)
            self.state = Failed(str(exc))
        except Exception as exc:  # a bug or a Ray failure: stop, keep the state resumable
            logger.exception("driver crashed in %s", prev.name)
            self.state = Failed(f"{type(exc).__name__} in {prev.name}: {exc}".splitlines()[0])
        if type(self.state) is not type(prev):
            logger.debug("driver: %s -> %s", prev.name, self.state.name)
            if self.state.terminal:
                self.finished_at = self.now()
                self._write_safely(self.log, {"kind": "run_" + self.state.name,
                                              "reason": getattr(self.state, "reason", "")})
            self._write_safely(self.persist, force=True)
        else:
            self._write_safely(self.persist)
        return self.state

    def _write_safely(self, write: Any, *args: Any, **kwargs: Any) -> None:
        """Write to the run folder; when it cannot be written the run stops (resumable), never raises.

        The folder keeps the last state and events that were written, so once
        it is writable again ``resume`` continues from there.
        """
        try:
            write(*args, **kwargs)
        except RunFolderUnwritable as exc:
            if self.state.terminal:
                logger.error("driver %s, and could not record it: %s", self.state.name, exc)
                return
            logger.error("driver stopped: %s", exc)
            self.state = Failed(str(exc))
            self.finished_at = self.now()

    def run(self, max_steps: int | None = None) -> DriverResult:
        """Step until a terminal state (or ``max_steps``); return the result."""
        n = 0
        try:
            while not self.state.terminal and (max_steps is None or n < max_steps):
                self.step()
                n += 1
        finally:
            if self.state.terminal:
                self.launcher.shutdown()
                self.manager.release_all()
        return self.result()

    @property
    def replans(self) -> int:
        """Re-plans so far (the first plan is not one), counting an earlier driver's."""
        return self._replans0 + max(0, len(self.controller.replans) - 1)

    @property
    def moves(self) -> int:
        return self._moves0 + self.controller.moves

    def result(self) -> DriverResult:
        end = self.finished_at if self.finished_at is not None else self.now()
        return DriverResult(
            state=self.state.name,
            planned_makespan_s=self.planned_makespan_s,
            realised_makespan_s=end,
            replans=self.replans,
            moves=self.moves,
            tasks=self.records,
            reason=getattr(self.state, "reason", ""),
        )

    # ----------------------------------------------------------- actions
    def execute(self, actions: list[Any]) -> None:
        """Carry out the control plane's actions: stops now, launches when their GPUs are free."""
        from ray_saturn.control.dispatch import Launch, Stop

        for a in actions:
            if isinstance(a, Stop):
                rec = self.records[a.task]
                if a.task in self._pending and rec.current is None:
                    # Moved before it was launched: drop the launch, nothing to stop.
                    del self._pending[a.task]
                    rec.waiting = False
                    self.manager.release(a.task)
                    self.log(
                        {
                            "kind": "move",
                            "task": a.task,
                            "reason": a.reason,
                            "to": a.target.to_dict(),
                            "before_launch": True,
                        }
                    )
                    continue
                self.stopping[a.task] = (a, self.launcher.now())
                self.metrics.moved()
                if rec.current is not None:
                    rec.current.status = "stopping"
                self.launcher.stop(a.task)
                self.log({"kind": "move", "task": a.task, "reason": a.reason, "to": a.target.to_dict()})
            elif isinstance(a, Launch):
                self._pending[a.task] = (a, self.now())
                self.records[a.task].waiting = True
            else:  # pragma: no cover - the controller only returns these two
                raise SaturnError(f"unknown control action {a!r}")

    def after_control(self) -> None:
        """Log what the control plane recorded (events, re-plans and their reasons) and the plan."""
        new = self.controller.log[self._log_seen :]
        self._log_seen = len(self.controller.log)
        for entry in new:
            self.log(dict(entry))
        plan = self.controller.plan
        if plan is not None and new and any(e.get("kind") == "replan" for e in new):
            if self.planned_makespan_s is None:
                self.planned_makespan_s = self.now() + plan.makespan_s
            else:
                self.metrics.replanned(sum(e.get("kind") == "replan" for e in new))
                if not self._planned_knows_all:
                    # Until every task has arrived, the plan to compare the run with is the latest.
                    self.planned_makespan_s = self.now() + plan.makespan_s
            self._planned_knows_all = self._planned_knows_all or self.all_arrived()
            self.metrics.plan(planned_makespan_s=self.now() + plan.makespan_s,
                              lower_bound_s=self.now() + plan.lower_bound_s)
            self.journal.write_plan(plan)

    def all_arrived(self) -> bool:
        return len(self._arrived) >= len(self._to_arrive)

    def pending_launches(self) -> bool:
        return bool(self._pending)

    def active_segments(self) -> list[str]:
        return [t for t, r in self.records.items() if r.current is not None]

    def start_ready_launches(self) -> None:
        """Reserve GPUs for pending launches that fit; launch the ones whose hold is placed."""
        for task, (launch, _) in list(self._pending.items()):
            if task in self.stopping:
                continue
            pl = launch.placement
            held = self.manager.ledger.holder(task)
            if held is None:
                if any(n not in self.manager.ledger.nodes for n in pl.nodes):
                    # The node went away after the plan; the control plane re-plans on NodeLost.
                    continue
                where = {"devices": pl.device_map(), "gpu_type": pl.gpu_type}
                if not self.manager.ledger.fits(pl.nodes, pl.per_node, **where):
                    continue
                # The finished segment's workers on exactly these GPUs, if they wait (no new trainer).
                reuse = self.launcher.claim_parked(task, tuple(pl.nodes), pl.per_node)
                try:
                    self.manager.reserve(task, pl.nodes, pl.per_node, hold=not reuse, **where)
                except LedgerError as exc:
                    logger.debug("cannot reserve %s yet: %s", task, exc)
                    continue  # (a claim left unused ends at the launch pass's release_parked)
                if reuse:
                    self._reused.add(task)
            if not self.manager.is_ready(task):
                continue
            del self._pending[task]
            self._launch(task, launch)

    def _launch(self, task: str, launch: Any) -> None:
        from ray_saturn.profile_table import knobs_for

        rec = self.records[task]
        attempt = rec.attempts
        rec.attempts += 1
        rec.waiting = False
        self._attempt[task] = attempt
        pl: Placement = launch.placement
        cfg = self.profile.get(task, *pl.config_key)
        step_time = cfg.step_time_s or 1.0
        every = max(1, round(self.config.checkpoint_interval_s / step_time))
        spec = LaunchSpec(
            task=task,
            attempt=attempt,
            strategy=pl.strategy,
            gpus=pl.gpus,
            nodes=tuple(pl.nodes),
            target_step=rec.total_steps,
            checkpoint_dir=self.storage.task_dir(task),
            checkpoint_every=every,
            knobs=_knobs(self.profile, cfg, knobs_for),
            step_time_s=cfg.step_time_s,
            startup_s=cfg.startup_s,
            gpu_type=pl.gpu_type,
            devices=pl.device_map(),
        )
        seg = Segment(pl, self.now(), steps_start=rec.checkpointed_step, status="launching", attempt=attempt)
        rec.segments.append(seg)
        rec.planned_step_time_s = cfg.step_time_s
        rec.step_time_s = None
        reused = task in self._reused
        self._reused.discard(task)
        if reused:
            self._reused_segments.add((task, attempt))
        self.log(
            {
                "kind": "launch",
                "task": task,
                "attempt": attempt,
                **pl.to_dict(),
                "from_step": seg.steps_start,
                "checkpoint_every": every,
                **({"reused_workers": True} if reused else {}),
            }
        )
        try:
            self.launcher.launch(spec)
        except SaturnError as exc:
            self._segment_failed(task, attempt, f"launch failed: {exc}")

    # ----------------------------------------------------------- events
    def pump(self, timeout_wall_s: float) -> None:
        """Poll the launcher once and turn what happened into control-plane input."""
        from ray_saturn.control.events import TaskArrived, Tick

        self._check_nodes()
        for ev in self.launcher.poll(timeout_wall_s):
            if self._attempt.get(ev.task) != ev.attempt:
                continue  # a segment the driver already gave up on (node lost, superseded)
            if isinstance(ev, Started):
                self._on_started(ev)
            elif isinstance(ev, Progress):
                self._on_progress(ev)
            elif isinstance(ev, Exited):
                self._on_exited(ev)
        now = self.now()
        for t in self.arrived_by(now):
            self.log({"kind": "arrival", "task": t})
            self.inbox.append(TaskArrived(time_s=now, task=t))
        wake = self.controller.next_wakeup_s()
        if wake is not None and self.now() >= wake and not self.inbox:
            self.inbox.append(Tick(time_s=self.now()))

    def _on_started(self, ev: Started) -> None:
        rec = self.records[ev.task]
        seg = rec.current
        if seg is None or seg.first_step_s is not None:
            return
        seg.first_step_s = self.now()
        if seg.status == "launching":
            seg.status = "running"
        self.metrics.task_state(ev.task, "running", gpus=seg.gpus)
        latency = seg.first_step_s - seg.start_s
        cfg = self.profile.get(ev.task, *seg.placement.config_key)
        planned = cfg.startup_s + (cfg.checkpoint_load_s if seg.steps_start > 0 else 0.0)
        if (ev.task, ev.attempt) not in self._reused_segments:  # a move starts a new trainer: price that
            self._latencies.append(max(0.0, latency - planned))
        self.log(
            {
                "kind": "started",
                "task": ev.task,
                "attempt": ev.attempt,
                "step": ev.step,
                "launch_latency_s": round(latency, 3),
            }
        )
        self._update_restart_cost()

    def _on_progress(self, ev: Progress) -> None:
        rec = self.records[ev.task]
        rec.steps_done = max(rec.steps_done, min(rec.total_steps, ev.step))
        if ev.loss is not None:
            rec.loss = ev.loss
        st = None if ev.step_time_s is None else ev.step_time_s / self.launcher.time_scale
        if st is not None:
            rec.step_time_s = st
        self.metrics.task_progress(ev.task, steps_done=rec.steps_done, total_steps=rec.total_steps, step_time_s=st)
        if ev.task in self.stopping:
            return
        actions = self.controller.report_progress(ev.task, rec.steps_done, self.now(), st)
        if actions or len(self.controller.log) > self._log_seen:
            self.execute(actions)
            self.after_control()

    def _on_exited(self, ev: Exited) -> None:
        from ray_saturn.control.events import TaskFailed, TaskFinished

        task = ev.task
        if ev.status == "failed" and task not in self.stopping:
            # A failure may be a lost node: let the node check hand it over first.
            self._check_nodes(force=True)
            if self._attempt.get(task) != ev.attempt:
                return
        rec = self.records[task]
        seg = rec.current
        now = self.now()
        self.manager.release(task)
        self._attempt.pop(task, None)
        rec.checkpointed_step = max(rec.checkpointed_step, min(ev.step, rec.total_steps))
        if seg is not None:
            seg.end_s, seg.status, seg.steps_end, seg.reason = now, ev.status, ev.step, ev.reason
        self.log(
            {
                "kind": "exited",
                "task": task,
                "attempt": ev.attempt,
                "status": ev.status,
                "step": ev.step,
                "reason": ev.reason,
            }
        )
        if task in self.stopping:
            _, t_stop = self.stopping.pop(task)
            self._stop_costs.append((self.launcher.now() - t_stop) / self.launcher.time_scale)
            self.metrics.task_state(task, "queued")
            rec.steps_done = rec.checkpointed_step
            if ev.status == "finished":
                rec.steps_done = rec.total_steps  # relaunch finds the final checkpoint and ends at once
            return
        if ev.status == "finished":
            rec.steps_done = rec.total_steps
            self.metrics.task_state(task, "finished")
            self.metrics.task_progress(task, steps_done=rec.total_steps, total_steps=rec.total_steps)
            self.inbox.append(TaskFinished(time_s=now, task=task))
        else:
            reason = ev.reason or f"segment ended with status {ev.status}"
            rec.steps_done = rec.checkpointed_step
            rec.reason = reason
            self.inbox.append(TaskFailed(time_s=now, task=task, reason=reason, steps_done=rec.checkpointed_step))

    def _segment_failed(self, task: str, attempt: int, reason: str) -> None:
        self._on_exited(
            Exited(
                task,
                attempt,
                self.launcher.now(),
                "failed",
                self.launcher.checkpointed_step(self.storage.task_dir(task)),
                reason,
            )
        )

    def _check_nodes(self, force: bool = False) -> None:
        from ray_saturn.control.events import NodeAdded, NodeLost

        wall = time.monotonic()
        if not force and wall - self._last_node_check < self.config.node_check_wall_s:
            return
        self._last_node_check = wall
        changes = self.manager.sync_nodes()
        if not changes:
            return
        now = self.now()
        dropped = {r.task for r in changes.dropped}
        for task in list(self._pending):
            launch, _ = self._pending[task]
            if any(n in changes.lost for n in launch.placement.nodes):
                # The control plane counts it as running there; NodeLost interrupts it.
                del self._pending[task]
                self.records[task].waiting = False
                dropped.add(task)
        steps: dict[str, int] = {}
        for task in dropped:
            rec = self.records[task]
            self.launcher.discard(task)
            self._attempt.pop(task, None)
            ck = self.launcher.checkpointed_step(self.storage.task_dir(task))
            rec.checkpointed_step = max(rec.checkpointed_step, ck)
            rec.steps_done = rec.checkpointed_step
            seg = rec.current
            if seg is not None:
                seg.end_s, seg.status, seg.steps_end, seg.reason = now, "interrupted", ck, "node lost"
            self.stopping.pop(task, None)
            steps[task] = rec.checkpointed_step
        for node in changes.lost:
            self.log({"kind": "node_lost_detected", "node": node, "tasks": sorted(dropped)})
            self.inbox.append(NodeLost(time_s=now, node=node, steps_done=dict(steps)))
        for spec in changes.added:
            self.log({"kind": "node_added_detected", "node": spec.name, "gpus": spec.gpus})
            self.inbox.append(NodeAdded(time_s=now, node=spec))

    def _update_restart_cost(self) -> None:
        """The measured cost of a move besides what the profile prices (the target's start-up,
        checkpoint save and load): the stop (request to exit; until one is measured, half a
        checkpoint interval, the wait for the next checkpoint) and the start-up beyond the
        profile's (all of it for a profile without ``startup_s``)."""
        cost = statistics.median(self._latencies)
        if self._stop_costs:
            cost += statistics.median(self._stop_costs)
        else:
            cost += 0.5 * self.config.checkpoint_interval_s
        self.controller.set_restart_cost(cost)

    # ----------------------------------------------------------- persistence
    def log(self, record: dict[str, Any]) -> None:
        record.setdefault("time_s", round(self.now(), 3))
        record.setdefault("wall", round(time.time(), 3))
        self.journal.event(record)

    def persist(self, force: bool = False) -> None:
        wall = time.monotonic()
        if not force and wall - self._last_persist < self.config.persist_wall_s:
            return
        self._last_persist = wall
        for t, rec in self.records.items():
            if rec.state == "failed" and t not in self._failed_seen:
                self._failed_seen.add(t)
                self.metrics.task_state(t, "failed")
                rec.reason = self.controller.state(t).reason or rec.reason
                self.log({"kind": "task_gave_up", "task": t, "reason": rec.reason})  # rebuild reads it
        now = self.now()
        self.journal.write_state(
            {
                "version": 1,
                "driver_state": self.state.name,
                "reason": getattr(self.state, "reason", ""),
                "time_s": round(now, 3),
                "updated_wall": time.time(),
                "time_scale": self.launcher.time_scale,
                "planned_makespan_s": self.planned_makespan_s,
                "replans": self.replans,
                "moves": self.moves,
                "restart_s": self.controller.restart_s,
                "tasks": {t: r.to_dict(now) for t, r in self.records.items()},
            },
        )


def _knobs(profile: ProfileTable, cfg: Any, knobs_for: Any) -> dict[str, Any]:
    """The knobs the profiler chose for row ``cfg`` (a row of a GPU type: read from that row)."""
    if cfg.gpu_type is None:
        return knobs_for(profile, *cfg.key)
    from ray_saturn.profile_table import parse_knobs

    arrow = profile.to_arrow()
    if "knobs" not in arrow.column_names:
        return {}
    for row in arrow.select(["task", "strategy", "gpus", "nodes", "gpu_type", "knobs"]).to_pylist():
        if (row["task"], row["strategy"], row["gpus"], row["nodes"], row["gpu_type"]) == cfg.row_key:
            return parse_knobs(row["knobs"], f"{profile.source}: knobs of {cfg.row_key}")
    return {}
