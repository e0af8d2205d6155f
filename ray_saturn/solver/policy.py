"""The policy interface and its registry.

A policy reads a :class:`~ray_saturn.solver.problem.Problem` and returns a
typed :class:`PolicyResult`. The same policy objects serve ``ray-saturn plan``,
the runtime's re-planning and the simulator.

A policy's settings are a small frozen dataclass, its :attr:`Policy.Options`;
``get_policy(name, **options)`` checks each option's name and type before the
policy is built, so a typo or a wrong type is an error, never ignored.

Example:
    >>> get_policy("saturn", deterministic=True).options
    SaturnOptions(deterministic=True, objective='makespan', gap=0.0, area_weight=0.0)
    >>> get_policy("fifo-min-gpus", deterministic=True)
    Traceback (most recent call last):
    ...
    ray_saturn.errors.SaturnError: policy 'fifo-min-gpus' has no option 'deterministic'; it takes none
"""

from __future__ import annotations

import dataclasses
import math
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ray_saturn.errors import SaturnError
from ray_saturn.solver.bounds import LowerBound
from ray_saturn.solver.problem import Problem, Schedule

__all__ = [
    "NoOptions",
    "Policy",
    "PolicyResult",
    "deterministic_policy",
    "get_policy",
    "policy_names",
    "register_policy",
]


@dataclass
class PolicyResult:
    """A policy's answer.

    ``proven_bound_s`` is a lower bound the policy proved itself (e.g. CP-SAT's
    objective bound), 0 when it proves none; it must never exceed the true
    optimum (:func:`ray_saturn.solver.solve_problem` raises when it exceeds the
    schedule's makespan). ``optimal`` is True only when the policy proved its
    schedule optimal.
    """

    schedule: Schedule
    proven_bound_s: float = 0.0
    optimal: bool = False


@dataclass(frozen=True)
class NoOptions:
    """The options of a policy that takes none."""


class Policy(ABC):
    """Base class: subclasses set ``name`` and implement :meth:`solve`.

    A policy with settings declares them as a frozen dataclass in ``Options``
    (field types ``bool``, ``int``, ``float`` or ``str``, each with a default);
    ``Policy(**options)`` checks them and keeps them in ``self.options``.
    """

    name: ClassVar[str]
    Options: ClassVar[type] = NoOptions

    def __init__(self, **options: Any) -> None:
        self.options = _make_options(self.name, type(self).Options, options)

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


def _make_options(policy: str, options_type: type, given: dict[str, Any]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(options_type)}
    hints = typing.get_type_hints(options_type)
    for key, value in given.items():
        if key not in fields:
            takes = ", ".join(sorted(fields)) or "none"
            raise SaturnError(f"policy {policy!r} has no option {key!r}; it takes {takes}")
        want = hints[key]
        ok = (
            (want is bool and isinstance(value, bool))
            or (want is int and isinstance(value, int) and not isinstance(value, bool))
            or (want is float and isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value))
            or (want is str and isinstance(value, str))
        )
        if not ok:
            raise SaturnError(
                f"policy {policy!r} option {key}={value!r}: give a {getattr(want, '__name__', want)}"
                + (" (finite)" if want is float else "")
            )
    return options_type(**given)


_REGISTRY: dict[str, type[Policy]] = {}


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name``.

    A name already registered by another class is an error (importing the
    same module twice is not).
    """
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} needs a class attribute 'name'")
    if not (dataclasses.is_dataclass(cls.Options) and isinstance(cls.Options, type)):
        raise TypeError(f"{cls.__name__}.Options must be a dataclass")
    old = _REGISTRY.get(name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise SaturnError(f"policy name {name!r} is already registered by {old.__module__}.{old.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def policy_names() -> list[str]:
    from ray_saturn.solver import policies  # noqa: F401  (registers the built-ins)

    return sorted(_REGISTRY)


def get_policy(name: str, **options: Any) -> Policy:
    """A new instance of the policy registered as ``name``, with ``options`` checked.

    Example:
        >>> get_policy("fifo-whole-node").name
        'fifo-whole-node'
    """
    names = policy_names()
    if name not in _REGISTRY:
        raise SaturnError(f"unknown policy {name!r}; choose one of: {', '.join(names)}")
    return _REGISTRY[name](**options)


def deterministic_policy(name: str) -> Policy:
    """``name``'s policy set so its answer depends only on its inputs and seed, not on the clock.

    A policy with a ``deterministic`` option gets it set; one without is
    deterministic already (the baselines).

    Example:
        >>> deterministic_policy("saturn").options.deterministic
        True
    """
    policy_names()
    cls = _REGISTRY.get(name)
    if cls is not None and "deterministic" in {f.name for f in dataclasses.fields(cls.Options)}:
        return get_policy(name, deterministic=True)
    return get_policy(name)
