"""A model of ``tune_benchmark.py``'s search: how far can any start order and GPU rule get under ASHA?

This is an analysis aid, not a figure of the product: it runs no Tuner and no
SaturnScheduler. It replays the benchmark's search many times in simulated
time, to see what order and GPU choices can buy *in expectation* when ASHA's
path changes with the order in which results arrive:

- trials as in the benchmark: ``--num-samples`` configs, each a task of the
  profile (the tasks that run on 1 GPU and on a whole node) and a quality,
  drawn with ``random.Random(seed)`` (not the benchmark's generator, so a
  model seed is not the benchmark seed of the same number); the metric is the
  benchmark's own learning curve (``tune_benchmark.curve``), ``--reports``
  reports per trial;
- ASHA's rule is Ray's own (``ray.tune.schedulers.async_hyperband._Bracket``,
  grace period 1, ``max_t`` = reports, reduction factor 2): a trial reaching
  a rung goes on if it is no worse than the median of those recorded there
  before it, so the first to reach a rung always goes on;
- every trial start costs ``--startup-core-s`` of CPU work, shared by all the
  starts in flight over ``--cores`` cores (a Ray actor per trial on this
  machine: 3-11 wall s, 2 cores); a resize pays a start again;
- the cluster is ``--nodes`` x ``--gpus-per-node``; a trial's GPUs are on one
  node.

Policies: ``plain-1gpu`` and ``plain-whole-node`` (Tune's order, fixed GPUs),
and every combination of a start order (``fifo``: Tune's; ``long``: longest
fastest-run first; ``long8``: the 8 longest first, then Tune's; ``inter``:
longest and shortest alternately; ``cheap``: shortest first), a GPU rule
(``e0.75``/``e0.85``: the widest single-node row whose efficiency against
1 GPU is at least that, fewer GPUs if that many are not free) and growth
(``grow``: with no trial waiting, a trial at a report takes more GPUs on its
node when the time saved beats 1.2 starts).

Printed per policy over the seeds: the mean search time (profile seconds),
E[policy] / E[better plain] (the better plain Tune by mean), the mean,
median and 90th percentile of the per-seed ratio to that seed's better plain
Tune (the benchmark's figure).

Usage:
    python release/pollux.py --sweep cifar10,deepspeech2,ncf,bert --gpus-per-node 4 -o sweep.csv
    python release/tune_asha_model.py sweep.csv --seeds 150
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tune_benchmark import curve, eligible_tasks

from ray_saturn import ProfileTable

Order = Callable[[list[int], list[tuple[str, float]]], list[int]]


class Model:
    def __init__(self, rows: dict[str, dict[int, float]], steps: dict[str, int], args):
        self.rows, self.steps, self.args = rows, steps, args
        self.startup_s = args.startup_core_s / args.time_scale  # profile seconds of one start alone

    def report_time(self, task: str, gpus: int, r: int) -> float:
        total = self.steps[task]
        every = max(1, math.ceil(total / self.args.reports))
        return max(0, min(every, total - (r - 1) * every)) * self.rows[task][gpus]

    def fastest(self, task: str) -> float:
        return min(self.rows[task].values()) * self.steps[task]

    def width(self, task: str, eff: float) -> int:
        r = self.rows[task]
        return max(g for g in r if r[1] / r[g] / g >= eff)

    def search(self, trials: list[tuple[str, float]], order: Order, width: Callable[[str], int], grow: bool) -> float:
        """The simulated search time of one policy on ``trials`` (profile seconds)."""
        from ray.tune.schedulers import TrialScheduler
        from ray.tune.schedulers.async_hyperband import _Bracket

        a = self.args
        bracket = _Bracket(1, a.reports, 2, 0)
        free = [a.gpus_per_node] * a.nodes
        pending = order(list(range(len(trials))), trials)
        now, done = 0.0, 0
        starting: dict[int, float] = {}  # trial -> CPU work left of its start (profile s alone)
        running: dict[int, list] = {}  # trial -> [gpus, node, time of its next report or None, next report]
        while done < len(trials):
            while pending:
                i = pending[0]
                task = trials[i][0]
                node = max(range(a.nodes), key=lambda n: free[n])
                g = next((g for g in sorted(self.rows[task], reverse=True) if g <= width(task) and g <= free[node]),
                         None)
                if g is None:
                    break
                pending.pop(0)
                free[node] -= g
                starting[i] = self.startup_s
                running[i] = [g, node, None, 1]
            rate = min(1.0, a.cores / len(starting)) if starting else 0.0
            events = [(left / rate, 0, i) for i, left in starting.items()]
            events += [(t - now, 1, i) for i, (_, _, t, _) in running.items() if t is not None]
            dt, kind, i = min(events)
            for k in starting:
                starting[k] -= dt * rate
            now += dt
            g, node, _, r = running[i]
            task = trials[i][0]
            if kind == 0:  # started
                del starting[i]
                running[i][2] = now + self.report_time(task, g, r)
                continue
            action = bracket.on_result(SimpleNamespace(trial_id=str(i)), r, -curve({"quality": trials[i][1]}, r,
                                                                                     a.reports))
            if action == TrialScheduler.STOP or r >= a.reports:
                del running[i]
                free[node] += g
                done += 1
                continue
            if grow and not pending:
                left = [self.report_time(task, g, x) for x in range(r + 1, a.reports + 1)]
                best = None
                for g2 in self.rows[task]:
                    if g2 <= g or free[node] < g2 - g:
                        continue
                    gain = sum(left) - sum(self.report_time(task, g2, x) for x in range(r + 1, a.reports + 1))
                    gain -= 1.2 * self.startup_s
                    if gain > 0 and (best is None or gain > best[0]):
                        best = (gain, g2)
                if best is not None:
                    free[node] -= best[1] - g
                    running[i] = [best[1], node, None, r + 1]
                    starting[i] = self.startup_s
                    continue
            running[i][3] = r + 1
            running[i][2] = now + self.report_time(task, g, r + 1)
        return now


def policies(model: Model) -> dict[str, tuple[Order, Callable[[str], int], bool]]:
    def fifo(ps, tr):
        return ps

    def longest(ps, tr):
        return sorted(ps, key=lambda i: -model.fastest(tr[i][0]))

    def long8(ps, tr):
        head = longest(ps, tr)[:8]
        return head + [i for i in ps if i not in head]

    def inter(ps, tr):
        s, out = longest(ps, tr), []
        while s:
            out.append(s.pop(0))
            if s:
                out.append(s.pop())
        return out

    def cheap(ps, tr):
        return list(reversed(longest(ps, tr)))

    out = {"plain-1gpu": (fifo, lambda t: 1, False),
           "plain-whole-node": (fifo, lambda t: model.args.gpus_per_node, False)}
    for eff in (0.75, 0.85):
        for name, order in (("fifo", fifo), ("long", longest), ("long8", long8), ("inter", inter), ("cheap", cheap)):
            for grow in (False, True):
                out[f"{name}-e{eff}{'-grow' if grow else ''}"] = (order, lambda t, e=eff: model.width(t, e), grow)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--num-samples", type=int, default=32)
    ap.add_argument("--reports", type=int, default=16)
    ap.add_argument("--time-scale", type=float, default=0.004, help="wall seconds per profile second")
    ap.add_argument("--startup-core-s", type=float, default=3.0, help="CPU seconds of one trial start")
    ap.add_argument("--cores", type=float, default=2.0)
    ap.add_argument("--seeds", type=int, default=150)
    args = ap.parse_args()
    rows, steps = eligible_tasks(ProfileTable.read(args.profile), args.gpus_per_node)
    if not rows:
        raise SystemExit(f"tune_asha_model: error: {args.profile}: no task runs on 1 GPU and on a whole node")
    model = Model(rows, steps, args)
    tasks = sorted(rows)
    pols = policies(model)
    times: dict[str, list[float]] = {k: [] for k in pols}
    for seed in range(args.seeds):
        rng = random.Random(seed)
        trials = [(rng.choice(tasks), rng.random()) for _ in range(args.num_samples)]
        for k, (order, width, grow) in pols.items():
            times[k].append(model.search(trials, order, width, grow))
    plain = ("plain-1gpu", "plain-whole-node")
    better = min(plain, key=lambda k: statistics.mean(times[k]))
    per_seed_best = [min(a, b) for a, b in zip(times[plain[0]], times[plain[1]], strict=True)]
    print(f"{args.seeds} seeds; better plain Tune by mean: {better}; start-up {args.startup_core_s} core-s")
    print(f"{'policy':<22}{'mean s':>9}{'E/E[plain]':>12}{'ratio mean':>12}{'median':>8}{'p90':>8}")
    for k, ts in times.items():
        ratios = sorted(t / b for t, b in zip(ts, per_seed_best, strict=True))
        p90 = ratios[int(0.9 * len(ratios))]
        print(f"{k:<22}{statistics.mean(ts):>9.0f}{statistics.mean(ts) / statistics.mean(times[better]):>12.3f}"
              f"{statistics.mean(ratios):>12.3f}{statistics.median(ratios):>8.3f}{p90:>8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
