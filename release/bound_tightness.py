"""How loose is the lower bound? Bound / optimum on small random instances solved exhaustively.

The optimum comes from the exhaustive search in tests/helpers.py (independent
of the solver); the instances are the seeded random ones the tests use
(<= 5 tasks, <= 2 nodes, integer durations).

Usage:
    python release/bound_tightness.py --instances 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers import brute_force_makespan, random_instance

from ray_saturn.solver import build_problem, lower_bound


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=200)
    args = ap.parse_args()
    rows = []
    for seed in range(args.instances):
        profile, cluster = random_instance(seed)
        opt = brute_force_makespan(profile, cluster)
        b = lower_bound(build_problem(profile, cluster))
        rows.append((b.value / opt, b.with_moves / opt, b.binding))
    ratios = [r[0] for r in rows]
    tight = sum(r >= 1 - 1e-6 for r in ratios)
    print(f"instances: {len(rows)}; bound = optimum on {tight} ({100 * tight / len(rows):.0f}%)")
    print(f"bound / optimum: mean {statistics.mean(ratios):.3f}, median {statistics.median(ratios):.3f}, "
          f"worst {min(ratios):.3f}")
    moves = [r[1] for r in rows]
    print(f"without the exclusive-task bound: mean {statistics.mean(moves):.3f}, worst {min(moves):.3f}")
    by = {}
    for r, _, binding in rows:
        by.setdefault(binding, []).append(r)
    for k, v in sorted(by.items()):
        print(f"  binding {k:9s}: {len(v):4d} instances, mean {statistics.mean(v):.3f}, worst {min(v):.3f}")


if __name__ == "__main__":
    main()
