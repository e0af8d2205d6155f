"""What a plan is optimised for: ``makespan``, ``completion`` or ``online``.

- ``makespan``: the last end (the batch default: a model-selection sweep is
  done when its last job is).
- ``completion``: the (weighted) sum of completion times, i.e. the mean job
  completion time when every weight is 1. Weights come from an optional
  ``weight`` column of the profile (> 0, default 1).
- ``online``: completion time among plans whose makespan is within
  :data:`ONLINE_SLACK` of the best makespan found (``saturn``: its own makespan
  search for the same tasks): short jobs first without
  letting the last job finish much later. The default for online use (jobs
  arriving over time, e.g. a Tune search). While jobs arrive, the makespan
  guard is off and a plan's GPU-seconds are priced instead by the wait they
  cause the jobs expected to arrive: each task's by the share of those that
  would queue behind it (the larger ones). A background job (:func:`is_background`:
  almost every arrival is smaller, and the cluster cannot clear it within
  :data:`BACKGROUND_HORIZON_S`) fills the GPUs left over and its completion
  counts :data:`BACKGROUND_WEIGHT` of its weight then.

Completion times are measured from time 0 of the plan; a task's release does
not change which plan is better (it is the same for every plan), so
``sum_t w_t end_t`` ranks plans exactly as the weighted mean JCT does.

Example:
    >>> parse_objective("completion")
    'completion'
    >>> parse_objective("Online")
    'online'
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from ray_saturn.errors import SpecError
from ray_saturn.limits import MAX_WEIGHT, MIN_WEIGHT

__all__ = [
    "BACKGROUND_HORIZON_S",
    "BACKGROUND_SHARE",
    "BACKGROUND_WEIGHT",
    "OBJECTIVES",
    "ONLINE_SLACK",
    "is_background",
    "objective_gain",
    "parse_objective",
    "solver_policy",
    "task_weights",
    "weighted_completion",
]

OBJECTIVES = ("makespan", "completion", "online")
#: ``online`` while jobs arrive: a task is in the background when fewer than this share of the
#: arrived jobs are larger than it ...
BACKGROUND_SHARE = 0.05
#: ... and its least remaining GPU-seconds exceed what the whole cluster does in this time (s).
BACKGROUND_HORIZON_S = 3600.0
#: A background task's completion time counts this much of its weight while jobs arrive.
BACKGROUND_WEIGHT = 0.1
#: ``online``: a plan's makespan may exceed the best one found by this fraction.
ONLINE_SLACK = 0.03


def is_background(share: float | None, least_area_gpu_s: float, total_gpus: float) -> bool:
    """``online`` while jobs arrive: a task is in the background when almost every job that arrives
    is smaller (``share`` of the arrived jobs larger than it below :data:`BACKGROUND_SHARE`) and its
    least remaining GPU-seconds exceed what the whole cluster does in :data:`BACKGROUND_HORIZON_S`."""
    return (share is not None and share < BACKGROUND_SHARE
            and least_area_gpu_s > total_gpus * BACKGROUND_HORIZON_S)


def parse_objective(name: str | None) -> str:
    """The objective's canonical name; a one-line error naming the choices otherwise."""
    if name is not None and not isinstance(name, str):
        raise SpecError(f"objective is {name!r}; choose one of: {', '.join(OBJECTIVES)}")
    value = (name or "makespan").strip().lower()
    if value not in OBJECTIVES:
        raise SpecError(f"unknown objective {name!r}; choose one of: {', '.join(OBJECTIVES)}")
    return value


def task_weights(profile, tasks: Sequence[str]) -> list[float]:
    """Per task, its ``weight`` column value (1 when the profile has none)."""
    table = profile.to_arrow()
    if "weight" not in table.column_names:
        return [1.0] * len(tasks)
    seen: dict[str, float] = {}
    for t, w in zip(table.column("task").to_pylist(), table.column("weight").to_pylist(), strict=False):
        if w is None:
            continue
        try:
            w = float(w)
        except (TypeError, ValueError):
            raise SpecError(f"{profile.source}: weight of task {t!r} is {w!r}; give a number > 0") from None
        if not MIN_WEIGHT <= w <= MAX_WEIGHT:
            raise SpecError(f"{profile.source}: weight of task {t!r} is {w}; give a number from {MIN_WEIGHT:g} "
                            f"to {MAX_WEIGHT:g} (weights are relative)")
        if t in seen and seen[t] != w:
            raise SpecError(f"{profile.source}: task {t!r} has two weights ({seen[t]}, {w}); give one per task")
        seen[t] = w
    return [seen.get(t, 1.0) for t in tasks]


