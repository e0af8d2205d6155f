"""Release benchmark: a real Tuner with ASHA under SaturnScheduler and under plain Tune, executed the same way.

Starts a local Ray cluster of ``--nodes`` nodes with ``--gpus-per-node``
logical GPUs each and runs the same search three times, on the same cluster:

1. ``saturn``: ``SaturnScheduler(ASHA)``, which picks each trial's GPUs, node
   and start order (and may resize running trials);
2. ``plain-1gpu``: plain Tune, ASHA, 1 GPU per trial;
3. ``plain-whole-node``: plain Tune, ASHA, a whole node per trial.

Each trial is an emulated trainable: its config names a task of PROFILE;
it trains that task's steps, sleeping the profile's step time for the GPUs it
was given x ``--time-scale`` per step, reports ``--reports`` times (every
steps/reports steps) with a checkpoint of its step counter, and restarts from
that checkpoint when resized. Its metric is a synthetic learning curve set by
its config (``loss = floor + (1 - floor) exp(-3 r / reports)`` after report
``r``; the floor comes from the config's ``quality``), so curves never cross
and ASHA sees the same curves in all three runs: the search space is sampled
with the same seed (``BasicVariantGenerator(random_state=seed)``). Only tasks
that have a feasible single-node row on 1 GPU and on a whole node are drawn
(both plain runs can execute them); the others are skipped and counted.

Reported per run (times in profile seconds: wall seconds / time scale):
``search_time_s`` (``Tuner.fit()`` from start to end), ``best_metric`` (the
best trial's last loss), ``trials``, ``errored``, ``moves``,
``resizes_that_changed_size``, ``max_gpus_in_use`` (most GPUs held by running
trials, sampled every Tune step), ``max_hook_ms`` (the longest time spent in
any scheduler hook, wall milliseconds; for plain Tune, ASHA's own hooks, timed
the same way), and more detail (wall time, re-plans, measured restart cost,
background solves).

Usage:
    python release/pollux.py --sweep cifar10,deepspeech2,ncf,bert --gpus-per-node 4 -o sweep.csv
    python release/tune_benchmark.py sweep.csv --nodes 2 --gpus-per-node 4 --num-samples 32 \\
        --time-scale 0.004 --seed 0 --json
    python release/tune_benchmark.py sweep.csv ... --seed S --details runs/seed-S.json   # one per seed
    python release/tune_benchmark.py --summarize runs/seed-*.json

``--reuse-actors`` runs all three with ``TuneConfig(reuse_actors=True)``
(Tune's default is False): a finished trial's actor trains the next trial of
the same resources, with no new actor's start-up.

``--stops fixed`` replaces ASHA's decisions (not its rungs, which
SaturnScheduler plans by) with a stop at a report fixed by the trial's config
alone (:func:`fixed_quota`: the rungs synchronous successive halving over the
population would let it reach), so the three runs train exactly the same
reports and the ratio is the scheduling's alone.

One run per seed is not a verdict: ASHA's promotions depend on the order in
which results arrive, so the same seed gives plain Tune search times 1.7x
apart from one invocation to the next. ``--summarize`` takes the
``--details`` files of several invocations and prints, per file and over
them, saturn / the better plain Tune (per run, its mean and standard error)
and the ratio of the mean search times.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ray_saturn import ProfileTable
from ray_saturn.errors import SaturnError

RUNS = ("saturn", "plain-1gpu", "plain-whole-node")
#: ``saturn@<objective>`` runs saturn with another objective than ``--objective`` (extra keys in the JSON).
OBJECTIVES = ("makespan", "completion", "online")
CPUS_PER_TRIAL = 0.5


def _fail(msg: str) -> None:
    print(f"tune_benchmark: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def eligible_tasks(table: ProfileTable, gpus_per_node: int) -> tuple[dict[str, dict[int, float]], dict[str, int]]:
    """Per task that runs on 1 GPU and on a whole node: step time per single-node GPU count, and steps."""
    rows: dict[str, dict[int, float]] = {}
    steps: dict[str, int] = {}
    for task in table.tasks:
        per = {
            c.gpus: float(c.step_time_s)
            for c in table.configs(task, feasible_only=True)
            if c.nodes == 1 and c.gpus <= gpus_per_node
        }
        if 1 in per and gpus_per_node in per:
            rows[task] = per
            steps[task] = max(c.steps for c in table.configs(task))
    return rows, steps


def estimate_rows(table: ProfileTable, task: str, gpus_per_node: int, time_scale: float) -> list[dict[str, Any]]:
    """The task's single-node rows in wall seconds (the trials sleep step time x time scale)."""
    out = []
    for c in table.configs(task):
        if c.nodes != 1 or c.gpus > gpus_per_node:
            continue
        strategy = "single" if c.gpus == 1 else "ddp"  # the emulated trial runs any strategy; name a runnable one
        out.append(
            {
                "strategy": strategy,
                "gpus": c.gpus,
                "steps": c.steps,
                "feasible": c.feasible,
                "step_time_s": None if c.step_time_s is None else c.step_time_s * time_scale,
            }
        )
    return out


