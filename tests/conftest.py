"""Shared fixtures (helpers that are not fixtures live in helpers.py)."""

from __future__ import annotations

import pytest

from ray_saturn import ProfileTable


@pytest.fixture
def small_profile():
    return ProfileTable.from_rows(
        [
            {"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 10.0, "steps": 10},
            {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 6.0, "steps": 10},
            {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 10.0, "steps": 10},
            {"task": "b", "strategy": "fsdp", "gpus": 4, "nodes": 2, "step_time_s": 3.0, "steps": 10},
            {"task": "c", "strategy": "ddp", "gpus": 2, "step_time_s": 5.0, "steps": 4},
        ],
        source="small.csv",
    )
