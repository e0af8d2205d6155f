"""Progress in whole steps: the one place a time becomes a step count.

A segment that starts stepping at ``start_s`` with ``step_s`` seconds a step
ends its i-th step at ``start_s + i * step_s``. Whoever schedules a step's
end (a simulated finish, a progress report) computes that time with exactly
this expression, and :func:`steps_done_by` counts with the same expression,
so at the finish time every step is counted: none is lost to rounding, how
ever small the step time or large the step count.

Example:
    >>> start, step, n = 100_000.0, 0.0074, 58_253
    >>> steps_done_by(start + n * step, start, step, n)
    58253
    >>> steps_done_by(start + 2.5 * step, start, step, n)
    2
"""

from __future__ import annotations

import math

__all__ = ["steps_done_by"]


def steps_done_by(now_s: float, start_s: float, step_s: float, limit: int) -> int:
    """The largest ``i`` in ``[0, limit]`` with ``start_s + i * step_s <= now_s``."""
    if step_s <= 0 or not math.isfinite(step_s):
        raise ValueError(f"step time is {step_s} s; give a finite positive number")
    if limit <= 0 or now_s < start_s:
        return 0
    i = min(limit, max(0, math.floor((now_s - start_s) / step_s)))
    while i < limit and start_s + (i + 1) * step_s <= now_s:
        i += 1
    while i > 0 and start_s + i * step_s > now_s:
        i -= 1
    return i
