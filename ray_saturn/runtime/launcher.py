"""What the driver asks of a launcher, and what a launcher tells the driver.

A launcher starts one *segment* of a task (a run on one configuration, from
its latest checkpoint to its target step), can stop it (checkpoint and
stop, for a move), and reports what happened as typed events:
:class:`Started` (first step done), :class:`Progress`, and :class:`Exited`
(finished, stopped or failed, with the step it reached and a reason).

Launchers: :class:`~ray_saturn.runtime.train_launcher.TrainLauncher` (a
TorchTrainer run per segment), :class:`~ray_saturn.runtime.emulated.EmulatedLauncher`
(a sleep-per-step workload inside the placement group), and
:class:`~ray_saturn.runtime.fake.FakeLauncher` (no Ray, a stepped clock, for
tests of the driver's state machine).

Workers report progress through :class:`Reporter`, which sends at most one
message per ``interval_s`` (the first step at once) to the run's
:class:`ProgressBoard` actor and learns from it whether to stop.

Worker reuse. A launcher whose segments keep their workers after their last
step (the TorchTrainer one) *parks* them: the segment's last step is an
:class:`Exited` ``finished`` at once, and the workers wait a moment for
another segment of the same shape (the same GPUs on the same nodes). The
driver offers it with :meth:`Launcher.claim_parked` before it reserves a new
hold, and lets the rest go with :meth:`Launcher.release_parked`. The board
carries the hand-over: a parked group is ``parked``, then ``claimed`` (a
launch is coming), ``assigned`` (its next segment) or ``closed`` (its
workers end); every change is one call of the board actor, so a group that
gives up and a launch that claims it cannot both win.

Example:
    >>> spec = LaunchSpec("a", 0, "ddp", 2, ("node-0",), 100, "/tmp/run/tasks/a", 10)
    >>> spec.gpus_per_node
    2
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.errors import SaturnError

__all__ = [
    "Exited",
    "LaunchSpec",
    "Launcher",
    "LauncherEvent",
    "Progress",
    "ProgressBoard",
    "Reporter",
    "Started",
    "StopRequested",
    "new_board",
]

logger = logging.getLogger(__name__)


class StopRequested(SaturnError):
    """Raised inside a worker's report() when the driver asked the segment to stop."""


@dataclass(frozen=True)
class LaunchSpec:
    """One segment of a task: ``strategy`` on ``gpus`` GPUs over ``nodes`` up to ``target_step``."""

    task: str
    attempt: int
    strategy: str
    gpus: int | float
    nodes: tuple[str, ...]
    target_step: int
    checkpoint_dir: str
    checkpoint_every: int
    knobs: dict[str, Any] = field(default_factory=dict)
    step_time_s: float | None = None  # the profile's estimate (emulation sleeps on it)
    startup_s: float = 0.0  # the profile's launch-to-first-step (emulation sleeps it first)
    gpu_type: str | None = None  # the GPU type of its row (None: the untyped row)
    #: per node, the devices the plan gave it and its share of each (None: whole GPUs somewhere)
    devices: dict[str, tuple[tuple[int, float], ...]] | None = None

    @property
    def gpus_per_node(self) -> int | float:
        """GPUs per node, or the share 1/k of one GPU a single worker of a shared device gets."""
        return self.gpus if self.gpus < 1 else int(self.gpus) // len(self.nodes)

    @property
    def key(self) -> tuple[str, int]:
        return (self.task, self.attempt)


@dataclass(frozen=True)
class Started:
    task: str
    attempt: int
    wall: float
    step: int


@dataclass(frozen=True)
class Progress:
    task: str
    attempt: int
    wall: float
    step: int
    step_time_s: float | None
    loss: float | None = None


@dataclass(frozen=True)
class Exited:
    """A segment ended (``status``: finished, stopped, failed) at durable step ``step``."""

    task: str
    attempt: int
    wall: float
    status: str
    step: int
    reason: str = ""


LauncherEvent = Started | Progress | Exited


