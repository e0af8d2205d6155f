"""The profiler: measure every (task, strategy, GPU count) on the real cluster.

The public API is :func:`profile` and :class:`Profiler` (see
:mod:`ray_saturn.profiler.profiler`); the rest lives in modules named for
what they hold:

- :mod:`~ray_saturn.profiler.ladder`: the GPU ladder and when to stop climbing it;
- :mod:`~ray_saturn.profiler.pool`: the trial pool running trials concurrently;
- :mod:`~ray_saturn.profiler.trials`: one trial as Ray work on a placement group;
- :mod:`~ray_saturn.profiler.shares`: shares 1/k of one device, k copies of a job on it at once;
- :mod:`~ray_saturn.profiler.store`: the Parquet cache keyed by performance signature;
- :mod:`~ray_saturn.profiler.signature`: the performance signature itself.
"""

from ray_saturn.profiler.ladder import gpu_ladder
from ray_saturn.profiler.profiler import Profiler, ProfileResult, knobs_for, parse_knobs, profile

__all__ = ["ProfileResult", "Profiler", "gpu_ladder", "knobs_for", "parse_knobs", "profile"]
