"""The demo: a real model-selection workload end to end on an embedded local Ray.

``ray-saturn demo`` (or :func:`run_demo`) trains tiny GPT-style character
models at two widths and two learning rates on the corpus shipped in the
package, plus small CNNs on generated images, through the whole pipeline:

1. start a local Ray (logical GPUs on the CPU when there is no GPU, and it
   says so);
2. profile every task (``ray_saturn.profile``);
3. plan with ``saturn`` and, for comparison, with the ``fifo-whole-node``
   baseline on the same profile;
4. execute with re-planning (``ray_saturn.run``), showing per-task progress;
5. report: a table per task, the makespan next to the lower bound and the
   baseline, and the run folder (plan JSON, events JSONL, checkpoints, a
   Gantt chart PNG of planned against actual).

Example:
    >>> [t.name for t in demo_tasks(steps=10)][:2]
    ['gpt-w32-lr0.001', 'gpt-w32-lr0.003']
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray_saturn.errors import SaturnError
from ray_saturn.plan import Plan
from ray_saturn.profile_table import ProfileTable
from ray_saturn.report import RunReport, gantt_png, render
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

__all__ = ["DemoError", "DemoResult", "demo_tasks", "plan_with_baseline", "run_demo", "watch_progress"]

logger = logging.getLogger(__name__)

#: Strategies the demo lets the profiler try (the others need a real GPU or take long to set up).
DEMO_STRATEGIES = ("single", "ddp")


class DemoError(SaturnError, RuntimeError):
    """The demo cannot run here (a missing piece, a Ray cluster in the way)."""


@dataclass(frozen=True)
class DemoResult:
    """What the demo produced: the report and where its files are."""

    report: RunReport
    run_dir: Path
    gantt: Path
    wall_s: float
    logical_gpus: bool


def demo_tasks(steps: int = 200) -> list[Task]:
    """The demo's workload: 4 GPT variants (2 widths x 2 learning rates) and 2 CNNs."""
    tasks = [
        gpt_task(width=w, lr=lr, depth=2, heads=4, context=32, max_steps=steps, strategies=DEMO_STRATEGIES)
        for w in (32, 64)
        for lr in (1e-3, 3e-3)
    ]
    tasks += [cnn_task(channels=8, lr=lr, max_steps=steps, strategies=DEMO_STRATEGIES) for lr in (3e-3, 1e-2)]
    return tasks


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
    gpus: int = 4,
    steps: int = 200,
    console: Any = None,
    progress: bool = True,
) -> DemoResult:
    """Run the demo into ``out_dir`` on an embedded local Ray and return its report.

    Example:
        >>> # result = run_demo("/tmp/saturn-demo")
        >>> # result.report.realised_makespan_s, result.gantt
    """
    import ray
    import torch
    from rich.console import Console

    from ray_saturn import profile as profile_fn
    from ray_saturn import run as run_fn

    console = console or Console(width=None if sys.stdout.isatty() else 140)
    if gpus < 1:
        raise DemoError(f"--gpus is {gpus}; the demo needs at least 1 (logical) GPU")
    if ray.is_initialized():
        raise DemoError("Ray is already initialised in this process; the demo starts its own local Ray")
    t0 = time.monotonic()
    logical = not torch.cuda.is_available()
    if logical:
        console.print(f"[bold]No GPU found[/]: using {gpus} logical GPUs on the CPU (ray.init(num_gpus={gpus})); "
                      "every 'GPU' is a CPU process training with gloo.")
    else:
        gpus = min(gpus, torch.cuda.device_count())
        console.print(f"Using {gpus} CUDA GPU(s).")
    out = Path(out_dir).resolve()
    run_dir = out / "run"
    out.mkdir(parents=True, exist_ok=True)
    tasks = demo_tasks(steps)
    ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), num_gpus=gpus, include_dashboard=False,
             log_to_driver=False)
    try:
        cluster = ClusterSpec.from_ray()
        console.print(f"Profiling {len(tasks)} tasks ({', '.join(DEMO_STRATEGIES)}) on {cluster.total_gpus} GPUs ...")
        # The profile store caches measurements by performance signature: a second demo run skips them.
        store = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ray_saturn" / DEMO_PROFILE_STORE
        store.parent.mkdir(parents=True, exist_ok=True)
        profile = profile_fn(tasks, cluster, store=str(store))
        profile.write(out / PROFILE_FILE)
        planned, baseline = plan_with_baseline(profile, cluster)
        (out / "planned.json").write_text(planned.to_json(indent=1))
        (out / "baseline-fifo-whole-node.json").write_text(baseline.to_json(indent=1))
        console.print(f"Plan: makespan {planned.makespan_s:.1f}s (lower bound {planned.lower_bound_s:.1f}s); "
                      f"fifo-whole-node would take {baseline.makespan_s:.1f}s. Training ...")
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
    finally:
        ray.shutdown()
    report = RunReport.from_run_dir(run_dir, planned=planned, baseline=baseline)
    gantt = gantt_png(report, run_dir / GANTT_FILE)
    wall = time.monotonic() - t0
    (out / "report.json").write_text(json.dumps({**report.to_dict(), "wall_s": round(wall, 1)}, indent=1))
    render(report, console)
    console.print(f"Run folder: {run_dir} ({PLAN_FILE}, {EVENTS_FILE}, checkpoints under tasks/, {GANTT_FILE}); "
                  f"wall time {wall:.0f}s")
    return DemoResult(report=report, run_dir=run_dir, gantt=gantt, wall_s=wall, logical_gpus=logical)
