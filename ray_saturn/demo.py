"""The demo: a real model-selection workload end to end on an embedded local Ray.

``ray-saturn demo`` (or :func:`run_demo`) trains, through the whole pipeline,

- two wide GPT-style character models (two learning rates, two lengths)
  whose model and Adam state do not fit one (logical) GPU's memory budget,
  so ``single`` and ``ddp`` are ruled out and the planner must shard them
  (``fsdp``; on nodes of one GPU the budget is lifted, see :func:`demo_setup`), and
- two small CNNs on generated images (two learning rates, two lengths) that
  fit one GPU,

each long enough that its training takes at least as long as its start-up:

1. start a local Ray whose logical GPUs the CPU can run (one training process
   per core, :mod:`ray_saturn.runtime.local`; it says what it chose);
2. profile every task (``ray_saturn.profile``): step time, peak memory per
   GPU against the budget, start-up and checkpoint costs;
3. plan with ``saturn`` and, for comparison, with the baselines on the same
   profile;
4. execute with re-planning (``ray_saturn.run``, TorchTrainer segments),
   showing per-task progress;
5. report: a table per task with the realised run next to the plan, the
   makespan next to the lower bound and the baselines, one line saying why
   realised and planned differ, and the run folder (plan JSON, events JSONL,
   checkpoints, a Gantt chart PNG of planned against actual).

Example:
    >>> [t.name for t in demo_tasks()]
    ['gpt-w256-lr0.001', 'gpt-w256-lr0.003', 'cnn-c8-lr0.003', 'cnn-c8-lr0.01']
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray_saturn.defaults import RUN_SOLVER_GAP
from ray_saturn.errors import SaturnError
from ray_saturn.limits import number
from ray_saturn.plan import Plan
from ray_saturn.profile_table import ProfileTable
from ray_saturn.report import RunReport, explain, gantt_png, render
from ray_saturn.runtime.journal import (
    DEMO_PROFILE_STORE,
    EVENTS_FILE,
    GANTT_FILE,
    PLAN_FILE,
    PROFILE_FILE,
    read_local_state,
)
from ray_saturn.spec import ClusterSpec, Task
from ray_saturn.workloads.text import gpt_task
from ray_saturn.workloads.vision import cnn_task

__all__ = [
    "BASELINES",
    "DEMO_MEMORY_GB",
    "DEMO_STRATEGIES",
    "DemoError",
    "DemoResult",
    "DemoSetup",
    "demo_setup",
    "demo_tasks",
    "plan_baselines",
    "plan_with_baseline",
    "run_demo",
    "watch_progress",
]

logger = logging.getLogger(__name__)

#: Strategies the demo lets the profiler try (the others need a real GPU or take long to set up).
DEMO_STRATEGIES = ("single", "ddp", "fsdp")
#: Memory budget per (logical) GPU, GB: the wide GPTs' model and Adam state exceed it unsharded.
DEMO_MEMORY_GB = 0.04
#: The baselines planned on the same profile (contract 2's strongest first).
BASELINES = ("fifo-max-gpus", "fifo-whole-node", "fifo-min-gpus", "optimus-greedy")
#: Steps of each demo task at scale 1 (chosen so training takes longer than start-up on 2 cores).
_STEPS = {"gpt": (90, 120), "cnn": (1500, 2000)}


class DemoError(SaturnError, RuntimeError):
    """The demo cannot run here (a missing piece, a Ray cluster in the way)."""


@dataclass(frozen=True)
class DemoResult:
    """What the demo produced: the report, where its files are, and what it chose."""

    report: RunReport
    run_dir: Path
    gantt: Path
    wall_s: float
    logical_gpus: bool
    gpus_line: str = ""
    profile: ProfileTable | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The object ``ray-saturn demo --json`` prints."""
        r = self.report
        plan = r.planned.by_task() if r.planned is not None else {}
        tasks = []
        for t in r.tasks:
            a = plan.get(t.task)
            tasks.append(
                {
                    "task": t.task,
                    "state": t.state,
                    "strategy": t.strategy,
                    "gpus": t.gpus,
                    "start_s": None if t.start_s is None else round(t.start_s, 3),
                    "end_s": None if t.end_s is None else round(t.end_s, 3),
                    "final_loss": t.final_loss,
                    "segments": len(t.segments),
                    "planned": None if a is None else {
                        "strategy": a.strategy, "gpus": a.gpus, "start_s": round(a.start_s, 3),
                        "end_s": round(a.end_s, 3),
                    },
                }
            )
        return {
            "state": r.state,
            "planned_makespan_s": None if r.planned_makespan_s is None else round(r.planned_makespan_s, 3),
            "realised_makespan_s": round(r.realised_makespan_s, 3),
            "lower_bound_s": None if r.lower_bound_s is None else round(r.lower_bound_s, 3),
            "baselines": {k: round(v, 3) for k, v in r.baselines.items()},
            "replans": r.replans,
            "moves": r.moves,
            "explanation": r.explanation,
            "gpus": self.gpus_line,
            "tasks": tasks,
            "run_dir": str(self.run_dir),
            "wall_s": round(self.wall_s, 1),
        }


