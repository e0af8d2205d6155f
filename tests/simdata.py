"""Seeded synthetic moldable workloads for the control-plane, simulator and decomposition tests."""

from __future__ import annotations

import random

from ray_saturn import ClusterSpec, ProfileTable


def moldable_profile(num_tasks: int, nodes: int, gpus_per_node: int, seed: int = 0) -> tuple[ProfileTable, ClusterSpec]:
    """Tasks with 1, 2, 4, ... GPU configurations (one or more nodes) and sublinear speed-up."""
    rng = random.Random(seed)
    rows = []
    total = nodes * gpus_per_node
    for t in range(num_tasks):
        base = rng.uniform(0.5, 4.0)
        alpha = rng.uniform(0.5, 0.95)
        steps = rng.randint(100, 1500)
        g = 1
        while g <= min(total, 4 * gpus_per_node):
            k = max(1, -(-g // gpus_per_node))
            if g % k == 0:
                penalty = 1.0 if k == 1 else 1.15
                rows.append(
                    {
                        "task": f"t{t}",
                        "strategy": "ddp",
                        "gpus": g,
                        "nodes": k,
                        "steps": steps,
                        "step_time_s": round(base / g**alpha * penalty, 6),
                    }
                )
            g *= 2
        if rng.random() < 0.3:  # a second strategy on one GPU, sometimes infeasible
            rows.append(
                {
                    "task": f"t{t}",
                    "strategy": "fsdp",
                    "gpus": 1,
                    "nodes": 1,
                    "steps": steps,
                    "step_time_s": None,
                    "feasible": False,
                }
            )
    return ProfileTable.from_rows(rows), ClusterSpec.uniform(nodes, gpus_per_node)