def curve(config: dict[str, Any], report: int, reports: int) -> float:
    floor = 0.1 + 0.8 * float(config["quality"])
    return floor + (1.0 - floor) * math.exp(-3.0 * report / reports)


def fixed_quota(quality: float, reports: int, reduction_factor: int) -> int:
    """Reports a trial of this ``quality`` trains under ``--stops fixed``: halving on the population, not the order.

    Qualities are uniform on [0, 1) and a lower one is a better curve at every
    report (curves never cross), so synchronous successive halving over the
    whole population keeps the best ``1 / rf**j`` of trials at rung ``rf**j``:
    a trial reaches that rung when ``quality < rf**-j``. Past the last rung
    below ``reports`` it trains to the end, as ASHA's promoted trials do.

    Example:
        >>> [fixed_quota(q, 16, 2) for q in (0.7, 0.3, 0.2, 0.1, 0.05)]
        [1, 2, 4, 8, 16]
    """
    rung, j = 1, 0
    while rung < reports and quality < reduction_factor ** -(j + 1):
        j += 1
        rung = min(reports, reduction_factor**j)
    return rung


def report_every(steps: int, reports: int) -> int:
    """Steps between two reports of an emulated trial of ``steps`` steps reporting ``reports`` times."""
    return max(1, math.ceil(steps / reports))


def work_bound(
    configs: list[dict[str, Any]],
    rows: dict[str, dict[int, float]],
    steps: dict[str, int],
    reports: int,
    reduction_factor: int,
    total_gpus: int,
) -> float:
    """A lower bound (profile s) on any scheduler's search time for ``--stops fixed``, start-ups left out.

    Under fixed stops the work is known in hindsight: each trial trains its
    :func:`fixed_quota` of reports (a report is ``ceil(steps / reports)``
    steps). No scheduler ends before the longest trial does on its fastest
    row, nor before the cluster's GPUs have done every trial's work at its
    most GPU-efficient row (fewest GPU-seconds). The scheduler does not know
    the quotas, and every launch costs seconds that the bound leaves out, so
    it is a floor, not a target: it says how much of a search time is left
    to gain by scheduling at all.

    Example:
        >>> rows, steps = {"a": {1: 1.0, 2: 0.6}}, {"a": 16}
        >>> # One trains all 16 steps (0.6 s each on 2 GPUs at best), the other 1: max(16 * 0.6, 17 * 1.0 / 2).
        >>> work_bound([{"task": "a", "quality": 0.01}, {"task": "a", "quality": 0.9}], rows, steps, 16, 2, 2)
        9.6
    """
    area, longest = 0.0, 0.0
    for config in configs:
        task = config["task"]
        every = report_every(steps[task], reports)
        trained = min(steps[task], every * fixed_quota(float(config["quality"]), reports, reduction_factor))
        per = rows[task]
        area += trained * min(g * t for g, t in per.items())
        longest = max(longest, trained * min(per.values()))
    return max(area / total_gpus, longest)


