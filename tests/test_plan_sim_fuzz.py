"""Unusual but plausible inputs to plan and simulate, found by fuzzing: each test failed before its fix."""

from __future__ import annotations

import math

import pytest

import ray_saturn as rs
from ray_saturn.sim import parse_arrivals
from ray_saturn.solver.objective import task_weights

NAN = float("nan")


def _rows(**b_cells):
    """Task a fully given, task b with ``b_cells`` (as pandas' ``to_dict("records")`` hands over a gap: NaN)."""
    return [
        {"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 5, "nodes": 1, "feasible": True,
         "gpu_type": "A100", "weight": 2.0, "arrival_s": 3.0, "reason": "fits"},
        {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 5, **b_cells},
    ]


@pytest.mark.parametrize("col", ["nodes", "feasible", "gpu_type", "reason", "weight"])
def test_nan_cell_is_an_empty_cell(col):
    # NaN is how pandas hands over a missing value; it was an error in nodes/feasible, the GPU type
    # "nan" (so task b fitted nowhere) or the reason "nan".
    profile = rs.ProfileTable.from_rows(_rows(**{col: NAN}))
    b = profile.configs("b")[0]
    assert (b.nodes, b.feasible, b.gpu_type, b.reason) == (1, True, None, None)
    cluster = rs.ClusterSpec.from_dict({"nodes": [{"name": "n", "gpus": 2, "gpu_type": "A100"}]})
    assert rs.plan(profile, cluster, time_limit_s=0.5).makespan_s == 5.0


@pytest.mark.parametrize("gap", [NAN, "", " "])
def test_empty_weight_is_weight_one_for_the_completion_objective(gap):
    # The table read an empty weight as the default, then planning for completion said
    # "weight of task 'b' is ''" (or nan).
    rows = _rows(weight=gap)
    del rows[0]["gpu_type"]  # the completion objective plans untyped profiles
    profile = rs.ProfileTable.from_rows(rows)
    assert task_weights(profile, profile.tasks) == [2.0, 1.0]
    plan = rs.plan(profile, rs.ClusterSpec.uniform(1, 1), objective="completion", time_limit_s=0.5)
    assert math.isclose(plan.mean_completion_s, (2 * 5 + 10) / 3)


def test_nan_arrival_is_a_missing_arrival():
    profile = rs.ProfileTable.from_rows(_rows(arrival_s=NAN))
    with pytest.raises(rs.SpecError, match=r"no arrival time for task.*b"):
        parse_arrivals("profile", profile, seed=0)


@pytest.mark.parametrize("col", ["task", "strategy"])
def test_nan_name_is_empty_not_the_name_nan(col):
    with pytest.raises(rs.ProfileError, match=r"empty|non-empty"):
        rs.ProfileTable.from_rows(_rows(**{col: NAN}))
