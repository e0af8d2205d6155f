"""What an early-stopping scheduler lets a trial train, as the plan's horizon for it.

A trial under ASHA rarely trains all its steps: at each rung (a milestone
of the scheduler's ``time_attr``) only the best ``1 / reduction_factor`` of
the trials that reached it go on. Planning every trial for all its steps
plans a search that never happens (32 full trials where ASHA lets one or two
finish), so :class:`SaturnScheduler` plans each trial for the steps it is
*expected* to train, given the rungs it has passed:

- up to its next rung for sure;
- past every later rung with probability ``1 / reduction_factor`` per rung
  while nothing is known of how it compares;
- never past ``max_t``.

Once the trial has passed a rung its standing there is known: how many of
the trials ASHA recorded at that rung did better. ASHA keeps the best
``1 / reduction_factor`` at each rung because ranks persist, so a trial that
leads its rung is likely to pass the next ones too, and one that scraped
through is not: its quantile ``q`` among that rung's trials (a Beta posterior
from its rank, wide while few trials are recorded) passes ``j`` more rungs
when ``q <= keep ** (j + 1)``. Curves do cross, so a quarter of the weight
stays on the rank-blind model (:data:`RANK_BLIND_WEIGHT`). The trial ASHA
will keep to the end is then planned as a long trial soon after its first
rung, and given the GPUs to match, instead of growing one rung at a time.

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
    >>> lead, last = Standing(better=0, others=15), Standing(better=7, others=15)
    >>> round(model.expected_units(1, lead), 1), round(model.expected_units(1, last), 1)
    (10.7, 2.8)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["RANK_BLIND_WEIGHT", "EarlyStopModel", "Standing", "early_stop_model", "rung_standing"]

logger = logging.getLogger(__name__)

#: Weight of the rank-blind model (``keep`` per rung) in a trial's chance to pass later rungs once its
#: standing is known: ranks at one rung foretell later ones only as far as curves do not cross.
RANK_BLIND_WEIGHT = 0.25


@dataclass(frozen=True)
class Standing:
    """Where a trial stands at the last rung it passed: ``better`` of the ``others`` recorded there did better."""

    better: int
    others: int

    def quantile_cdf(self, x: float) -> float:
        """P(the trial's quantile among that rung's trials <= ``x``): its Beta(better + 1, others - better + 1)
        posterior under a uniform prior, as P(Binomial(others + 1, x) >= better + 1)."""
        if x <= 0.0:
            return 0.0
        if x >= 1.0:
            return 1.0
        n, a = self.others + 1, self.better + 1
        lx, l1x, lgn = math.log(x), math.log1p(-x), math.lgamma(n + 1)

        def pmf(k: int) -> float:
            return math.exp(lgn - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lx + (n - k) * l1x)

        if a > n / 2:  # sum the shorter tail
            return min(1.0, sum(pmf(k) for k in range(a, n + 1)))
        return max(0.0, 1.0 - sum(pmf(k) for k in range(a)))


@dataclass(frozen=True)
class EarlyStopModel:
    """ASHA's rungs for one trial: ``keep`` of the trials reaching a rung (milestone) go on."""

    time_attr: str
    max_t: float
    keep: float
    rungs: tuple[float, ...]

    def survival(self, j: int, standing: Standing | None = None) -> float:
        """P(the trial passes the next ``j`` rungs), having passed the rung where it has ``standing``."""
        blind = self.keep**j
        if standing is None or j == 0:
            return blind
        passed = standing.quantile_cdf(self.keep)
        ranked = standing.quantile_cdf(self.keep ** (j + 1)) / passed if passed > 0 else blind
        return RANK_BLIND_WEIGHT * blind + (1.0 - RANK_BLIND_WEIGHT) * ranked

    def expected_units(self, t: float, standing: Standing | None = None) -> float:
        """Expected ``time_attr`` value at the trial's end, having reached ``t`` and passed every rung <= t
        (``standing``: where it stands at the last of them, if known)."""
        if t >= self.max_t:
            return float(t)
        ahead = sorted(r for r in self.rungs if t < r < self.max_t)
        end, prev = float(t), float(t)
        for j, m in enumerate(ahead):
            end += self.survival(j, standing) * (m - prev)
            prev = m
        return end + self.survival(len(ahead), standing) * (self.max_t - prev)

    def horizon_steps(
        self,
        t: float,
        steps_done: int,
        units_per_step: float | None,
        total_steps: int,
        standing: Standing | None = None,
    ) -> int:
        """The steps to plan the trial for: its expected end in steps, within ``steps_done + 1 .. total_steps``."""
        if steps_done >= total_steps:
            return total_steps
        per = units_per_step if units_per_step and units_per_step > 0 else self.max_t / total_steps
        more = (self.expected_units(t, standing) - t) / per
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


def rung_standing(base: Any, trial_id: str) -> Standing | None:
    """Where the trial stands at the highest rung of ``base`` (ASHA) that recorded it, or ``None``
    (no rung recorded it yet, or the rungs cannot be read). ASHA records rewards: higher is better."""
    try:
        rungs = base._trial_info[trial_id]._rungs
        recorded = [(float(m), r) for m, r in rungs if trial_id in r]
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    if not recorded:
        return None
    _, at = max(recorded, key=lambda mr: mr[0])
    try:
        own = float(at[trial_id])
        others = [float(v) for k, v in at.items() if k != trial_id]
    except (TypeError, ValueError):
        return None
    if not math.isfinite(own):
        return None
    others = [v for v in others if math.isfinite(v)]
    return Standing(better=sum(v > own for v in others), others=len(others))
