"""Shared test helpers: small random profiles and an exhaustive reference solver."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from ray_saturn import ClusterSpec, ProfileTable


def random_instance(seed: int, max_tasks: int = 5, max_nodes: int = 2, max_options: int = 3):
    """A seeded random (profile, cluster) with integer durations; every task fits somewhere."""
    rng = random.Random(seed)
    n_nodes = rng.randint(1, max_nodes)
    caps = [rng.choice([1, 2, 3, 4]) for _ in range(n_nodes)]
    cluster = ClusterSpec.from_dict({"nodes": [{"name": f"n{i}", "gpus": g} for i, g in enumerate(caps)]})
    rows = []
    for t in range(rng.randint(1, max_tasks)):
        configs = set()
        # One option that always fits: 1 GPU on one node.
        configs.add((1, 1))
        for _ in range(rng.randint(0, max_options - 1)):
            k = rng.randint(1, n_nodes)
            per = rng.randint(1, max(caps))
            configs.add((per * k, k))
        steps = rng.randint(1, 5)
        for gpus, k in sorted(configs):
            step = rng.randint(1, 6)
            rows.append(
                {
                    "task": f"t{t}",
                    "strategy": "ddp",
                    "gpus": gpus,
                    "nodes": k,
                    "steps": steps,
                    "step_time_s": float(step),
                }
            )
    return ProfileTable.from_rows(rows), cluster


def brute_force_makespan(profile: ProfileTable, cluster: ClusterSpec, release: dict | None = None) -> float:
    """Optimal makespan by exhaustive serial schedule generation with branch and bound.

    Every active schedule is produced by placing tasks one at a time, each at
    its earliest feasible start on some node set, in some order and with some
    configuration; an optimal schedule is among the active ones. Written
    independently of ray_saturn.solver on purpose.
    """
    release = release or {}
    caps = {n.name: n.gpus for n in cluster.nodes}
    names = list(caps)
    tasks = profile.tasks
    opts = {}
    for t in tasks:
        opts[t] = []
        for c in profile.configs(t, feasible_only=True):
            per = c.gpus // c.nodes
            sets = [s for s in itertools.combinations(names, c.nodes) if all(caps[n] >= per for n in s)]
            if sets:
                opts[t].append((c.runtime_s, per, sets))
    best = [math.inf]

    def fits(placed, node, start, dur, per):
        # Max usage over [start, start+dur) on node, checked at every interval start inside it.
        points = [start] + [s for (n, s, e, q) in placed if n == node and start < s < start + dur]
        for p in points:
            used = sum(q for (n, s, e, q) in placed if n == node and s <= p < e)
            if used + per > caps[node]:
                return False
        return True

    def dfs(remaining, placed, makespan):
        if makespan >= best[0]:
            return
        if not remaining:
            best[0] = makespan
            return
        for t in remaining:
            rest = [u for u in remaining if u != t]
            r = float(release.get(t, 0.0))
            for dur, per, sets in opts[t]:
                for s in sets:
                    cands = sorted({r} | {e for (n, _, e, _) in placed if e > r})
                    for start in cands:
                        if all(fits(placed, n, start, dur, per) for n in s):
                            dfs(rest, placed + [(n, start, start + dur, per) for n in s], max(makespan, start + dur))
                            break

    dfs(list(tasks), [], 0.0)
    return best[0]


@pytest.fixture
def small_profile():
    return ProfileTable.from_rows(
        [
            {"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 10.0, "steps": 10},
            {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 6.0, "steps": 10},
            {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 10.0, "steps": 10},
            {"task": "b", "strategy": "fsdp", "gpus": 4, "nodes": 2, "step_time_s": 3.0, "steps": 10},
            {"task": "c", "strategy": "ddp", "gpus": 2, "step_time_s": 5.0, "steps": 4},
        ],
        source="small.csv",
    )