@dataclass(frozen=True)
class DemoSetup:
    """What the demo's profile may try on a cluster: strategies, the memory budget per GPU, and why."""

    strategies: tuple[str, ...]
    memory_gb: float | None
    note: str = ""


def demo_setup(gpus_per_node: int, memory_gb: float = DEMO_MEMORY_GB) -> DemoSetup:
    """The strategies and memory budget for the demo on nodes of ``gpus_per_node`` (CUDA or logical) GPUs.

    Strategies that need more GPUs than a node has are left out (no warning per task). With one GPU per
    node the wide GPTs cannot be sharded (and ``spill`` needs an ``nn.Sequential`` model), so the memory
    budget is lifted and the note says so.

    Example:
        >>> demo_setup(1)
        DemoSetup(strategies=('single',), memory_gb=None, note="one GPU per node: ...")
        >>> demo_setup(4).strategies, demo_setup(4).memory_gb
        (('single', 'ddp', 'fsdp'), 0.04)
    """
    from ray_saturn.strategies import get_strategy

    fits = tuple(s for s in DEMO_STRATEGIES if get_strategy(s).min_gpus <= gpus_per_node)
    if gpus_per_node < 2:
        return DemoSetup(fits, None, "one GPU per node: nothing can be sharded, so the GPTs' memory budget is "
                                     "lifted (give --gpus 2 or more to see them sharded)")
    return DemoSetup(fits, memory_gb)


def demo_tasks(
    scale: float = 1.0, *, steps: int | None = None, strategies: tuple[str, ...] = DEMO_STRATEGIES
) -> list[Task]:
    """The demo's workload: 2 wide GPTs that need sharding and 2 small CNNs, of different lengths.

    ``scale`` multiplies every task's steps; ``steps`` gives every task that many instead; ``strategies``
    are the ones the profiler may try (see :func:`demo_setup`).
    """
    scale = number(scale, "scale (a factor of every task's steps)", low=0, low_open=True, error=DemoError)

    def n(family: str, i: int) -> int:
        return steps if steps is not None else max(1, round(_STEPS[family][i] * scale))

    tasks = [
        gpt_task(width=256, depth=4, heads=4, context=32, batch_size=8, lr=lr, max_steps=n("gpt", i),
                 strategies=strategies)
        for i, lr in enumerate((1e-3, 3e-3))
    ]
    tasks += [
        cnn_task(channels=8, lr=lr, max_steps=n("cnn", i), strategies=strategies)
        for i, lr in enumerate((3e-3, 1e-2))
    ]
    return tasks


def plan_baselines(profile: ProfileTable, cluster: ClusterSpec, *, time_limit_s: float = 5.0) -> dict[str, Plan]:
    """Every baseline of :data:`BASELINES` planned for ``profile`` on ``cluster``."""
    from ray_saturn.solver import policy_names, solve

    known = set(policy_names())
    return {p: solve(profile, cluster, p, time_limit_s=time_limit_s) for p in BASELINES if p in known}


def plan_with_baseline(
    profile: ProfileTable, cluster: ClusterSpec, *, time_limit_s: float = 5.0
) -> tuple[Plan, Plan]:
    """The saturn plan and the ``fifo-whole-node`` baseline plan for the same profile."""
    from ray_saturn.solver import solve

    planned = solve(profile, cluster, "saturn", time_limit_s=time_limit_s)
    baseline = solve(profile, cluster, "fifo-whole-node", time_limit_s=time_limit_s)
    return planned, baseline


