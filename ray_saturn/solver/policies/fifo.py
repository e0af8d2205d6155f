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
from ray_saturn.solver.problem import Option, Problem


def _pick(problem: Problem, key) -> list[int]:
    choice = []
    for opts in problem.options:
        pinned = [i for i, o in enumerate(opts) if o.pinned]
        choice.append(pinned[0] if pinned else min(range(len(opts)), key=lambda i: key(opts[i])))
    return choice


class _Fifo(Policy):
    @staticmethod
    def key(o: Option):
        raise NotImplementedError

    def solve(self, problem, bound, *, time_limit_s, seed, on_schedule=None):
        choice = _pick(problem, self.key)
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
