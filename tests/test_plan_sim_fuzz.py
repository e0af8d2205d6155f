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


def _share_profile():
    return rs.ProfileTable.from_rows(
        [{"task": f"t{i}", "strategy": "ddp", "gpus": 0.5, "step_time_s": 1.0, "steps": 10} for i in range(3)])


@pytest.mark.parametrize("share", ["NaN", "0.5"])
def test_validator_refuses_three_halves_on_one_device_also_with_nan_shares(share):
    # Three 1/2 shares on device 0 of a 2-GPU node: the node holds 1.5 <= 2 GPUs, so only the device
    # check sees it, and a NaN share (every comparison false) passed it as a valid plan.
    assignments = ",".join(
        f'{{"task": "t{i}", "strategy": "ddp", "gpus": 0.5, "nodes": ["node-0"], "start_s": 0, "end_s": 10, '
        f'"devices": {{"node-0": [[0, {share}]]}}}}' for i in range(3))
    plan = rs.Plan.from_json('{"policy": "p", "makespan_s": 10, "lower_bound_s": 0, "solve_time_s": 0, '
                             f'"status": "feasible", "assignments": [{assignments}]}}')
    with pytest.raises(rs.PlanError):
        rs.validate_plan(plan, _share_profile(), rs.ClusterSpec.uniform(1, 2))


def test_validator_refuses_a_nan_completion_bound():
    profile = rs.ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 5}])
    cluster = rs.ClusterSpec.uniform(1, 1)
    plan = rs.plan(profile, cluster, objective="completion", time_limit_s=0.5)
    rs.validate_plan(plan, profile, cluster)
    plan.completion_lower_bound_s = NAN
    with pytest.raises(rs.PlanError, match="lower bound"):
        rs.validate_plan(plan, profile, cluster)


def test_plan_json_with_overflowing_gpus_is_a_plan_error():
    text = ('{"policy": "p", "makespan_s": 5, "lower_bound_s": 0, "status": "feasible", "assignments": '
            '[{"task": "a", "strategy": "ddp", "gpus": 1e400, "nodes": ["n"], "start_s": 0, "end_s": 5}]}')
    with pytest.raises(rs.PlanError, match="malformed assignment"):
        rs.Plan.from_json(text)


def test_poisson_arrivals_beyond_the_time_limit_are_refused_as_a_trace_is():
    # poisson:1e-9 put arrivals at ~4e12 s (1e-300: 4e303 s, where a task's runtime vanished in rounding and
    # the completion bound came out 0); a trace with such times was already refused.
    profile = rs.ProfileTable.from_rows(
        [{"task": t, "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 100} for t in "abc"])
    with pytest.raises(rs.SpecError, match=r"poisson:1e-9.*give a larger R"):
        parse_arrivals("poisson:1e-9", profile, seed=0)
    assert max(parse_arrivals("poisson:1e-3", profile, seed=0).values()) < 1e12


def test_parquet_with_unannotated_text_columns(tmp_path):
    # Some Parquet writers store text as plain bytes: the task was named "b'a'" and refused.
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"task": pa.array([b"a"], pa.binary()), "strategy": pa.array([b"DDP"], pa.large_binary()),
                             "gpus": [1], "step_time_s": [1.0], "steps": [4], "gpu_type": pa.array([b""])}), path)
    config = rs.ProfileTable.read(path).configs("a")[0]
    assert (config.strategy, config.gpu_type) == ("ddp", None)
    pq.write_table(pa.table({"task": pa.array([b"\xff"]), "strategy": ["ddp"], "gpus": [1], "step_time_s": [1.0],
                             "steps": [4]}), path)
    with pytest.raises(rs.ProfileError, match="not UTF-8"):
        rs.ProfileTable.read(path)


def test_plan_on_plan_must_be_callable():
    # Was a TypeError ("'int' object is not callable") from inside the policy, once it had a plan.
    profile = rs.ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 5}])
    with pytest.raises(rs.SpecError, match="on_plan is a int"):
        rs.plan(profile, rs.ClusterSpec.uniform(1, 1), on_plan=5)
