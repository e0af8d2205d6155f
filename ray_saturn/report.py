"""Reports of a finished run: a table per task, makespans against bounds and baselines, a Gantt chart.

Reads the run folder the runtime writes (its state file, see
:mod:`ray_saturn.runtime.journal`: per task its state, loss and
:class:`~ray_saturn.control.Segment` s, ``{"strategy", "gpus", "nodes",
"start_s", "end_s", ...}`` in driver-clock seconds) and, when given, the
plan made before the run and a baseline policy's plan for the same profile.

Example:
    >>> import json, tempfile, pathlib
    >>> from ray_saturn.runtime.journal import STATE_FILE
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> seg = {"strategy": "ddp", "gpus": 2, "nodes": ["node-0"], "start_s": 0.0, "end_s": 9.5}
    >>> _ = (d / STATE_FILE).write_text(json.dumps({"driver_state": "finished", "replans": 1, "moves": 0, "tasks": {
    ...     "a": {"task": "a", "state": "finished", "loss": 1.25, "steps_done": 10, "total_steps": 10,
    ...           "segments": [seg]}}}))
    >>> report = RunReport.from_run_dir(d)
    >>> report.realised_makespan_s, report.tasks[0].final_loss
    (9.5, 1.25)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ray_saturn.control.state import Segment
from ray_saturn.errors import SaturnError
from ray_saturn.plan import Plan
from ray_saturn.runtime.journal import STATE_FILE, Journal
from ray_saturn.runtime.storage import RunStorage, StorageError

__all__ = ["ReportError", "RunReport", "Segment", "TaskOutcome", "explain", "gantt_png", "render"]

logger = logging.getLogger(__name__)


class ReportError(SaturnError, ValueError):
    """A run folder cannot be reported on (missing or malformed state)."""


@dataclass(frozen=True)
class TaskOutcome:
    """A task's result: where it ran last, when it started and ended, its final loss."""

    task: str
    state: str
    strategy: str | None
    gpus: int | None
    nodes: tuple[str, ...]
    start_s: float | None
    end_s: float | None
    final_loss: float | None
    steps_done: int
    total_steps: int
    segments: tuple[Segment, ...] = ()


@dataclass(frozen=True)
class RunReport:
    """Everything the end of a run prints, typed (``to_dict()`` for JSON)."""

    run_dir: str
    state: str
    realised_makespan_s: float
    replans: int
    moves: int
    tasks: list[TaskOutcome]
    planned: Plan | None = None
    baseline: Plan | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: every baseline planned for the same profile: policy -> planned makespan (s)
    baselines: dict[str, float] = field(default_factory=dict)
    #: one line: why the realised makespan differs from the planned one (see :func:`explain`)
    explanation: str = ""

    @property
    def planned_makespan_s(self) -> float | None:
        return None if self.planned is None else self.planned.makespan_s

    @property
    def lower_bound_s(self) -> float | None:
        return None if self.planned is None else self.planned.lower_bound_s

    @property
    def baseline_makespan_s(self) -> float | None:
        return None if self.baseline is None else self.baseline.makespan_s

    @classmethod
    def from_run_dir(
        cls, run_dir: str | os.PathLike[str], *, planned: Plan | None = None, baseline: Plan | None = None
    ) -> RunReport:
        """Read the state file of ``run_dir`` (a local folder or a storage URI)."""
        missing = f"{os.fspath(run_dir)}/{STATE_FILE}: no such file; is {run_dir} a ray_saturn run folder?"
        try:
            journal = Journal(RunStorage(run_dir, create=False))
        except StorageError:
            raise ReportError(missing) from None
        if not journal.has_state():
            raise ReportError(missing)
        try:
            state = journal.read_state()
        except (StorageError, OSError) as exc:
            raise ReportError(f"{run_dir}: cannot read the run's state ({exc})") from None
        return cls.from_state(state, run_dir=str(run_dir), planned=planned, baseline=baseline)

    @classmethod
    def from_state(
        cls, state: Mapping[str, Any], *, run_dir: str = "", planned: Plan | None = None, baseline: Plan | None = None
    ) -> RunReport:
        tasks_in = state.get("tasks")
        if not isinstance(tasks_in, Mapping):
            raise ReportError(f"{run_dir or 'state'}: 'tasks' must map task names to records")
        tasks: list[TaskOutcome] = []
        last_end = 0.0
        for name, rec in tasks_in.items():
            try:
                segs = tuple(Segment.from_dict(s) for s in rec.get("segments", []))
            except (KeyError, TypeError, ValueError) as exc:
                raise ReportError(f"{run_dir or 'state'}: task {name!r} has a malformed segment ({exc})") from None
            last = segs[-1] if segs else None
            ends = [s.end_s for s in segs if s.end_s is not None]
            if ends:
                last_end = max(last_end, max(ends))
            loss = rec.get("loss")
            tasks.append(
                TaskOutcome(
                    task=str(name),
                    state=str(rec.get("state", "unknown")),
                    strategy=last.strategy if last else None,
                    gpus=last.gpus if last else None,
                    nodes=last.nodes if last else (),
                    start_s=segs[0].start_s if segs else None,
                    end_s=last.end_s if last else None,
                    final_loss=None if loss is None else float(loss),
                    steps_done=int(rec.get("steps_done", 0)),
                    total_steps=int(rec.get("total_steps", 0)),
                    segments=segs,
                )
            )
        tasks.sort(key=lambda t: (t.start_s if t.start_s is not None else float("inf"), t.task))
        return cls(
            run_dir=run_dir,
            state=str(state.get("driver_state", state.get("state", "unknown"))),
            realised_makespan_s=round(last_end, 6),
            replans=int(state.get("replans", 0)),
            moves=int(state.get("moves", 0)),
            tasks=tasks,
            planned=planned,
            baseline=baseline,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "state": self.state,
            "realised_makespan_s": self.realised_makespan_s,
            "planned_makespan_s": self.planned_makespan_s,
            "lower_bound_s": self.lower_bound_s,
            "baseline": None if self.baseline is None else
            {"policy": self.baseline.policy, "makespan_s": self.baseline.makespan_s},
            "baselines": dict(self.baselines),
            "explanation": self.explanation,
            "replans": self.replans,
            "moves": self.moves,
            "tasks": [
                {**{k: v for k, v in asdict(t).items() if k != "segments"},
                 "nodes": list(t.nodes),
                 "segments": [s.to_dict() for s in t.segments]}
                for t in self.tasks
            ],
            **self.extra,
        }


