"""Test helpers: profile builders, random instances and an exhaustive reference solver.

Imported by tests as ``from helpers import ...`` (pytest puts ``tests/`` on
the path); fixtures stay in ``conftest.py``.
"""

from __future__ import annotations

import itertools
import math
import random

from hypothesis import strategies as st

from ray_saturn import ClusterSpec, PlanningContext, ProfileTable


def rows_profile(*specs: tuple[str, list[tuple[int, float]], int], strategy: str = "ddp") -> ProfileTable:
    """A profile from ``(task, [(gpus, step_time_s), ...], steps)`` specs, one node per row.

    Example:
        >>> rows_profile(("a", [(1, 2.0), (2, 1.2)], 10)).tasks
        ['a']
    """
    rows = [
        {"task": task, "strategy": strategy, "gpus": gpus, "step_time_s": step, "steps": steps}
        for task, configs, steps in specs
        for gpus, step in configs
    ]
    return ProfileTable.from_rows(rows)


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


def llm_profile(num_tasks: int, nodes: int, gpus_per_node: int, seed: int = 0) -> tuple[ProfileTable, ClusterSpec]:
    """Memory-limited, LLM-style tasks with five strategies (seeded).

    A model of ``m`` GB on 16 GB GPUs: ``single`` and ``ddp`` need it whole on
    each GPU; ``fsdp`` and ``pipeline`` split it over the GPUs (pipeline needs
    at least 2); ``spill`` runs it on one GPU whatever its size, several
    times slower. Large models therefore run on one GPU only by spilling.
    """
    rng = random.Random(seed)
    rows = []
    per_gpu_gb = 16.0
    widths = [g for g in (1, 2, 4, 8, 16) if g <= nodes * gpus_per_node]
    for t in range(num_tasks):
        model_gb = rng.choice([4.0, 12.0, 24.0, 40.0, 60.0])
        base = rng.uniform(0.2, 2.0) * model_gb / 10  # seconds a step on one GPU, were it to fit
        steps = rng.randint(200, 2000)
        for g in widths:
            k = max(1, -(-g // gpus_per_node))
            if g % k:
                continue
            comm = 1.0 + 0.08 * (g - 1) + (0.3 if k > 1 else 0.0)
            fits_whole = model_gb * 4 <= per_gpu_gb * 4 and model_gb <= per_gpu_gb * 0.9
            for strategy, ok, step in (
                ("single", g == 1 and fits_whole, base),
                ("ddp", g > 1 and fits_whole, base / g * comm),
                ("fsdp", g > 1 and model_gb / g <= per_gpu_gb * 0.6, base / g * comm * 1.15),
                ("pipeline", g > 1 and model_gb / g <= per_gpu_gb * 0.8, base / g * (1 + 0.25 * g / 4) * comm),
                ("spill", g == 1, base * (2.5 + model_gb / 20)),
            ):
                rows.append(
                    {
                        "task": f"llm-{t}",
                        "strategy": strategy,
                        "gpus": g,
                        "nodes": k,
                        "steps": steps,
                        "step_time_s": round(step, 6) if ok else None,
                        "feasible": ok,
                    }
                )
    return ProfileTable.from_rows(rows), ClusterSpec.uniform(nodes, gpus_per_node)


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
    """Optimal makespan by exhaustive serial schedule generation (see :func:`brute_force`)."""
    return brute_force(profile, cluster, release, lambda task, end, value: max(value, end))


def brute_force_total_completion(
    profile: ProfileTable, cluster: ClusterSpec, release: dict | None = None, weights: dict | None = None
) -> float:
    """Least sum_t w_t C_t (weights default to 1) by exhaustive serial schedule generation."""
    weights = weights or {}
    return brute_force(profile, cluster, release, lambda task, end, value: value + weights.get(task, 1.0) * end)


def brute_force(profile: ProfileTable, cluster: ClusterSpec, release: dict | None, add) -> float:
    """The least value of a regular objective over all active schedules, with branch and bound.

    ``add(task, end, value)`` folds a placed task's end into the objective's
    value (it must never decrease it: max for the makespan, a weighted sum
    for completion times). Every active schedule is produced by placing
    tasks one at a time, each at its earliest feasible start on some node
    set, in some order and with some configuration; an optimal schedule for
    any regular objective is among the active ones. Written independently of
    ray_saturn.solver on purpose.
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

    def dfs(remaining, placed, value):
        if value >= best[0]:
            return
        if not remaining:
            best[0] = value
            return
        for t in remaining:
            rest = [u for u in remaining if u != t]
            r = float(release.get(t, 0.0))
            for dur, per, sets in opts[t]:
                for s in sets:
                    cands = sorted({r} | {e for (n, _, e, _) in placed if e > r})
                    for start in cands:
                        if all(fits(placed, n, start, dur, per) for n in s):
                            end = start + dur
                            dfs(rest, placed + [(n, start, end, per) for n in s], add(t, end, value))
                            break

    dfs(list(tasks), [], 0.0)
    return best[0]


@st.composite
def instances(draw):
    n_nodes = draw(st.integers(1, 3))
    caps = draw(st.lists(st.integers(1, 8), min_size=n_nodes, max_size=n_nodes))
    cluster = ClusterSpec.from_dict({"nodes": [{"name": f"n{i}", "gpus": g} for i, g in enumerate(caps)]})
    rows = []
    n_tasks = draw(st.integers(1, 8))
    for t in range(n_tasks):
        steps = draw(st.integers(1, 1000))
        configs = {(1, 1)}
        for _ in range(draw(st.integers(0, 4))):
            k = draw(st.integers(1, n_nodes))
            per = draw(st.integers(1, max(caps)))
            configs.add((per * k, k))
        for strategy in draw(st.sets(st.sampled_from(["ddp", "fsdp", "pipeline"]), min_size=1, max_size=2)):
            for gpus, k in sorted(configs):
                feasible = draw(st.booleans()) if (gpus, k) != (1, 1) else True
                step = draw(st.floats(0.001, 100.0, allow_nan=False, allow_infinity=False))
                rows.append(
                    {
                        "task": f"task-{t}",
                        "strategy": strategy,
                        "gpus": gpus,
                        "nodes": k,
                        "steps": steps,
                        "step_time_s": step if feasible else None,
                        "feasible": feasible,
                    }
                )
    profile = ProfileTable.from_rows(rows)
    release = {}
    if draw(st.booleans()):
        for t in profile.tasks:
            release[t] = draw(st.floats(0, 1000, allow_nan=False))
    avail = {}
    if draw(st.booleans()):
        avail[cluster.nodes[0].name] = draw(st.floats(0, 500, allow_nan=False))
    return profile, cluster, PlanningContext(release_s=release, node_available_s=avail)