def _asha(reports: int, reduction_factor: int, fixed: bool = False):
    """The base scheduler: ASHA over ``reports`` reports, or (``fixed``) ASHA with its stop decisions
    replaced by :func:`fixed_quota`, whatever order results come in.

    The fixed one is an ``ASHAScheduler`` built with the same arguments, so it
    has ASHA's rungs and SaturnScheduler plans its trials exactly as under ASHA
    (their expected horizon by rung, and their standing at the rungs, which it
    records as ASHA does); only the decision at a rung no longer depends on
    which trials got there first.
    """
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    class FixedStops(ASHAScheduler):
        def on_trial_result(self, tune_controller, trial, result):
            super().on_trial_result(tune_controller, trial, result)  # ASHA records the rung results as ever
            quota = fixed_quota(float(trial.config["quality"]), reports, reduction_factor)
            return TrialScheduler.STOP if int(result["report"]) >= quota else TrialScheduler.CONTINUE

    cls = FixedStops if fixed else ASHAScheduler
    return cls(time_attr="report", max_t=reports, grace_period=1, reduction_factor=reduction_factor)


def make_trainable(
    rows: dict[str, dict[int, float]], steps: dict[str, int], time_scale: float, reports: int, fixed_gpus: int | None
):
    """The emulated trainable (see the module docstring); ``fixed_gpus`` for plain Tune, else saturn's decision."""

    def emulated_trial(config: dict[str, Any]) -> None:
        from ray import tune
        from ray.tune import Checkpoint

        from ray_saturn.tune import trial_decision

        task = config["task"]
        if fixed_gpus is None:
            decision = trial_decision(config)
            gpus, strategy = decision.gpus, decision.strategy
        else:
            gpus, strategy = fixed_gpus, "plain"
        if gpus not in rows[task]:
            raise RuntimeError(f"task {task} has no feasible row on {gpus} GPU(s)")
        step_s = rows[task][gpus] * time_scale
        total = steps[task]
        every = report_every(total, reports)
        step = 0
        ck = tune.get_checkpoint()
        if ck is not None:
            with ck.as_directory() as d:
                step = int(json.loads(Path(d, "step.json").read_text())["step"])
        while step < total:
            n = min(every, total - step)
            time.sleep(n * step_s)
            step += n
            report = math.ceil(step / every)
            with tempfile.TemporaryDirectory() as d:
                Path(d, "step.json").write_text(json.dumps({"step": step}))
                tune.report(
                    {
                        "loss": curve(config, report, reports),
                        "saturn_gpus": gpus,
                        "saturn_strategy": strategy,
                        "report": report,
                        "saturn_step": step,
                        "saturn_step_time_s": step_s,
                        "saturn_total_steps": total,
                    },
                    checkpoint=Checkpoint.from_directory(d),
                )

    return emulated_trial


def _timed(base):
    """``base`` with every hook timed the same way SaturnScheduler times its own."""
    from ray.tune.schedulers import TrialScheduler

    class Timed(TrialScheduler):
        def __init__(self):
            super().__init__()
            self.max_ms = 0.0

        def _t(self, fn, *a):
            t0 = time.perf_counter()
            try:
                return fn(*a)
            finally:
                self.max_ms = max(self.max_ms, 1000 * (time.perf_counter() - t0))

        @property
        def metric(self):
            return base.metric

        def set_search_properties(self, metric, mode, **spec):
            return base.set_search_properties(metric, mode, **spec)

        def on_trial_add(self, tc, trial):
            return self._t(base.on_trial_add, tc, trial)

        def on_trial_error(self, tc, trial):
            return self._t(base.on_trial_error, tc, trial)

        def on_trial_result(self, tc, trial, result):
            return self._t(base.on_trial_result, tc, trial, result)

        def on_trial_complete(self, tc, trial, result):
            return self._t(base.on_trial_complete, tc, trial, result)

        def on_trial_remove(self, tc, trial):
            return self._t(base.on_trial_remove, tc, trial)

        def choose_trial_to_run(self, tc):
            return self._t(base.choose_trial_to_run, tc)

        def debug_string(self):
            return base.debug_string()

    return Timed()