def _fmt(x: float | None, unit: str = "s", digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}{unit}"


def render(report: RunReport, console: Any = None) -> None:
    """Print the per-task table (realised next to planned when there is a plan) and the summary."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    plan = report.planned.by_task() if report.planned is not None else {}
    table = Table(title="ray_saturn run", show_lines=False)
    cols = [("task", "left"), ("state", "left"), ("strategy", "left"), ("GPUs", "right"), ("nodes", "left")]
    if plan:
        cols += [("planned", "right")]
    cols += [("start", "right"), ("end", "right"), ("final loss", "right")]
    for col, justify in cols:
        table.add_column(col, justify=justify)
    for t in report.tasks:
        moved = f" ({len(t.segments)} segments)" if len(t.segments) > 1 else ""
        row = [t.task, t.state, (t.strategy or "-") + moved, "-" if t.gpus is None else str(t.gpus),
               ",".join(t.nodes) or "-"]
        if plan:
            a = plan.get(t.task)
            row.append("-" if a is None else f"{a.strategy}x{a.gpus} {a.start_s:.0f}-{a.end_s:.0f}s")
        row += [_fmt(t.start_s), _fmt(t.end_s), _fmt(t.final_loss, "", 3)]
        table.add_row(*row)
    console.print(table)
    lines = [f"makespan (realised)       {_fmt(report.realised_makespan_s)}"]
    if report.planned is not None:
        lines.append(f"makespan (planned)        {_fmt(report.planned_makespan_s)}  [{report.planned.policy}]")
        lines.append(f"lower bound               {_fmt(report.lower_bound_s)}")
    for policy, makespan in sorted(report.baselines.items(), key=lambda kv: kv[1]):
        if report.baseline is None or policy != report.baseline.policy:
            lines.append(f"{policy + ' (planned)':<26}{_fmt(makespan)}")
    if report.baseline is not None:
        lines.append(f"{report.baseline.policy + ' (planned)':<26}{_fmt(report.baseline_makespan_s)}")
        if report.planned is not None and report.baseline_makespan_s:
            saved = 1 - report.planned_makespan_s / report.baseline_makespan_s
            lines.append(f"planned saving vs {report.baseline.policy}: {saved:.0%}")
    lines.append(f"re-plans {report.replans}, moves {report.moves}")
    if report.explanation:
        lines.append(report.explanation)
    for line in lines:
        console.print(line)


def explain(report: RunReport, profile: Any) -> str:
    """One line: realised against planned makespan, and what made them differ.

    Compares every segment that ran with the profile it was planned from:
    its start-up (launch to first step) against the row's ``startup_s`` (and
    ``checkpoint_load_s`` when it resumed), its training time against its
    steps x the row's step time; and counts the moves. Names the biggest
    differences in seconds.
    """
    if report.planned is None or not report.planned_makespan_s:
        return ""
    ratio = report.realised_makespan_s / report.planned_makespan_s
    head = f"realised {report.realised_makespan_s:.1f} s = {ratio:.2f}x planned"
    real_up = plan_up = real_train = plan_train = 0.0
    for t in report.tasks:
        for s in t.segments:
            if s.first_step_s is None:
                continue
            try:
                cfg = profile.get(t.task, s.strategy, s.gpus, len(s.nodes))
            except Exception:  # a row that is not in the profile: nothing to compare with
                continue
            real_up += s.first_step_s - s.start_s
            plan_up += cfg.startup_s + (cfg.checkpoint_load_s if s.steps_start > 0 else 0.0)
            if s.end_s is not None and s.steps_end is not None and cfg.step_time_s:
                real_train += max(0.0, s.end_s - s.first_step_s)
                plan_train += max(0, s.steps_end - s.steps_start - 1) * cfg.step_time_s
    parts: list[tuple[float, str]] = []
    if real_up or plan_up:
        parts.append((abs(real_up - plan_up), f"start-ups took {real_up:.0f} s in all against {plan_up:.0f} s planned"))
    if plan_train > 0:
        parts.append(
            (abs(real_train - plan_train), f"steps ran {real_train / plan_train:.2f}x their profiled time "
             f"({real_train:.0f} s against {plan_train:.0f} s)")
        )
    if report.moves:
        parts.append((0.0, f"{report.moves} move(s) restarted tasks"))
    if abs(ratio - 1) <= 0.05:
        return f"{head}: the run went as planned" + (f" ({parts[0][1]})" if parts else "")
    parts.sort(key=lambda p: -p[0])
    return f"{head}: " + "; ".join(p for _, p in parts[:2]) if parts else head


def gantt_png(report: RunReport, path: str | os.PathLike[str]) -> Path:
    """Write a Gantt chart PNG: the plan made before the run (top) against what ran (bottom).

    In the actual panel the hatched part of a bar is start-up (launch to first step).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [t.task for t in report.tasks]
    if report.planned is not None:
        names += [a.task for a in report.planned.assignments if a.task not in names]
    colours = plt.get_cmap("tab20")
    colour = {n: colours(i % 20) for i, n in enumerate(names)}
    rows = {n: i for i, n in enumerate(names)}
    panels = [("actual (hatched: start-up before the first step)",
               [(t.task, s.strategy, s.gpus, s.start_s, s.end_s if s.end_s is not None else s.start_s)
                for t in report.tasks for s in t.segments])]
    startup = [(t.task, s.start_s, s.first_step_s) for t in report.tasks for s in t.segments
               if s.first_step_s is not None and s.first_step_s > s.start_s]
    if report.planned is not None:
        panels.insert(0, (f"planned ({report.planned.policy})",
                          [(a.task, a.strategy, a.gpus, a.start_s, a.end_s) for a in report.planned.assignments]))
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.2 + 0.45 * len(names) * len(panels)), sharex=True,
                             squeeze=False)
    horizon = max([e for _, bars in panels for *_, e in bars] + [1e-9])
    for ax, (title, bars) in zip(axes[:, 0], panels, strict=True):
        for task, strategy, gpus, start, end in bars:
            ax.barh(rows[task], end - start, left=start, color=colour[task], edgecolor="black", linewidth=0.5)
            ax.text(start + (end - start) / 2, rows[task], f"{strategy}x{gpus}", ha="center", va="center",
                    fontsize=7)
        if title.startswith("actual"):
            for task, start, first in startup:
                ax.barh(rows[task], first - start, left=start, color="white", alpha=0.6, hatch="///",
                        edgecolor="black", linewidth=0.5)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.set_xlim(0, horizon * 1.02)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the run started")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
