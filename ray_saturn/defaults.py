"""Run defaults, defined once: the Python API, the CLI and the simulator read them from here.

- :data:`POLICY`: the re-planning policy a run uses unless told otherwise.
- :data:`CHECKPOINT_INTERVAL_S`: seconds of training between checkpoints.
- :data:`RESTART_S`: the cost of moving a running task (stop, save, start-up,
  load) assumed until the run has measured one (a profile with start-up and
  checkpoint columns prices each move with its own measured figures).
- :data:`SOLVER_TIME_LIMIT_S`: wall seconds per solver call of a run.
- :data:`EMULATE_SOLVER_TIME_LIMIT_S`: the same for ``ray-saturn emulate``.
- :data:`SIMULATE_SOLVER_TIME_LIMIT_S`: the same for a simulated run
  (:class:`~ray_saturn.sim.SimConfig`, ``ray-saturn simulate``).
- :data:`PLAN_POLICY`, :data:`PLAN_TIME_LIMIT_S`: the solver policy and its
  time limit for one plan (:func:`ray_saturn.solver.solve`, ``ray-saturn plan``).
- :data:`RUN_SOLVER_GAP`: a run's (re-)plans stop searching once within this
  fraction of the lower bound (the driver's solver shares the CPU with the
  training; ``ray-saturn plan`` and the simulator search their whole limit).
- :data:`DRIFT_REPLAN_GAP_FRACTION`: a run re-plans for drift (a task off its
  estimate, idle GPUs) at most once per this fraction of its first plan's
  makespan; finishes, failures, arrivals and node changes re-plan at once.
- :data:`PROFILE_WARMUP_STEPS`, :data:`PROFILE_TIMED_STEPS`, :data:`PROFILE_MIN_MEASURE_S`,
  :data:`PROFILE_TRIAL_TIMEOUT_S`: a profiler trial's untimed and timed steps
  per knob setting (the median of the timed ones counts), the least seconds
  of timed steps (more steps are timed until they reach it), and the seconds
  before it is killed (:class:`~ray_saturn.profiler.Profiler`, ``ray-saturn profile``).
- :data:`LEASE_HEARTBEAT_S`: seconds between heartbeats of a run folder's lock.
- :data:`LEASE_STALE_S`: a lock not renewed for this long belongs to a dead run
  (on the owner's own machine a dead owner is recognised at once by its process).
- :data:`TRAIN_POLL_S`: seconds between a segment's Ray Train controller's polls
  of its workers (Ray's default is 2 s, so a finished segment's GPUs came back
  about 2 s late; measured 3.0 s from the loop's end to ``fit()`` returning
  against 1.0 s at 0.25 s). Set ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` to keep
  your own; :func:`quick_train_polls` applies it.
- :data:`WORKER_LINGER_S`: wall seconds a finished segment's workers wait
  for a next segment of the same shape before they end (the driver lets
  them go sooner when its next launch pass has no use for them; see
  :mod:`ray_saturn.runtime.train_launcher`). It exceeds a re-plan's time
  limit, so a re-plan after a finish does not lose them.

Example:
    >>> from ray_saturn import defaults
    >>> defaults.POLICY
    'saturn-replan'
"""

from __future__ import annotations

import os

__all__ = [
    "CHECKPOINT_INTERVAL_S",
    "DRIFT_REPLAN_GAP_FRACTION",
    "EMULATE_SOLVER_TIME_LIMIT_S",
    "LEASE_HEARTBEAT_S",
    "LEASE_STALE_S",
    "PLAN_POLICY",
    "PLAN_TIME_LIMIT_S",
    "POLICY",
    "PROFILE_MIN_MEASURE_S",
    "PROFILE_TIMED_STEPS",
    "PROFILE_TRIAL_TIMEOUT_S",
    "PROFILE_WARMUP_STEPS",
    "RESTART_S",
    "RUN_SOLVER_GAP",
    "SIMULATE_SOLVER_TIME_LIMIT_S",
    "SOLVER_TIME_LIMIT_S",
    "TRAIN_POLL_S",
    "WORKER_LINGER_S",
    "quick_train_polls",
]

POLICY = "saturn-replan"
CHECKPOINT_INTERVAL_S = 60.0
RESTART_S = 30.0
SOLVER_TIME_LIMIT_S = 10.0
EMULATE_SOLVER_TIME_LIMIT_S = 2.0
SIMULATE_SOLVER_TIME_LIMIT_S = 2.0
PLAN_POLICY = "saturn"
PLAN_TIME_LIMIT_S = 30.0
PROFILE_WARMUP_STEPS = 2
PROFILE_TIMED_STEPS = 5
PROFILE_MIN_MEASURE_S = 0.5
PROFILE_TRIAL_TIMEOUT_S = 600.0
DRIFT_REPLAN_GAP_FRACTION = 0.05
RUN_SOLVER_GAP = 0.01
LEASE_HEARTBEAT_S = 5.0
LEASE_STALE_S = 60.0
WORKER_LINGER_S = 30.0
TRAIN_POLL_S = 0.5

#: Ray Train V2's variable for its controller's poll interval (propagated to the controller it starts).
_TRAIN_POLL_VAR = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


def quick_train_polls() -> None:
    """Have the TorchTrainers this process starts poll their workers every :data:`TRAIN_POLL_S`
    unless the user set ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (call before ``fit()``)."""
    os.environ.setdefault(_TRAIN_POLL_VAR, str(TRAIN_POLL_S))
