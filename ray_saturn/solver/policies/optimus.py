"""``optimus-greedy``: marginal-gain GPU allocation, then list scheduling.

In the style of Optimus (Peng et al., EuroSys 2018): every task starts on
its fewest-GPU option; then, while GPUs remain, the task whose next larger
option saves the most seconds per extra GPU gets it. Tasks are then
list-scheduled in profile order with back-filling.
"""

from __future__ import annotations

from ray_saturn.solver.listsched import list_schedule
from ray_saturn.solver.policy import Policy, PolicyResult, register_policy


@register_policy
class OptimusGreedy(Policy):
    name = "optimus-greedy"

    def solve(self, problem, bound, *, time_limit_s, seed, on_schedule=None):
        choice = problem.choose(lambda t, o: (o.gpus, o.duration_s))
        budget = problem.total_gpus - sum(problem.options[t][c].gpus for t, c in enumerate(choice))
        while budget > 0:
            best = None
            for t, opts in enumerate(problem.options):
                cur = opts[choice[t]]
                if cur.pinned:
                    continue
                for i, o in enumerate(opts):
                    extra = o.gpus - cur.gpus
                    if extra <= 0 or extra > budget or o.duration_s >= cur.duration_s:
                        continue
                    gain = (cur.duration_s - o.duration_s) / extra
                    if best is None or gain > best[0]:
                        best = (gain, t, i, extra)
            if best is None:
                break
            _, t, i, extra = best
            choice[t] = i
            budget -= extra
        sched = list_schedule(problem, choice, list(range(problem.num_tasks)))
        if on_schedule:
            on_schedule(sched)
        return PolicyResult(sched)
