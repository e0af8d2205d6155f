"""Numbers where they enter: finite, in range, whole where they must be.

Every number a user gives (a profile cell, a cluster file, a flag, an
argument) is checked once, where it enters, with a one-line error that
says what was given and what to give instead. The limits below keep every
sum the solver forms finite and every count exact in a float; a value
beyond them is a mistake (usually of units), not a workload.

Example:
    >>> whole(8, "GPUs per node", high=MAX_GPUS_PER_NODE)
    8
    >>> number("nan", "--time-limit", low=0, low_open=True)
    Traceback (most recent call last):
    ...
    ray_saturn.errors.SpecError: --time-limit is 'nan'; give a finite number > 0
"""

from __future__ import annotations

import decimal
import math
import numbers
import operator
from typing import Any

from ray_saturn.errors import SaturnError, SpecError

__all__ = [
    "MAX_GPUS",
    "MAX_GPUS_PER_NODE",
    "MAX_NODES",
    "MAX_NOISE",
    "MAX_RUNTIME_S",
    "MAX_SEED",
    "MAX_SOLVER_GAP",
    "MAX_STEPS",
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "number",
    "solver_gap",
    "whole",
]

#: Steps of one task: whole numbers up to 2**53 are exact in a float.
MAX_STEPS = 2**53
#: Nodes in a cluster.
MAX_NODES = 100_000
#: GPUs on one node.
MAX_GPUS_PER_NODE = 1024
#: GPUs of one configuration (all nodes).
MAX_GPUS = MAX_NODES * MAX_GPUS_PER_NODE
#: Runtime of one configuration (steps x step time), about 31,700 years.
MAX_RUNTIME_S = 1e12
#: Task weights (the completion objective's ``weight`` column) are relative: within these bounds every
#: weighted sum of completion times stays finite and exact enough.
MIN_WEIGHT = 1e-6
MAX_WEIGHT = 1e6
#: Relative spread of simulated or emulated step times (a log-normal sigma; 3 is already wild).
MAX_NOISE = 3.0
#: Seeds: what every random generator in use accepts (CP-SAT takes a 32-bit one).
MAX_SEED = 2**31 - 1


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, decimal.Decimal):  # a Parquet decimal column
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except OverflowError:  # an int beyond the float range
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str):
        try:
            return parse_float(value.strip())
        except ValueError:
            return None
    return None


def parse_float(text: str) -> float:
    """``float(text)``, except that digit-group underscores (``"1_0"``, which Python reads as 10) are refused.

    Example:
        >>> parse_float(" 2.5 ")
        2.5
    """
    if "_" in text:
        raise ValueError(f"could not convert string to float: {text!r}")
    return float(text)


def _range(low: float | None, high: float | None, low_open: bool, fmt: str = "{:g}") -> str:
    if low is not None and high is not None:
        return f"from {fmt.format(low)} to {fmt.format(high)}" if not low_open else (
            f"> {fmt.format(low)} and <= {fmt.format(high)}")
    if low is not None:
        return f"{'>' if low_open else '>='} {fmt.format(low)}"
    if high is not None:
        return f"<= {fmt.format(high)}"
    return ""


def number(
    value: Any,
    what: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    error: type[SaturnError] = SpecError,
) -> float:
    """``value`` as a finite float in range, else ``error`` naming ``what``.

    ``low`` is inclusive unless ``low_open``; ``high`` is inclusive.
    """
    f = _as_float(value)
    ok = f is not None and math.isfinite(f)
    if ok and low is not None:
        ok = f > low if low_open else f >= low
    if ok and high is not None:
        ok = f <= high
    if not ok:
        rng = _range(low, high, low_open)
        raise error(f"{what} is {value!r}; give a finite number{' ' + rng if rng else ''}")
    return float(f)  # type: ignore[arg-type]


#: The largest gap to the lower bound a solver may stop at (a fraction of the bound).
MAX_SOLVER_GAP = 0.5


def solver_gap(value: Any, what: str, *, error: type[SaturnError] = SpecError) -> float:
    """A solver gap (stop once within this fraction of the lower bound): 0 to :data:`MAX_SOLVER_GAP`,
    else ``error`` naming ``what``; the one check of every place a gap is given.

    Example:
        >>> solver_gap(0.01, "gap")
        0.01
    """
    return number(value, f"{what} (a fraction of the lower bound, e.g. 0.01 for 1%)", low=0, high=MAX_SOLVER_GAP,
                  error=error)


def whole(
    value: Any,
    what: str,
    *,
    low: int = 1,
    high: int | None = None,
    error: type[SaturnError] = SpecError,
) -> int:
    """``value`` as a whole number in ``[low, high]``, else ``error`` naming ``what``.

    Accepts ints, integral floats (``8.0``) and their strings; not booleans.
    """
    n: int | None = None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        n = operator.index(value)
    else:
        f = _as_float(value)
        n = int(f) if f is not None and math.isfinite(f) and f == int(f) else None
        if n is None and isinstance(value, str) and "_" not in value:
            try:
                n = int(value.strip())
            except ValueError:
                n = None
    if n is None or n < low or (high is not None and n > high):
        rng = f"from {low} to {high}" if high is not None else f">= {low}"
        raise error(f"{what} is {value!r}; give a whole number {rng}")
    return n