def watch_progress(
    run_dir: Path, total_steps: dict[str, int], stop: threading.Event, console: Any = None, interval_s: float = 0.5
) -> None:
    """Show a rich progress bar per task from the run folder's state file until ``stop`` is set."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=False,
    ) as progress:
        bars = {t: progress.add_task(f"{t} queued", total=n) for t, n in total_steps.items()}
        while True:
            done = stop.wait(interval_s)
            state = read_local_state(run_dir) or {}
            for name, rec in (state.get("tasks") or {}).items():
                if name not in bars:
                    continue
                where = f"{rec.get('strategy')}x{rec.get('gpus')}" if rec.get("strategy") else ""
                progress.update(bars[name], completed=int(rec.get("steps_done", 0)),
                                description=f"{name} {rec.get('state', '')} {where}".strip())
            if done:
                return


def run_demo(
    out_dir: str | os.PathLike[str],
    *,
    gpus: int | None = None,
    scale: float = 1.0,
    steps: int | None = None,
    console: Any = None,
    progress: bool = True,
    memory_gb: float = DEMO_MEMORY_GB,
) -> DemoResult:
    """Run the demo into ``out_dir`` on an embedded local Ray and return its report.

    ``gpus``: (logical) GPUs of the local Ray (default: up to 4, at most one per core).

    Example:
        >>> # result = run_demo("/tmp/saturn-demo")
        >>> # result.report.realised_makespan_s, result.gantt
    """
    import ray
    from rich.console import Console

    from ray_saturn import profile as profile_fn
    from ray_saturn import run as run_fn
    from ray_saturn.runtime.local import local_gpus, local_ray
    from ray_saturn.solver import solve
    from ray_saturn.solver.objective import solver_policy

    console = console or Console(width=None if sys.stdout.isatty() else 140)
    if ray.is_initialized():
        raise DemoError("Ray is already initialised in this process; the demo starts its own local Ray")
    t0 = time.monotonic()
    lg = local_gpus(gpus)
    console.print(lg.describe())
    out = Path(out_dir).resolve()
    run_dir = out / "run"
    out.mkdir(parents=True, exist_ok=True)
    with local_ray(lg):
        cluster = ClusterSpec.from_ray()
        setup = demo_setup(max(n.gpus for n in cluster.nodes), memory_gb)
        tasks = demo_tasks(scale, steps=steps, strategies=setup.strategies)
        budget = f"memory budget {1000 * setup.memory_gb:.0f} MB per GPU" if setup.memory_gb else "no memory budget"
        if setup.note:
            console.print(f"Note: {setup.note}.")
        console.print(f"Profiling {len(tasks)} tasks ({', '.join(setup.strategies)}; {budget}) "
                      f"on {cluster.total_gpus} GPUs ...")
        # The profile store caches measurements by performance signature: a second demo run skips them.
        store = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ray_saturn" / DEMO_PROFILE_STORE
        store.parent.mkdir(parents=True, exist_ok=True)
        profile = profile_fn(tasks, cluster, store=str(store), memory_limit_gb=setup.memory_gb, warmup=1,
                             steps=3)
        profile.write(out / PROFILE_FILE)
        # The run's own plans stop within its solver gap; the plan shown is made the same way.
        planned = solve(profile, cluster, solver_policy("saturn", gap=RUN_SOLVER_GAP), time_limit_s=5.0)
        baselines = plan_baselines(profile, cluster)
        (out / "planned.json").write_text(planned.to_json(indent=1))
        for name, plan in baselines.items():
            (out / f"baseline-{name}.json").write_text(plan.to_json(indent=1))
        best = min(baselines.values(), key=lambda p: p.makespan_s) if baselines else None
        console.print(f"Plan: makespan {planned.makespan_s:.1f}s (lower bound {planned.lower_bound_s:.1f}s)"
                      + (f"; the best baseline, {best.policy}, {best.makespan_s:.1f}s" if best else "")
                      + ". Training ...")
        stop = threading.Event()
        watcher = None
        if progress:
            watcher = threading.Thread(target=watch_progress, args=(run_dir, {t.name: t.total_steps for t in tasks},
                                                                    stop, console), daemon=True)
            watcher.start()
        try:
            run_fn(tasks, cluster, storage=str(run_dir), profile=profile, name="demo")
        finally:
            stop.set()
            if watcher is not None:
                watcher.join(timeout=5)
    report = RunReport.from_run_dir(run_dir, planned=planned, baseline=best)
    report = _with(report, baselines={k: v.makespan_s for k, v in baselines.items()},
                   explanation=explain(report, profile))
    gantt = gantt_png(report, run_dir / GANTT_FILE)
    wall = time.monotonic() - t0
    result = DemoResult(report=report, run_dir=run_dir, gantt=gantt, wall_s=wall, logical_gpus=not lg.cuda,
                        gpus_line=lg.describe(), profile=profile)
    (out / "report.json").write_text(json.dumps(result.to_json(), indent=1))
    render(report, console)
    console.print(f"Run folder: {run_dir} ({PLAN_FILE}, {EVENTS_FILE}, checkpoints under tasks/, {GANTT_FILE}); "
                  f"wall time {wall:.0f}s")
    return result


def _with(report: RunReport, **changes: Any) -> RunReport:
    from dataclasses import replace

    return replace(report, **changes)
