"""Where the CPU of SaturnScheduler's hooks goes, part by part, in one Tune benchmark run.

    python release/tune_hook_breakdown.py PROFILE [tune_benchmark.py's options] --runs saturn

runs ``release/tune_benchmark.py`` with the same options and, for every hook call, records its
wall time and its thread's CPU time, and the CPU of the parts it spent in: building the
re-plan input (``Controller._input``), quick plans (``BackgroundPlanner.__call__``), handing a
solve to the background (``flush``), taking a finished one in (``poll``), dispatch and release.
After the run (Ray shut down, nothing else running) it times every quick plan of the run again
with the same inputs, so the CPU a quick plan costs inside the run can be set beside what the same
call costs on an idle machine. It prints one JSON object.

A diagnostic: it wraps private methods of ray_saturn.tune and ray_saturn.control, so it follows
them when they change.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import re
import runpy
import sys
import time
from pathlib import Path
from typing import Any

import ray_saturn.control.controller as controller
import ray_saturn.tune._planner as planner
import ray_saturn.tune._scheduler as scheduler

#: (label, class, method) of the parts whose CPU is recorded per hook call.
PARTS = (
    ("input", controller.Controller, "_input"),
    ("quick_plan", planner.BackgroundPlanner, "__call__"),
    ("flush", planner.BackgroundPlanner, "flush"),
    ("poll", planner.BackgroundPlanner, "poll"),
    ("dispatch", controller.Controller, "_dispatch"),
    ("release", scheduler.SaturnScheduler, "_release"),
)
#: Hook calls listed in the output, slowest first.
SHOWN = 8


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


def _kind(reason: str) -> str:
    """A re-plan's reason without its trial ids and figures, so that reasons of one kind count together."""
    return re.sub(r"[0-9a-f]{5}_[0-9]{5}|[-+]?[0-9][0-9.]*", "#", reason)[:80]


def main() -> int:
    parts: dict[str, float] = {}
    calls: list[dict[str, Any]] = []
    quick_inputs: list[tuple[tuple, dict]] = []
    in_run: list[float] = []
    schedulers: dict[int, Any] = {}  # every SaturnScheduler whose hooks ran, by id

    def wrap(label: str, cls: type, name: str) -> None:
        orig = getattr(cls, name)

        @functools.wraps(orig)
        def timed(*a, **k):
            c0 = time.thread_time()
            try:
                return orig(*a, **k)
            finally:
                parts[label] = parts.get(label, 0.0) + time.thread_time() - c0

        setattr(cls, name, timed)

    for label, cls, name in PARTS:
        wrap(label, cls, name)
    orig_quick = planner.quick_plan

    def quick_plan(*a, **k):
        quick_inputs.append((a, k))
        c0 = time.thread_time()
        try:
            return orig_quick(*a, **k)
        finally:
            in_run.append(time.thread_time() - c0)

    planner.quick_plan = quick_plan
    orig_hook = scheduler.SaturnScheduler._hook

    @contextlib.contextmanager
    def hook(self, name: str):
        schedulers[id(self)] = self
        parts.clear()
        t0, c0 = time.perf_counter(), time.thread_time()
        with orig_hook(self, name):
            yield
        calls.append({"hook": name, "wall_ms": _ms(time.perf_counter() - t0), "cpu_ms": _ms(time.thread_time() - c0),
                      **{k: _ms(v) for k, v in parts.items() if v > 0}})

    scheduler.SaturnScheduler._hook = hook
    bench = Path(__file__).with_name("tune_benchmark.py")
    sys.argv = [str(bench), *sys.argv[1:]]
    if "--json" not in sys.argv:
        sys.argv.append("--json")
    with contextlib.redirect_stdout(sys.stderr):  # the benchmark's own JSON goes to stderr; ours to stdout
        try:
            runpy.run_path(str(bench), run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (0, None):
                return int(exc.code) if isinstance(exc.code, int) else 2
    if not calls:
        print("no SaturnScheduler hook ran: give --runs saturn", file=sys.stderr)
        return 2
    alone = []
    for a, k in quick_inputs:
        t0 = time.thread_time()
        orig_quick(*a, **k)
        alone.append(time.thread_time() - t0)
    totals: dict[str, float] = {}
    for c in calls:
        for label, _, _ in PARTS:
            totals[label] = totals.get(label, 0.0) + c.get(label, 0.0)
    controllers = [sched.controller for sched in schedulers.values() if sched.controller is not None]
    reasons = collections.Counter(_kind(r) for ctl in controllers for record in ctl.replans for r in record.reasons)
    by_wall = sorted(calls, key=lambda c: -c["wall_ms"])
    by_cpu = sorted(calls, key=lambda c: -c["cpu_ms"])
    out = {
        "hook_calls": len(calls),
        "hooks_wall_ms": round(sum(c["wall_ms"] for c in calls)),
        "hooks_cpu_ms": round(sum(c["cpu_ms"] for c in calls)),
        "parts_cpu_ms": {k: round(v) for k, v in totals.items()},
        "replans": sum(len(ctl.replans) for ctl in controllers),
        "replan_reasons": dict(reasons.most_common()),
        "slowest_by_wall": by_wall[:SHOWN],
        "slowest_by_cpu": by_cpu[:SHOWN],
        "quick_plans": len(quick_inputs),
        "quick_plan_cpu_ms_in_run": {"mean": _ms(sum(in_run) / max(1, len(in_run))),
                                     "max": _ms(max(in_run, default=0.0))},
        "quick_plan_cpu_ms_alone": {"mean": _ms(sum(alone) / max(1, len(alone))), "max": _ms(max(alone, default=0.0))},
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
