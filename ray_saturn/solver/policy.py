"""The policy interface and its registry.

A policy reads a :class:`~ray_saturn.solver.problem.Problem` and returns a
typed :class:`PolicyResult`. The same policy objects serve ``ray-saturn plan``,
the runtime's re-planning and the simulator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from ray_saturn.errors import SaturnError
from ray_saturn.solver.bounds import LowerBound
from ray_saturn.solver.problem import Problem, Schedule

__all__ = ["Policy", "PolicyResult", "get_policy", "policy_names", "register_policy"]


@dataclass
class PolicyResult:
    """A policy's answer.

    ``proven_bound_s`` is a lower bound the policy proved itself (e.g. CP-SAT's
    objective bound), 0 when it proves none. ``optimal`` is True only when the
    policy proved its schedule optimal.
    """

    schedule: Schedule
    proven_bound_s: float = 0.0
    optimal: bool = False
    first_solution_s: float | None = None


class Policy(ABC):
    """Base class: subclasses set ``name`` and implement :meth:`solve`."""

    name: ClassVar[str]

    @abstractmethod
    def solve(
        self,
        problem: Problem,
        bound: LowerBound,
        *,
        time_limit_s: float,
        seed: int,
        on_schedule: Callable[[Schedule], None] | None = None,
    ) -> PolicyResult:
        """Return a schedule for every task of ``problem``.

        ``on_schedule`` is called with each improving schedule as it is found,
        so callers can act on the first valid plan while the search runs on.
        """


_REGISTRY: dict[str, type[Policy]] = {}


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name``."""
    if not getattr(cls, "name", None):
        raise TypeError(f"{cls.__name__} needs a class attribute 'name'")
    _REGISTRY[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    from ray_saturn.solver import policies  # noqa: F401  (registers the built-ins)

    return sorted(_REGISTRY)


def get_policy(name: str) -> Policy:
    names = policy_names()
    if name not in _REGISTRY:
        raise SaturnError(f"unknown policy {name!r}; choose one of: {', '.join(names)}")
    return _REGISTRY[name]()