class Launcher(ABC):
    """Starts, stops and watches task segments."""

    #: Seconds of driver clock per wall second; the emulator scales time.
    time_scale: float = 1.0

    @abstractmethod
    def launch(self, spec: LaunchSpec) -> None:
        """Start a segment (its GPUs are already reserved); do not block on it."""

    @abstractmethod
    def stop(self, task: str) -> None:
        """Ask the running segment of ``task`` to stop; an :class:`Exited` ``stopped`` follows."""

    def prepare(self) -> None:  # noqa: B027 (optional hook)
        """Called once before the run's clock starts (e.g. to warm worker processes)."""

    def discard(self, task: str) -> None:
        """Forget the segment of ``task`` (its node is gone); no event for it follows."""
        self.stop(task)

    @abstractmethod
    def poll(self, timeout_s: float) -> list[LauncherEvent]:
        """Events since the last call, waiting up to ``timeout_s`` for the first one."""

    @abstractmethod
    def checkpointed_step(self, checkpoint_dir: str) -> int:
        """The latest durable step in a task's checkpoint folder (0 if none)."""

    def now(self) -> float:
        """Wall-clock seconds (the fake launcher replaces it with its own clock)."""
        return time.time()

    def shutdown(self) -> None:  # noqa: B027 (optional hook)
        """Stop everything (the driver is ending)."""

    def claim_parked(self, task: str, nodes: tuple[str, ...], gpus_per_node: int | float) -> bool:
        """Claim parked workers of exactly this shape for ``task``'s next launch (see the module
        docstring); ``True``: its :meth:`launch` runs on them, and needs no hold of its own."""
        return False

    def release_parked(self) -> None:  # noqa: B027 (optional hook)
        """Let every parked, unclaimed worker group end (the control plane had its chance)."""


def _board_cls():
    import ray

    @ray.remote(num_cpus=0, max_restarts=-1)
    class ProgressBoard:
        """Collects worker reports for the driver and carries stop requests back."""

        def __init__(self) -> None:
            self._events: list[tuple] = []
            self._stop: set[tuple[str, int]] = set()
            #: worker group -> {state, next segment (a list holding one ObjectRef), decisions made so far}
            self._groups: dict[str, list] = {}

        def push(
            self,
            task: str,
            attempt: int,
            kind: str,
            wall: float,
            step: int,
            step_time_s: float | None,
            loss: float | None,
        ) -> bool:
            self._events.append((kind, task, attempt, wall, step, step_time_s, loss))
            return (task, attempt) in self._stop

        def ping(self) -> bool:
            return True

        def request_stop(self, task: str, attempt: int) -> None:
            self._stop.add((task, attempt))

        def drain(self) -> list[tuple]:
            out, self._events = self._events, []
            return out

        # Worker reuse (the module docstring): a group's state changes in one call each.
        def park(self, group: str, task: str, attempt: int, wall: float, step: int) -> None:
            """Rank 0 of ``group``: its segment of ``task`` finished at ``step``; its workers wait."""
            self._events.append(("done", task, attempt, wall, step, None, None))
            g = self._groups.setdefault(group, {"state": "parked", "next": None, "decided": []})
            g["state"], g["next"] = "parked", None

        def claim(self, group: str) -> bool:
            g = self._groups.get(group)
            if g is None or g["state"] != "parked":
                return False
            g["state"] = "claimed"
            return True

        def offer(self, group: str, segment: list) -> bool:
            g = self._groups.get(group)
            if g is None or g["state"] not in ("parked", "claimed"):
                return False
            g["state"], g["next"] = "assigned", segment
            return True

        def dismiss(self, group: str, force: bool = False) -> None:
            """Close a parked group (``force``: a claimed one too); a running or assigned one goes on."""
            g = self._groups.get(group)
            if g is not None and (g["state"] == "parked" or (force and g["state"] == "claimed")):
                g["state"] = "closed"

        def next_segment(self, group: str, give_up: bool, force: bool = False) -> tuple[str, list | None]:
            """Rank 0's poll: ``("run", segment)``, ``("wait", None)`` or ``("end", None)``;
            ``give_up`` closes a group nobody claimed (``force``: a claimed one too). Each decision
            is kept for the other ranks."""
            g = self._groups.get(group)
            if g is None:
                return ("end", None)
            if g["state"] == "assigned":
                g["state"] = "running"
                g["decided"].append(("run", g["next"]))
            elif g["state"] == "closed" or (give_up and g["state"] == "parked") or (force and g["state"] == "claimed"):
                g["state"] = "closed"
                g["decided"].append(("end", None))
            else:
                return ("wait", None)
            return g["decided"][-1]

        def decision(self, group: str, n: int) -> tuple[str, list | None]:
            """The other ranks: rank 0's ``n``-th decision (from 0), ``("wait", None)`` until it is made."""
            g = self._groups.get(group)
            if g is None:
                return ("end", None)
            return g["decided"][n] if n < len(g["decided"]) else ("wait", None)

    return ProgressBoard


_BOARD = None


def ProgressBoard():
    """The Ray actor class of the progress board (built lazily so Ray is imported lazily)."""
    global _BOARD
    if _BOARD is None:
        _BOARD = _board_cls()
    return _BOARD


