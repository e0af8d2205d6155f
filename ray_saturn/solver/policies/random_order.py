"""``random``: a random feasible option per task and a random order (seeded)."""

from __future__ import annotations

import random

from ray_saturn.solver.listsched import list_schedule
from ray_saturn.solver.policy import Policy, PolicyResult, register_policy


@register_policy
class RandomPolicy(Policy):
    name = "random"

    def solve(self, problem, bound, *, time_limit_s, seed, on_schedule=None):
        rng = random.Random(seed)
        choice = []
        for t, opts in enumerate(problem.options):
            p = problem.pinned_option(t)
            choice.append(p if p is not None else rng.randrange(len(opts)))
        order = list(range(problem.num_tasks))
        rng.shuffle(order)
        sched = list_schedule(problem, choice, order)
        if on_schedule:
            on_schedule(sched)
        return PolicyResult(sched)
