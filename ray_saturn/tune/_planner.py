"""Planning off Tune's event loop: the controller's solve function that never waits on a solver run.

The :class:`~ray_saturn.control.Controller` re-plans by calling a solve
function. Inside Tune that call happens in a scheduler hook, on Tune's event
loop, so :class:`BackgroundPlanner` answers it at once with the best of the
cheap plans: the baseline policies and the replay of an incumbent plan on the
current state (the plan being followed, and the newest plan the background
finished, moves included). Those take milliseconds: the solver is called with
no time for its search. The same input is then handed to a background thread,
which runs the full solver with the plan being followed as its start; a newer
input replaces one that has not started yet (latest wins). When a background
plan is ready, :attr:`BackgroundPlanner.fresh` says so, and the scheduler asks
the controller to re-plan: the cheap call then replays that plan on the state
of that moment, and the controller's move rule decides whether its moves pay.

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> from ray_saturn.context import PlanningContext
    >>> prof = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0,
    ...                                 "steps": 10}])
    >>> planner = BackgroundPlanner(time_limit_s=0.2)
    >>> plan = planner(prof, ClusterSpec.uniform(1, 2), "saturn", context=PlanningContext(), time_limit_s=1, seed=0)
    >>> plan.makespan_s
    10.0
    >>> planner.flush()
    >>> planner.wait(timeout_s=30), planner.fresh
    (True, True)
    >>> planner.close()
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ray_saturn.context import Incumbent, PlanningContext
from ray_saturn.plan import Plan

__all__ = ["BackgroundPlanner", "PlannerStats", "incumbent_of", "same_decisions"]

logger = logging.getLogger(__name__)


def incumbent_of(plan: Plan) -> Incumbent:
    """``plan`` as an incumbent: tasks in planned start order, each with its placement."""
    order = tuple(a.task for a in sorted(plan.assignments, key=lambda a: (a.start_s, a.task)))
    return Incumbent(order, {a.task: (a.strategy, a.gpus, tuple(a.nodes)) for a in plan.assignments})


def same_decisions(a: Plan, b: Plan) -> bool:
    """Whether two plans put their common tasks on the same placements, in the same order."""
    ia, ib = incumbent_of(a), incumbent_of(b)
    common = set(ia.placements) & set(ib.placements)
    if any(ia.placements[t] != ib.placements[t] for t in common):
        return False
    return [t for t in ia.order if t in common] == [t for t in ib.order if t in common]


@dataclass(frozen=True)
class _Call:
    profile: Any
    cluster: Any
    policy: Any
    context: PlanningContext
    seed: int


@dataclass
class PlannerStats:
    """What planning cost: cheap plans made in hooks, full solves in the background."""

    quick_plans: int = 0
    quick_time_s: float = 0.0
    max_quick_ms: float = 0.0
    background_solves: int = 0
    background_time_s: float = 0.0
    background_failures: int = 0
    applied: int = 0

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}


class BackgroundPlanner:
    """A solve function for the controller that returns at once and improves the plan in the background.

    Args:
        time_limit_s: time limit of each background solve.
        allows_moves: whether the re-planning policy moves running tasks; then
            a call where no running task may move is the controller's
            "keep everything in place" comparison, which is not solved again
            in the background.
        solve: the solver function (default :func:`ray_saturn.solver.solve`).
    """

    def __init__(self, *, time_limit_s: float, allows_moves: bool = True, solve: Callable[..., Plan] | None = None):
        if solve is None:
            from ray_saturn.solver import solve as default_solve

            solve = default_solve
        self._solve = solve
        self.time_limit_s = float(time_limit_s)
        self.allows_moves = allows_moves
        self.stats = PlannerStats()
        #: While False, calls are not solved again in the background (set while applying a background plan).
        self.refine = True
        self._cond = threading.Condition()
        self._queued: _Call | None = None  # waiting for the thread (latest wins)
        self._busy = False
        self._newest: Plan | None = None  # newest finished background plan
        self._fresh = False  # ... not applied yet
        self._candidate: _Call | None = None  # the last call since flush()
        self._thread: threading.Thread | None = None
        self._closed = False

    def __getstate__(self) -> dict:
        # Tune pickles its scheduler with the experiment: keep the plans, not the thread.
        state = dict(self.__dict__)
        for k in ("_cond", "_thread", "_queued", "_candidate"):
            state.pop(k)
        state["_busy"] = False
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._cond = threading.Condition()
        self._thread = None
        self._queued = self._candidate = None

    # ------------------------------------------------------------ the solve function
    def __call__(self, profile, cluster, policy, *, context: PlanningContext, time_limit_s: float, seed: int = 0):
        t0 = time.perf_counter()
        with self._cond:
            newest = self._newest if self._fresh else None
        incumbents = [context.incumbent]
        if newest is not None:
            incumbents.append(incumbent_of(newest))
        best: Plan | None = None
        for inc in incumbents:
            ctx = context if inc is context.incumbent else dataclasses.replace(context, incumbent=inc)
            try:
                plan = self._solve(profile, cluster, policy, context=ctx, time_limit_s=0.0, seed=seed)
            except Exception:
                if inc is context.incumbent:
                    raise
                # A background plan that no longer decodes (e.g. the cluster changed): plan without it.
                logger.info("the background plan does not apply to the current state; planning without it")
                continue
            if best is None or plan.makespan_s < best.makespan_s - 1e-9:
                best = plan
        assert best is not None
        if self.refine and not self._keep_comparison(context):
            self._candidate = _Call(profile, cluster, policy, context, seed)
        dt = time.perf_counter() - t0
        self.stats.quick_plans += 1
        self.stats.quick_time_s += dt
        self.stats.max_quick_ms = max(self.stats.max_quick_ms, 1000 * dt)
        return best

    def _keep_comparison(self, context: PlanningContext) -> bool:
        return self.allows_moves and bool(context.running) and not any(r.movable for r in context.running)

    # ------------------------------------------------------------ background
    @property
    def fresh(self) -> bool:
        """A background plan finished and was not applied yet."""
        with self._cond:
            return self._fresh

    @property
    def newest(self) -> Plan | None:
        """The newest plan the background finished (``None`` before the first)."""
        with self._cond:
            return self._newest

    def consume(self, applied: bool = True) -> None:
        """The fresh background plan was applied (the controller re-planned with it), or was
        not needed (``applied=False``: it decides what the plan being followed decides)."""
        with self._cond:
            if self._fresh and applied:
                self.stats.applied += 1
            self._fresh = False

    def flush(self) -> None:
        """Hand the last call since the previous flush to the background (replacing a queued one)."""
        call, self._candidate = self._candidate, None
        if call is None or self._closed:
            return
        with self._cond:
            self._queued = call
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="saturn-tune-planner", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait(self, timeout_s: float) -> bool:
        """Wait until the background is idle (for tests and shutdown); True if it is."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queued is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self) -> None:
        """Stop the background thread (a solve in progress finishes first)."""
        with self._cond:
            self._closed = True
            self._queued = None
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._queued is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                call, self._queued, self._busy = self._queued, None, True
            t0 = time.perf_counter()
            plan = None
            try:
                plan = self._solve(
                    call.profile,
                    call.cluster,
                    call.policy,
                    context=call.context,
                    time_limit_s=self.time_limit_s,
                    seed=call.seed,
                )
            except Exception as exc:  # the cheap plan stays in force; say why once per failure
                logger.warning("background planning failed (the current plan stays): %s", exc)
            dt = time.perf_counter() - t0
            with self._cond:
                self._busy = False
                self.stats.background_time_s += dt
                if plan is None:
                    self.stats.background_failures += 1
                else:
                    self.stats.background_solves += 1
                    self._newest, self._fresh = plan, True
                self._cond.notify_all()