def _gpu_tracker():
    from ray import tune
    from ray.tune.experiment import Trial

    class GpuTracker(tune.Callback):
        """Most GPUs held by RUNNING trials, sampled at every Tune step; every result, for --details."""

        def __init__(self):
            self.max_gpus = 0.0
            self.t0 = time.monotonic()
            self.timeline: list[dict[str, Any]] = []

        def on_step_end(self, iteration, trials, **info):
            used = sum(
                t.placement_group_factory.required_resources.get("GPU", 0) for t in trials if t.status == Trial.RUNNING
            )
            self.max_gpus = max(self.max_gpus, used)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.timeline.append(
                {
                    "wall_s": round(time.monotonic() - self.t0, 2),
                    "trial": trial.trial_id,
                    "task": trial.config["task"],
                    "gpus": result.get("saturn_gpus"),
                    "report": result.get("report"),
                    "loss": round(result.get("loss", 0.0), 4),
                }
            )

    return GpuTracker()


def run_search(kind: str, table: ProfileTable, args, rows, steps, storage: str) -> dict[str, Any]:
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from ray_saturn.tune import SaturnScheduler

    base = _asha(args.reports, args.reduction_factor, fixed=args.stops == "fixed")
    tasks = sorted(rows)
    fixed = None if kind.startswith("saturn") else (1 if kind == "plain-1gpu" else args.gpus_per_node)
    trainable = make_trainable(rows, steps, args.time_scale, args.reports, fixed)
    saturn = None
    if kind.startswith("saturn"):
        saturn = SaturnScheduler(
            lambda config: estimate_rows(table, config["task"], args.gpus_per_node, args.time_scale),
            base_scheduler=base,
            objective=kind.partition("@")[2] or args.objective,
            restart_s=args.restart_s,
            cpus_per_trial=CPUS_PER_TRIAL,
            solver_time_limit_s=args.solver_time_limit,
            start_order=args.start_order,
        )
        scheduler = saturn
    else:
        gpus = 1 if kind == "plain-1gpu" else args.gpus_per_node
        trainable = tune.with_resources(trainable, {"cpu": CPUS_PER_TRIAL, "gpu": gpus})
        scheduler = _timed(base)
    tracker = _gpu_tracker()
    tuner = tune.Tuner(
        trainable,
        param_space={"task": tune.choice(tasks), "quality": tune.uniform(0.0, 1.0)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=args.num_samples,
            scheduler=scheduler,
            search_alg=BasicVariantGenerator(random_state=args.seed),
            reuse_actors=args.reuse_actors,  # Tune's default: False
        ),
        run_config=tune.RunConfig(name=kind, storage_path=storage, verbose=0, callbacks=[tracker]),
    )
    t0 = time.monotonic()
    grid = tuner.fit()
    wall = time.monotonic() - t0
    finals = [r.metrics["loss"] for r in grid if r.metrics and "loss" in r.metrics]
    out: dict[str, Any] = {
        "search_time_s": round(wall / args.time_scale, 1),
        "best_metric": round(min(finals), 6) if finals else None,
        "trials": len(grid),
        "errored": len(grid.errors),
        "moves": 0,
        "resizes_that_changed_size": 0,
        "max_gpus_in_use": int(tracker.max_gpus),
        "max_hook_ms": None,
        "wall_s": round(wall, 2),
        "completed_reports": sum(int(r.metrics.get("report", 0)) for r in grid if r.metrics),
        "stops": args.stops,
        "reuse_actors": args.reuse_actors,
    }
    if args.stops == "fixed":
        configs = [r.config for r in grid]
        bound = work_bound(configs, rows, steps, args.reports, args.reduction_factor, args.nodes * args.gpus_per_node)
        out["work_bound_s"] = round(bound, 1)
    if saturn is not None:
        saturn.close()
        st = saturn.stats()
        out.update(
            moves=st.moves,
            resizes_that_changed_size=st.resizes_that_changed_size,
            max_hook_ms=round(st.max_hook_ms, 1),
            replans=st.replans,
            restart_s_measured=round(st.restart_s / args.time_scale, 1),
            hook_ms={k: round(v, 1) for k, v in st.hook_ms.items()},
            hook_cpu_ms={k: round(v, 1) for k, v in st.hook_cpu_ms.items()},
            hook_process_cpu_ms={k: round(v, 1) for k, v in st.hook_process_cpu_ms.items()},
            planner=st.planner,
            scheduler_max_gpus_in_use=st.max_gpus_in_use,
            launch_latencies_s=st.launch_latencies_s,
            reused_actor_launches=st.reused_actor_launches,
            move_list=[m.describe() for m in saturn.moves],
        )
    else:
        out["max_hook_ms"] = round(scheduler.max_ms, 1)
    if grid.errors:
        out["first_error"] = str(grid.errors[0]).strip().splitlines()[-1][:300]
    out["_timeline"] = tracker.timeline
    return out


