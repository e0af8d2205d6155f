"""First-come-first-served baselines: a fixed rule picks each task's option.

- ``fifo-max-gpus``: the most GPUs the task can use (ties: the fastest); on
  profiles that scale well that is often the whole cluster, one task at a time.
- ``fifo-whole-node``: literally one whole node per task, as when every job
  is given a node: the task runs with its fastest configuration on one node
  and holds that node's GPUs alone until it ends; a task with no one-node
  configuration takes the fewest whole nodes it can run on (then its fastest
  configuration there).
- ``fifo-min-gpus``: the fewest GPUs (ties: the fastest), as with a fixed
  per-trial resource in Ray Tune.
- ``fifo-fastest``: the shortest runtime (ties: fewer GPUs).

Tasks start in profile order, no back-filling.

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> from ray_saturn.solver import solve
    >>> rows = [{"task": t, "strategy": "ddp", "gpus": g, "nodes": max(1, g // 4), "step_time_s": 8.0 / g,
    ...          "steps": 10} for t in ("a", "b", "c") for g in (1, 2, 4, 8)]
    >>> cluster = ClusterSpec.uniform(2, 4)
    >>> solve(ProfileTable.from_rows(rows), cluster, "fifo-max-gpus").makespan_s  # 8 GPUs each, in turn
    30.0
    >>> solve(ProfileTable.from_rows(rows), cluster, "fifo-whole-node").makespan_s  # a node each: a, b; then c
    40.0
"""

from __future__ import annotations

from ray_saturn.solver.listsched import list_schedule, whole_node_schedule
from ray_saturn.solver.policy import Policy, PolicyResult, register_policy
from ray_saturn.solver.problem import Option, Problem, Schedule


class _Fifo(Policy):
    """A rule (``key``: the smallest option wins) picks each task's option; ``place`` starts the tasks in
    profile order."""

    @staticmethod
    def key(o: Option):
        raise NotImplementedError

    @staticmethod
    def place(problem: Problem, choice: list[int], order: list[int]) -> Schedule:
        return list_schedule(problem, choice, order, strict=True)

    def solve(self, problem, bound, *, time_limit_s, seed, on_schedule=None):
        choice = problem.choose(lambda t, o: self.key(o))
        sched = self.place(problem, choice, list(range(problem.num_tasks)))
        if on_schedule:
            on_schedule(sched)
        return PolicyResult(sched)


@register_policy
class FifoMaxGpus(_Fifo):
    name = "fifo-max-gpus"

    @staticmethod
    def key(o: Option):
        return (-o.gpus, o.duration_s, o.k)


@register_policy
class FifoWholeNode(_Fifo):
    name = "fifo-whole-node"
    place = staticmethod(whole_node_schedule)

    @staticmethod
    def key(o: Option):
        return (o.k, o.duration_s, o.gpus)


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
