"""The GPU ladder: the (GPU count, node count) pairs a strategy is measured on, and when to stop.

For each task and strategy the profiler measures 1, 2, 4, ... GPUs up to a
whole node, then 2, 3, ... whole nodes (:func:`gpu_ladder`), and stops
climbing once the step time improves by less than ``min_improvement`` or a
failure that more GPUs will not fix (anything but out-of-memory) is seen
(:class:`LadderWalk`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ray_saturn.profiler.store import StoredTrial
from ray_saturn.spec import ClusterSpec, Task

__all__ = ["MEMORY_WORDS", "LadderWalk", "gpu_ladder"]

MEMORY_WORDS = ("out of memory", "exceeds the")
"""Words in an infeasible trial's reason that mean it ran out of memory (more GPUs may fit)."""


def gpu_ladder(cluster: ClusterSpec) -> list[tuple[int, int]]:
    """(gpus, nodes) tried in order: 1, 2, 4, ... up to one node, then 2, 3, ... whole nodes.

    Example:
        >>> gpu_ladder(ClusterSpec.uniform(2, 4))
        [(1, 1), (2, 1), (4, 1), (8, 2)]
    """
    per_node = max(n.gpus for n in cluster.nodes)
    out, g = [], 1
    while g < per_node:
        out.append((g, 1))
        g *= 2
    out.append((per_node, 1))
    for k in range(2, len(cluster.nodes) + 1):
        if sum(1 for n in cluster.nodes if n.gpus >= per_node) >= k:
            out.append((k * per_node, k))
    return out


@dataclass
class LadderWalk:
    """One (signature, strategy): its ladder of GPU counts, climbed while step time improves.

    Example:
        >>> from ray_saturn.toy import mlp_task
        >>> walk = LadderWalk(mlp_task(), "sig", "ddp", [(1, 1), (2, 1)])
        >>> walk.next()
        (1, 1)
    """

    spec_task: Task
    signature: str
    strategy: str
    ladder: list[tuple[int, int]]
    pos: int = 0
    best: float | None = None
    done: bool = False

    def next(self) -> tuple[int, int] | None:
        return None if self.done or self.pos >= len(self.ladder) else self.ladder[self.pos]

    def advance(self, trial: StoredTrial, min_improvement: float) -> None:
        self.pos += 1
        if trial.feasible and trial.step_time_s is not None:
            if self.best is not None and trial.step_time_s > self.best * (1 - min_improvement):
                self.done = True
            self.best = trial.step_time_s if self.best is None else min(self.best, trial.step_time_s)
        elif not any(w in (trial.reason or "") for w in MEMORY_WORDS):
            self.done = True  # a failure that more GPUs will not fix
