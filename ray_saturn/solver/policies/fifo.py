"""First-come-first-served baselines: a fixed rule picks each task's option.

- ``fifo-whole-node``: the most GPUs the task can use (ties: the fastest),
  as when every job is given whole nodes.
- ``fifo-min-gpus``: the fewest GPUs (ties: the fastest), as with a fixed
  per-trial resource in Ray Tune.
- ``fifo-fastest``: the shortest runtime (ties: fewer GPUs).

Tasks start in profile order, no back-filling.
"""

from __future__ import annotations

from ray_saturn.solver.listsched import list_schedule
from ray_saturn.solver.policy import Policy, PolicyResult, register_policy
from ray_saturn.solver.problem import Option


class _Fifo(Policy):
    @staticmethod
    def key(o: Option):
        raise NotImplementedError

    def solve(self, problem, bound, *, time_limit_s, seed, on_schedule=None):
        choice = problem.choose(lambda t, o: self.key(o))
        sched = list_schedule(problem, choice, list(range(problem.num_tasks)), strict=True)
        if on_schedule:
            on_schedule(sched)
        return PolicyResult(sched)


@register_policy
class FifoWholeNode(_Fifo):
    name = "fifo-whole-node"

    @staticmethod
    def key(o: Option):
        return (-o.gpus, o.duration_s, o.k)


@register_policy
class FifoMinGpus(_Fifo):
    name = "fifo-min-gpus"

    @staticmethod
    def key(o: Option):
        return (o.gpus, o.duration_s, o.k)


@register_policy
class FifoFastest(_Fifo):
    name = "fifo-fastest"

    @staticmethod
    def key(o: Option):
        return (o.duration_s, o.gpus, o.k)
