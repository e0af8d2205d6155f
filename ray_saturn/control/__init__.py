"""The control plane: the same objects drive the simulator and the real runtime.

Nothing here imports Ray or reads a clock, and nothing branches on whether a
run is simulated. The caller (the simulator's event loop, or the runtime's
driver actor) owns the clock and the workers; the control plane owns the
decisions.

Pieces (each usable alone):

- :mod:`~ray_saturn.control.state`: :class:`TaskState`, :class:`TaskProgress`
  (steps done, measured step time, current :class:`Placement`, segments).
- :mod:`~ray_saturn.control.events`: :class:`TaskArrived`,
  :class:`TaskFinished`, :class:`TaskOffEstimate`, :class:`TaskFailed`,
  :class:`NodeLost`, :class:`NodeAdded`, :class:`Tick`, and
  :class:`GpusIdle`, which the controller raises itself.
- :mod:`~ray_saturn.control.replan`: re-planning policies
  (:class:`StaticReplan` = ``saturn-static`` and every baseline,
  :class:`EventReplan` = ``saturn-replan``, :class:`PeriodicReplan` =
  ``saturn-periodic``; :func:`get_replan_policy`) and
  :func:`build_replan_input` (remaining steps, measured step times, running
  tasks pinned with the restart cost).
- :mod:`~ray_saturn.control.moves`: :func:`decide_moves` returns a
  :class:`MoveDecision` per running task a re-plan would move: moved only
  when the predicted gain exceeds the restart cost.
- :mod:`~ray_saturn.control.dispatch`: :func:`dispatch` says which queued
  tasks to launch now and where (their planned nodes, in per-node plan order,
  as soon as the GPUs are free); actions :class:`Launch` and :class:`Stop`.
- :mod:`~ray_saturn.control.controller`: :class:`Controller` composes them;
  with ``backfill`` (the ``online`` default) a queued task also runs ahead of
  its plan on GPUs the plan leaves idle, and stops when the plan needs them.

A driver loop (one event at a time)::

    ctl = Controller(profile, cluster, "saturn-replan", restart_s=measured_restart_s)
    execute(ctl.start(now()))                   # plan, then Launch actions
    while not ctl.done:
        ev = wait_for_event(timeout=ctl.next_wakeup_s())   # None: a timer fired
        if ev is None:
            execute(ctl.handle(Tick(time_s=now())))
        elif ev is a progress report:               # steps done, measured s/step
            execute(ctl.report_progress(task, steps, now(), step_time_s))
        else:                                       # TaskFinished(time_s=now(), task=...), ...
            execute(ctl.handle(ev))

``execute`` runs the actions in order: each :class:`Stop` checkpoints and stops
a task (it was moved, or its backfill ended), each :class:`Launch` starts a task on its placement's
nodes, resuming at ``steps_done`` (after ``setup_s`` of restart for a moved
task). The controller updates its own ledger of GPUs when it issues them
(per device: a share 1/k of one GPU holds 1/k of the device its launch names,
see :mod:`ray_saturn.control.occupancy`); a launch that fails comes back as
:class:`TaskFailed`. Several events that
happen at the same instant may be passed to one ``handle`` call so that they
cause one re-plan. ``ctl.log`` holds every event and every re-plan (with its
reasons and move decisions) as JSON-ready dicts, for the run's JSONL log.

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> prof = ProfileTable.from_rows([
    ...     {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 10},
    ... ])
    >>> ctl = Controller(prof, ClusterSpec.uniform(1, 2), "saturn-replan", restart_s=5.0)
    >>> launch, = ctl.start(0.0)
    >>> launch.placement.nodes, ctl.state("a").state.value
    (('node-0',), 'running')
    >>> ctl.handle(TaskFinished(time_s=10.0, task="a")), ctl.done
    ([], True)
"""

from ray_saturn.control.controller import Action, Controller, ReplanRecord
from ray_saturn.control.dispatch import Launch, PlannedTask, Stop, dispatch
from ray_saturn.control.events import (
    Event,
    GpusIdle,
    NodeAdded,
    NodeLost,
    TaskArrived,
    TaskFailed,
    TaskFinished,
    TaskOffEstimate,
    Tick,
)
from ray_saturn.control.moves import MoveDecision, decide_moves
from ray_saturn.control.replan import (
    EventReplan,
    PeriodicReplan,
    ReplanInput,
    ReplanPolicy,
    ReplanView,
    StaticReplan,
    build_replan_input,
    get_replan_policy,
    replan_policy_names,
)
from ray_saturn.control.state import Placement, Segment, TaskProgress, TaskState

__all__ = [
    "Action",
    "Controller",
    "Event",
    "EventReplan",
    "GpusIdle",
    "Launch",
    "MoveDecision",
    "NodeAdded",
    "NodeLost",
    "PeriodicReplan",
    "Placement",
    "PlannedTask",
    "ReplanInput",
    "ReplanPolicy",
    "ReplanRecord",
    "ReplanView",
    "Segment",
    "StaticReplan",
    "Stop",
    "TaskArrived",
    "TaskFailed",
    "TaskFinished",
    "TaskOffEstimate",
    "TaskProgress",
    "TaskState",
    "Tick",
    "build_replan_input",
    "decide_moves",
    "dispatch",
    "get_replan_policy",
    "replan_policy_names",
]
