"""Ray Tune integration: keep your Tuner and search algorithm; ray_saturn picks how each trial runs.

Add two things to an ordinary Tuner: the trainable :func:`saturn_trainable`
(which trains a :class:`ray_saturn.Task` built from the trial's config on
the GPUs it is given) and :class:`SaturnScheduler` wrapped around your
early-stopping scheduler. Each trial's strategy, GPU count, node and start
order come from the same control plane as ``ray_saturn.run``: trials are
planned as they arrive (planning runs in the background, never in Tune's
event loop), may be resized with checkpoint-restart when the gain beats the
measured restart cost, free their GPUs the moment they end (also when ASHA
stops them), and land in the ResultGrid as usual. A config that cannot be
estimated or placed errors that trial alone.

Example:
    >>> from ray import tune
    >>> from ray.tune.schedulers import ASHAScheduler
    >>> from ray_saturn.tune import SaturnScheduler, saturn_trainable
    >>> # tuner = tune.Tuner(
    >>> #     saturn_trainable(make_task, report_every=10),
    >>> #     param_space={"lr": tune.loguniform(1e-4, 1e-2), "width": tune.choice([64, 128])},
    >>> #     tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=8,
    >>> #                                 scheduler=SaturnScheduler(estimate, base_scheduler=ASHAScheduler())),
    >>> # )
    >>> # results = tuner.fit()
"""

from ray_saturn.tune._rows import TrialRejected, TrialRow, TrialRows, profile_rows, trial_rows
from ray_saturn.tune._scheduler import GpuEvent, Move, SaturnScheduler, SchedulerStats, TuneIntegrationError
from ray_saturn.tune._trainable import (
    TrialDecision,
    TrialTrainingError,
    saturn_trainable,
    trial_decision,
    tune_strategies,
)

__all__ = [
    "GpuEvent",
    "Move",
    "SaturnScheduler",
    "SchedulerStats",
    "TrialDecision",
    "TrialRejected",
    "TrialRow",
    "TrialRows",
    "TrialTrainingError",
    "TuneIntegrationError",
    "profile_rows",
    "saturn_trainable",
    "trial_decision",
    "trial_rows",
    "tune_strategies",
]
