"""What an early-stopping scheduler lets a trial train, as the plan's horizon for it.

A trial under ASHA rarely trains all its steps: at each rung (a milestone
of the scheduler's ``time_attr``) only the best ``1 / reduction_factor`` of
the trials that reached it go on. Planning every trial for all its steps
plans a search that never happens (32 full trials where ASHA lets one or two
finish), so :class:`SaturnScheduler` plans each trial for the steps it is
*expected* to train, given the rungs it has passed:

- up to its next rung for sure;
- past every later rung with probability ``1 / reduction_factor`` per rung;
- never past ``max_t``.

When a trial passes a rung its horizon grows, so a trial ASHA keeps
becomes longer in the plan and (once GPUs free up) is given more of them;
a trial ASHA stops simply ends early. The model is read from an
:class:`~ray.tune.schedulers.AsyncHyperBandScheduler` (``ASHAScheduler``);
for any other base scheduler trials are planned for all their steps.

``time_attr`` units convert to steps by what the trial reports: the
``saturn_step`` of a result over its ``time_attr`` value; before its first
result a trial's ``max_t`` is taken to be all its steps.

Example:
    >>> model = EarlyStopModel(time_attr="training_iteration", max_t=16, keep=0.5, rungs=(1, 2, 4, 8))
    >>> model.expected_units(0), model.expected_units(4), model.expected_units(8)
    (3.0, 12.0, 16.0)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["EarlyStopModel", "early_stop_model"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EarlyStopModel:
    """ASHA's rungs for one trial: ``keep`` of the trials reaching a rung (milestone) go on."""

    time_attr: str
    max_t: float
    keep: float
    rungs: tuple[float, ...]

    def expected_units(self, t: float) -> float:
        """Expected ``time_attr`` value at the trial's end, having reached ``t`` and passed every rung <= t."""
        if t >= self.max_t:
            return float(t)
        end, p, prev = float(t), 1.0, float(t)
        for m in sorted(r for r in self.rungs if t < r < self.max_t):
            end += p * (m - prev)
            prev, p = m, p * self.keep
        return end + p * (self.max_t - prev)

    def horizon_steps(self, t: float, steps_done: int, units_per_step: float | None, total_steps: int) -> int:
        """The steps to plan the trial for: its expected end in steps, within ``steps_done + 1 .. total_steps``."""
        if steps_done >= total_steps:
            return total_steps
        per = units_per_step if units_per_step and units_per_step > 0 else self.max_t / total_steps
        more = (self.expected_units(t) - t) / per
        return int(min(total_steps, max(steps_done + 1, math.ceil(steps_done + more - 1e-9))))


def early_stop_model(base: Any, trial_id: str) -> EarlyStopModel | None:
    """The model of ``base`` for a trial it has added, or ``None`` when ``base`` stops no trial early
    by rungs (not ASHA) or its rungs cannot be read (then the trial is planned for all its steps)."""
    from ray.tune.schedulers import AsyncHyperBandScheduler

    if not isinstance(base, AsyncHyperBandScheduler):
        return None
    try:
        rf = float(base._reduction_factor)
        max_t = float(base._max_t)
        bracket = base._trial_info[trial_id]
        rungs = tuple(float(m) for m, _ in bracket._rungs)
        time_attr = str(base._time_attr)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        logger.info("cannot read ASHA's rungs (%s); trial %s is planned for all its steps", exc, trial_id)
        return None
    if not (rf > 1 and max_t > 0 and math.isfinite(max_t)):
        return None
    return EarlyStopModel(time_attr=time_attr, max_t=max_t, keep=1.0 / rf, rungs=rungs)