def head_node_id() -> str:
    """The Ray head node's id (its loss ends the cluster anyway), else this process's node."""
    import ray

    for info in ray.nodes():
        if info.get("Alive") and "node:__internal_head__" in info.get("Resources", {}):
            return str(info["NodeID"])
    return ray.get_runtime_context().get_node_id()


def on_head_node() -> Any:
    """A scheduling strategy that pins an actor of ours to the head node (whose loss ends the cluster anyway).

    The affinity is hard: with ``soft=True`` Ray placed a zero-CPU actor on another
    node in 25 of 30 tries on a three-node local cluster, and the driver then died
    with that node (the flaky node-removal fault test).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(head_node_id(), soft=False)


def new_board() -> Any:
    """A progress board on the head node, where the driver runs: a lost GPU node does not take it."""
    return ProgressBoard().options(scheduling_strategy=on_head_node()).remote()


def drain_board(board: Any) -> list[LauncherEvent]:
    """The board's events; none while it restarts (progress is re-sent by the next report)."""
    import ray
    from ray.exceptions import RayActorError

    try:
        return board_events(ray.get(board.drain.remote(), timeout=30))
    except (RayActorError, ray.exceptions.GetTimeoutError) as exc:
        logger.warning("progress board unavailable (%s); retrying on the next poll", type(exc).__name__)
        return []


def board_events(rows: list[tuple]) -> list[LauncherEvent]:
    """Turn the board's rows into typed events."""
    out: list[LauncherEvent] = []
    for kind, task, attempt, wall, step, step_time_s, loss in rows:
        if kind == "done":  # a segment's workers parked after its last step (worker reuse)
            out.append(Exited(task, attempt, wall, "finished", step))
            continue
        if kind == "started":
            out.append(Started(task, attempt, wall, step))
        out.append(Progress(task, attempt, wall, step, step_time_s, loss))
    return out


class Reporter:
    """Worker-side ``report`` callable: throttled progress to the board, stop requests back.

    Called once per step with ``{"step", "loss", ...}``; sends the first call
    and then at most one message every ``interval_s``. The step time it sends
    is the segment's wall-clock rate since its warm-up (seconds / steps), so it
    counts everything a step costs in the run (data, checkpoints, reports),
    not only the optimizer step, and a periodic cost (a checkpoint every so
    many steps) is averaged in rather than seen as a swing; the first
    ``warmup_steps`` steps of a segment (allocation, first communication) are
    not timed. When the board
    says the segment must stop, raises :class:`StopRequested`: at once, or,
    with ``checkpoint_every``, at the first step after a checkpoint (the
    strategies checkpoint step ``s`` right after reporting it, so stopping at
    ``s + 1`` loses one step instead of up to a checkpoint interval).
    """

    def __init__(
        self,
        board: Any,
        task: str,
        attempt: int,
        interval_s: float = 0.5,
        checkpoint_every: int | None = None,
        warmup_steps: int = 2,
    ) -> None:
        self.board = board
        self.task = task
        self.attempt = attempt
        self.interval_s = interval_s
        self.checkpoint_every = checkpoint_every
        self.warmup_steps = warmup_steps
        self._last = 0.0
        self._sent_first = False
        self._stopping = False
        self._calls = 0
        self._mark: tuple[float, int] | None = None  # (wall, step) the next rate is measured from

    def _maybe_stop(self, step: int) -> None:
        if not self._stopping:
            return
        if self.checkpoint_every is None or (step - 1) % self.checkpoint_every == 0:
            raise StopRequested(f"task {self.task!r}: the driver asked segment {self.attempt} to stop")

    def __call__(self, metrics: dict[str, Any]) -> None:
        import ray

        step = int(metrics["step"])
        self._maybe_stop(step)
        now = time.time()
        self._calls += 1
        if self._calls == self.warmup_steps or (self.warmup_steps <= 0 and self._mark is None):
            self._mark = (now, step)
        if self._sent_first and now - self._last < self.interval_s:
            return
        kind = "progress" if self._sent_first else "started"
        step_time = None
        if self._mark is not None and step > self._mark[1] and self._calls > self.warmup_steps:
            step_time = (now - self._mark[0]) / (step - self._mark[1])
        loss = metrics.get("loss")
        stop = ray.get(
            self.board.push.remote(
                self.task,
                self.attempt,
                kind,
                now,
                step,
                step_time,
                None if loss is None else float(loss),
            )
        )
        self._sent_first = True
        self._last = now
        if stop:
            self._stopping = True
            self._maybe_stop(step)