def summarize(paths: list[str]) -> int:
    """The table of several invocations' ``--details`` files (see the module docstring)."""
    import statistics

    rows = []
    for path in paths:
        try:
            d = json.loads(Path(path).read_text())
            s, plain = d["saturn"], [d[k] for k in ("plain-1gpu", "plain-whole-node") if k in d]
        except (OSError, ValueError, KeyError) as exc:
            _fail(f"{path}: not a --details file of a run with saturn and plain Tune ({exc})")
        if not plain:
            _fail(f"{path}: no plain Tune run in it")
        better = min(p["search_time_s"] for p in plain)
        rows.append((path, s, plain, better))
        same = all(p["best_metric"] == s["best_metric"] for p in plain)
        print(f"{path}: saturn {s['search_time_s']:.0f} s, better plain {better:.0f} s, ratio "
              f"{s['search_time_s'] / better:.3f}; same best metric: {same}; errored {s['errored']}; "
              f"moves {s['moves']} ({s['resizes_that_changed_size']} changed size); max hook {s['max_hook_ms']} ms")
        if s.get("work_bound_s"):
            wb = s["work_bound_s"]
            print(f"  work bound (--stops fixed) {wb:.0f} s: saturn {s['search_time_s'] / wb:.2f}x of it, "
                  f"better plain {better / wb:.2f}x")
    ratios = [s["search_time_s"] / b for _, s, _, b in rows]
    mean = statistics.mean(ratios)
    se = f"{statistics.stdev(ratios) / math.sqrt(len(ratios)):.3f}" if len(ratios) > 1 else "- (one run)"
    of_means = statistics.mean(s["search_time_s"] for _, s, _, _ in rows) / statistics.mean(b for *_, b in rows)
    print(f"{len(rows)} runs: saturn / better plain Tune per run: mean {mean:.3f} (standard error {se}), "
          f"min {min(ratios):.3f}, max {max(ratios):.3f}; mean saturn / mean better plain: {of_means:.3f}")
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--summarize":
        if len(sys.argv) < 3:
            _fail("--summarize takes the --details files of one or more runs")
        return summarize(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--num-samples", type=int, default=32)
    ap.add_argument("--time-scale", type=float, default=0.004, help="wall seconds per profile second")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reports", type=int, default=16, help="reports per trial (ASHA's max_t)")
    ap.add_argument("--reduction-factor", type=int, default=2, help="ASHA's reduction factor")
    ap.add_argument(
        "--restart-s", type=float, default=2.0, help="saturn's restart cost in wall seconds until it has measured one"
    )
    ap.add_argument("--start-order", default="searcher", choices=("searcher", "plan"),
                    help="saturn's start order (SaturnScheduler(start_order=...))")
    ap.add_argument("--stops", default="asha", choices=("asha", "fixed"),
                    help="who stops trials: ASHA (decisions depend on the order results arrive), or 'fixed': ASHA's "
                         "rungs, each trial stopped where halving over the population would stop it (same work "
                         "in every run)")
    ap.add_argument("--solver-time-limit", type=float, default=0.5, help="saturn's background solve limit (s)")
    ap.add_argument("--reuse-actors", action="store_true",
                    help="every run reuses a finished trial's actor for the next trial of the same resources "
                         "(TuneConfig(reuse_actors=True); Tune's default is False)")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {', '.join(RUNS)}")
    ap.add_argument("--objective", default="makespan", help=f"saturn's objective ({', '.join(OBJECTIVES)})")
    ap.add_argument("--details", default=None, help="write every trial's timeline per run to this JSON file")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    for name in ("nodes", "gpus_per_node", "num_samples", "reports", "reduction_factor"):
        if getattr(args, name) < 1:
            _fail(f"--{name.replace('_', '-')} is {getattr(args, name)}; give a whole number >= 1")
    if args.reduction_factor < 2:
        _fail("--reduction-factor must be at least 2")
    if not (args.time_scale > 0 and math.isfinite(args.time_scale)):
        _fail(f"--time-scale is {args.time_scale}; give a positive number")
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    known = set(RUNS) | {f"saturn@{o}" for o in OBJECTIVES}
    if not runs or any(r not in known for r in runs):
        _fail(f"--runs {args.runs!r}: choose from {', '.join(RUNS)} (or saturn@OBJECTIVE)")
    if args.objective not in OBJECTIVES:
        _fail(f"--objective {args.objective!r}: choose from {', '.join(OBJECTIVES)}")
    try:
        table = ProfileTable.read(args.profile)
    except SaturnError as exc:
        _fail(str(exc))
    rows, steps = eligible_tasks(table, args.gpus_per_node)
    if not rows:
        _fail(f"{args.profile}: no task has a feasible single-node row on 1 GPU and on {args.gpus_per_node} GPUs")
    skipped = len(table.tasks) - len(rows)

    from ray_saturn.runtime.emulation import emulated_cluster

    results: dict[str, Any] = {}
    with emulated_cluster(args.nodes, args.gpus_per_node), tempfile.TemporaryDirectory() as storage:
        for kind in runs:
            results[kind] = run_search(kind, table, args, rows, steps, os.path.join(storage, kind))
            if not args.json:
                shown = {k: v for k, v in results[kind].items() if k != "_timeline"}
                print(f"{kind}: {json.dumps(shown)}", flush=True)
    if args.details:
        Path(args.details).write_text(json.dumps(results, indent=1))
    for r in results.values():
        r.pop("_timeline", None)
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"\n{len(rows)} tasks drawn from ({skipped} skipped: not runnable on 1 GPU and on a whole node)")
    print(
        f"{'run':<18}{'search s':>10}{'best':>10}{'trials':>8}{'errored':>8}{'moves':>7}{'resized':>8}"
        f"{'max GPUs':>9}{'max hook ms':>12}"
    )
    for kind, r in results.items():
        hook = "-" if r["max_hook_ms"] is None else f"{r['max_hook_ms']:.1f}"
        print(
            f"{kind:<18}{r['search_time_s']:>10.0f}{r['best_metric']:>10.4f}{r['trials']:>8}{r['errored']:>8}"
            f"{r['moves']:>7}{r['resizes_that_changed_size']:>8}{r['max_gpus_in_use']:>9}{hook:>12}"
        )
    plain = [results[k]["search_time_s"] for k in ("plain-1gpu", "plain-whole-node") if k in results]
    if "saturn" in results and plain:
        print(f"saturn / better plain Tune: {results['saturn']['search_time_s'] / min(plain):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