def weighted_completion(ends: Sequence[float], weights: Sequence[float]) -> float:
    """``sum_t w_t end_t``."""
    return float(sum(w * e for w, e in zip(weights, ends, strict=True)))


def plan_ends(plan) -> dict[str, float]:
    return {a.task: a.end_s for a in plan.assignments}


def plan_area(plan, share: Mapping[str, float] | None = None) -> float:
    """GPU-seconds the plan holds; with ``share``, each task's scaled by its share (1 if not named)."""
    share = share or {}
    return sum(share.get(a.task, 1.0) * a.gpus * (a.end_s - a.start_s) for a in plan.assignments)


def objective_gain(
    keep,
    move,
    objective: str,
    weights: Mapping[str, float],
    area_weight: float = 0.0,
    area_share: Mapping[str, float] | None = None,
    background: Collection[str] = (),
) -> float:
    """How much better plan ``move`` is than plan ``keep`` for ``objective`` (seconds; weighted
    task-seconds for completion). ``area_weight`` prices the GPU-seconds each plan uses, per task
    scaled by ``area_share`` (see :func:`~ray_saturn.solver.completion.completion_search`); with
    that price on (``online``), the ends of the ``background`` tasks count
    :data:`BACKGROUND_WEIGHT` of their weights.

    For ``online`` without an arrival price (the makespan guard is on), the two plans are ranked
    as the search ranks them: one whose makespan exceeds the other's by more than
    :data:`ONLINE_SLACK` is worse by the makespan difference, whatever its completion times (so a
    move that ends the run much sooner is made even when carrying on finishes the others earlier);
    within the slack, by completion times."""
    if objective == "makespan":
        return keep.makespan_s - move.makespan_s

    quiet = background if objective == "online" and area_weight > 0 else ()

    def weight(t: str) -> float:
        w = weights.get(t, 1.0)
        return w * BACKGROUND_WEIGHT if t in quiet else w

    def total(plan) -> float:
        return (sum(weight(t) * e for t, e in plan_ends(plan).items())
                + area_weight * plan_area(plan, area_share))

    guard = objective == "online" and area_weight <= 0
    if guard and move.makespan_s > keep.makespan_s * (1 + ONLINE_SLACK) + 1e-9:
        return keep.makespan_s - move.makespan_s
    if guard and keep.makespan_s > move.makespan_s * (1 + ONLINE_SLACK) + 1e-9:
        return keep.makespan_s - move.makespan_s
    return total(keep) - total(move)


def solver_policy(
    name: str, *, objective: str = "makespan", deterministic: bool = False, area_weight: float = 0.0,
    gap: float = 0.0,
):
    """The solver policy ``name`` set for ``objective`` (policies with an ``objective`` option,
    i.e. ``saturn``; the baselines follow fixed rules whatever the objective), with the search's
    ``gap`` to the lower bound (policies with a ``gap`` option) and, if asked, in its
    deterministic mode."""
    import dataclasses

    from ray_saturn.solver.policy import deterministic_policy, get_policy

    pol = deterministic_policy(name) if deterministic else get_policy(name)
    objective = parse_objective(objective)
    fields = {f.name for f in dataclasses.fields(pol.options)}
    extra: dict = {}
    if objective != "makespan" and "objective" in fields:
        extra["objective"] = objective
        if area_weight:
            extra["area_weight"] = float(area_weight)
    if gap and "gap" in fields:
        extra["gap"] = float(gap)
    if extra:
        pol = get_policy(name, **{**dataclasses.asdict(pol.options), **extra})
    return pol
