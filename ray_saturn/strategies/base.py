"""The strategy plug-in interface and the typed results it returns.

A strategy is a small class with a ``name``. It says

* whether it applies to a task on a GPU count (:meth:`Strategy.applies`),
* which knob settings its search tries (:meth:`Strategy.knob_space`) and
  which of them cannot run on this hardware (:meth:`Strategy.hardware_reason`),
* how to turn a freshly built model into a :class:`Runner` on the workers it
  is given (:meth:`Strategy.prepare`). A runner does one optimizer step on a
  global batch; every strategy sees the same global batches in the same order,
  so checkpoints move freely between strategies and worker counts.

The search itself (:meth:`Strategy.search`) is shared: it measures every
feasible knob setting and keeps the fastest, returning a :class:`SearchResult`
or an :class:`Infeasible` with the reason.

Example:
    >>> from ray_saturn.strategies import get_strategy
    >>> get_strategy("ddp").applies(task=None, gpus=1)
    'ddp needs at least 2 GPUs (use single for 1)'
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ray_saturn.errors import SaturnError

if TYPE_CHECKING:
    import torch

    from ray_saturn.spec import Task

__all__ = [
    "Infeasible",
    "KnobError",
    "Runner",
    "SearchResult",
    "Strategy",
    "StrategyError",
    "Trial",
    "WorkerContext",
]


class StrategyError(SaturnError, ValueError):
    """A strategy cannot run a task as asked (unknown name, does not apply)."""


class KnobError(StrategyError):
    """A knob setting is unknown or out of range for its strategy."""


@dataclass(frozen=True)
class WorkerContext:
    """Where this worker sits: its rank, the world size and its torch device.

    Read it with :meth:`current` inside a worker; the device comes from
    :func:`ray_saturn.strategies.device.use_rank_device` (``torch.cuda.is_available()``
    and the worker's local index, never the Ray GPU assignment alone).
    """

    rank: int
    world_size: int
    device: torch.device

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def current(cls) -> WorkerContext:
        import torch.distributed as dist

        from ray_saturn.strategies.device import use_rank_device

        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = 0, 1
        return cls(rank, world, use_rank_device().device)


@dataclass(frozen=True)
class Trial:
    """One measured knob setting of a search."""

    knobs: Mapping[str, Any]
    step_time_s: float | None
    peak_mem_gb: float | None
    reason: str | None = None

    @property
    def feasible(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class SearchResult:
    """The fastest feasible knob setting with its median step time and peak memory per GPU."""

    strategy: str
    gpus: int
    knobs: Mapping[str, Any]
    step_time_s: float
    peak_mem_gb: float | None
    trials: tuple[Trial, ...] = field(default=())
    memory_measure: str = ""

    feasible: ClassVar[bool] = True


@dataclass(frozen=True)
class Infeasible:
    """No knob setting ran: the reason says why (one line)."""

    strategy: str
    gpus: int
    reason: str
    trials: tuple[Trial, ...] = field(default=())

    feasible: ClassVar[bool] = False


class Runner(ABC):
    """A prepared model on this worker: one optimizer step per global batch.

    ``module`` is what checkpoints save and load: its state-dict keys are the
    task model's own parameter names (no ``module.`` prefix), possibly a
    subset of them (a pipeline stage) or sharded (FSDP).
    """

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer

    @abstractmethod
    def step(self, batch: Any) -> float:
        """Train on one global batch; return the batch's mean loss (the same on every rank)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the runner holds (hooks, process groups)."""


class Strategy(ABC):
    """Base class of a parallelism strategy (see the module docstring).

    Subclasses set ``name``, ``exact`` (same maths as one-process training)
    and ``knob_defaults`` (every knob with its default), and implement
    :meth:`prepare`. Register them with
    :func:`ray_saturn.strategies.register` or the entry-point group
    ``ray_saturn.strategies``.
    """

    name: ClassVar[str]
    exact: ClassVar[bool] = True
    knob_defaults: ClassVar[Mapping[str, Any]] = {}
    min_gpus: ClassVar[int] = 1
    max_gpus: ClassVar[int | None] = None

    # ------------------------------------------------------------ applicability
    def applies(self, task: Task | None, gpus: int) -> str | None:
        """``None`` if the strategy can run ``task`` on ``gpus`` workers, else the reason."""
        if gpus < self.min_gpus:
            alt = " (use single for 1)" if self.min_gpus == 2 else ""
            return f"{self.name} needs at least {self.min_gpus} GPUs{alt}"
        if self.max_gpus is not None and gpus > self.max_gpus:
            return f"{self.name} runs on at most {self.max_gpus} GPU(s), not {gpus}"
        if (
            task is not None
            and task.batch_size is not None
            and task.batch_size % self.batch_ways(gpus)
        ):
            return (
                f"{self.name}: batch size {task.batch_size} does not split evenly over "
                f"{self.batch_ways(gpus)} workers"
            )
        return None

    def batch_ways(self, gpus: int) -> int:
        """Into how many equal parts one global batch is split across workers."""
        return gpus

    # --------------------------------------------------------------------- knobs
    def check_knobs(self, knobs: Mapping[str, Any] | None) -> dict[str, Any]:
        """Defaults filled in; an unknown knob is an error naming the known ones."""
        knobs = dict(knobs or {})
        unknown = sorted(set(knobs) - set(self.knob_defaults))
        if unknown:
            known = ", ".join(sorted(self.knob_defaults)) or "none"
            raise KnobError(f"{self.name}: unknown knob(s) {', '.join(unknown)} (knobs: {known})")
        return {**self.knob_defaults, **knobs}

    def knob_space(self, task: Task, gpus: int) -> Sequence[Mapping[str, Any]]:
        """Knob settings the search measures (default: the defaults only)."""
        return [dict(self.knob_defaults)]

    def hardware_reason(self, knobs: Mapping[str, Any], device: torch.device) -> str | None:
        """Why ``knobs`` cannot run on ``device`` (``None`` if it can)."""
        return None

    # ------------------------------------------------------------------- running
    @abstractmethod
    def prepare(
        self, model: torch.nn.Module, task: Task, knobs: Mapping[str, Any], ctx: WorkerContext
    ) -> Runner:
        """Wrap a freshly built model (same seed on every rank) for this worker."""

    def search(
        self, task: Task, ctx: WorkerContext, **measure_kw: Any
    ) -> SearchResult | Infeasible:
        """Measure every knob setting of :meth:`knob_space`; keep the fastest feasible one.

        Keyword arguments go to :func:`ray_saturn.strategies.measure.measure_knobs`
        (``warmup``, ``steps``, ``min_time_s``, ``memory_limit_gb``).
        """
        from ray_saturn.strategies.measure import search_knobs

        return search_knobs(self, task, ctx, **measure_kw)

    def __repr__(self) -> str:
        return f"<strategy {self.name}>"
