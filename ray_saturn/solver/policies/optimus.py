"""``optimus-greedy``: marginal-gain GPU allocation, then list scheduling.

In the style of Optimus (Peng et al., EuroSys 2018): every task starts on
its fewest-GPU option; then, one step at a time, the task whose next faster
option (the fewest GPUs among the options faster than its current one)
saves the most seconds per extra GPU moves to it, as long as the move does
not lengthen the plan's estimated makespan::

    M = max( max_t (r_t + d_t),  (sum_t g_t d_t + sum_n G_n u_n) / G )

(the longest task from its release, or the GPU-seconds spread over the
cluster; notation as in :mod:`ray_saturn.solver.bounds`). The budget is thus
the cluster's GPU time up to the makespan, not its GPUs at one instant: with
more tasks than GPUs a move still pays when it saves GPU-seconds (a
memory-limited model that spills on one GPU but shards fast on two), and
with few tasks the long ones widen until the GPUs are spent. Tasks are then
list-scheduled in profile order with back-filling.

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> from ray_saturn.solver import solve
    >>> rows = []
    >>> for t in range(8):  # 1 GPU only by spilling (slow); 2 GPUs shard it (fast)
    ...     rows += [{"task": f"t{t}", "strategy": "spill", "gpus": 1, "step_time_s": 10.0, "steps": 10},
    ...              {"task": f"t{t}", "strategy": "fsdp", "gpus": 2, "step_time_s": 2.0, "steps": 10}]
    >>> profile, cluster = ProfileTable.from_rows(rows), ClusterSpec.uniform(1, 4)
    >>> solve(profile, cluster, "fifo-min-gpus").makespan_s, solve(profile, cluster, "optimus-greedy").makespan_s
    (200.0, 80.0)
"""

from __future__ import annotations

import heapq

from ray_saturn.solver.listsched import list_schedule
from ray_saturn.solver.policy import Policy, PolicyResult, register_policy
from ray_saturn.solver.problem import Problem

_TOL = 1e-12


def _next_faster(problem: Problem, t: int, cur: int) -> int | None:
    """Task t's option with the fewest GPUs (then fastest) among those faster than option ``cur``."""
    opts = problem.options[t]
    d = opts[cur].duration_s
    faster = [i for i, o in enumerate(opts) if o.duration_s < d and not o.pinned]
    return min(faster, key=lambda i: (opts[i].gpus, opts[i].duration_s, i)) if faster else None


def optimus_choice(problem: Problem) -> list[int]:
    """Per task, the option the marginal-gain allocation gives it (see the module docstring)."""
    choice = problem.choose(lambda t, o: (o.gpus, o.duration_s))
    total = float(problem.total_gpus)
    blocked = float((problem.node_gpus * problem.node_avail).sum())
    release = [float(r) for r in problem.release]
    dur = [problem.options[t][c].duration_s for t, c in enumerate(choice)]
    area = sum(problem.options[t][c].area for t, c in enumerate(choice))
    ends = [(-(release[t] + dur[t]), t) for t in range(problem.num_tasks)]  # max-heap, lazily updated
    heapq.heapify(ends)

    def longest(skip: int = -1) -> float:
        while ends and -ends[0][0] != release[ends[0][1]] + dur[ends[0][1]]:
            heapq.heappop(ends)  # stale
        if not ends:
            return 0.0
        if ends[0][1] != skip:
            return -ends[0][0]
        top = heapq.heappop(ends)
        rest = longest()
        heapq.heappush(ends, top)
        return rest

    def candidate(t: int) -> tuple[float, int, int, int] | None:
        cur = problem.options[t][choice[t]]
        if cur.pinned:
            return None
        i = _next_faster(problem, t, choice[t])
        if i is None:
            return None
        o = problem.options[t][i]
        extra = max(o.gpus - cur.gpus, 0)
        gain = (cur.duration_s - o.duration_s) / extra if extra else float("inf")
        return (-gain, t, i, choice[t])

    heap = [c for t in range(problem.num_tasks) if (c := candidate(t)) is not None]
    heapq.heapify(heap)
    makespan = max(longest(), (area + blocked) / total)
    waiting: list[tuple[float, int, int, int]] = []
    while heap:
        cand = heapq.heappop(heap)
        _, t, i, was = cand
        if choice[t] != was:
            continue  # stale: the task moved since
        cur, new = problem.options[t][was], problem.options[t][i]
        new_area = area - cur.area + new.area
        new_makespan = max(longest(skip=t), release[t] + new.duration_s, (new_area + blocked) / total)
        if new_makespan > makespan * (1 + _TOL) + _TOL:
            waiting.append(cand)  # may pay later, once other moves have changed the estimate
            continue
        choice[t], dur[t], area, makespan = i, new.duration_s, new_area, new_makespan
        heapq.heappush(ends, (-(release[t] + dur[t]), t))
        nxt = candidate(t)
        if nxt is not None:
            heapq.heappush(heap, nxt)
        for w in waiting:
            heapq.heappush(heap, w)
        waiting = []
    return choice


@register_policy
class OptimusGreedy(Policy):
    name = "optimus-greedy"

    def solve(self, problem, bound, *, time_limit_s, seed, on_schedule=None):
        sched = list_schedule(problem, optimus_choice(problem), list(range(problem.num_tasks)))
        if on_schedule:
            on_schedule(sched)
        return PolicyResult(sched)
