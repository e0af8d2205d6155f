"""The heuristic's local search ends by its own rules (stall, budget, bound), not by spinning to the deadline."""

from __future__ import annotations

import random

import pytest

import ray_saturn.solver.heuristic as heuristic
from ray_saturn import ClusterSpec, ProfileTable
from ray_saturn.context import PlanningContext
from ray_saturn.solver import build_problem, lower_bound


class _CountedRandom(random.Random):
    """A Random that refuses to draw more than ``LIMIT`` numbers (a spinning search draws millions)."""

    LIMIT = 1_000_000
    drawn = 0

    def random(self) -> float:
        type(self).drawn += 1
        if type(self).drawn > self.LIMIT:
            raise AssertionError(f"the local search drew {self.LIMIT} proposals without ending")
        return super().random()


def test_a_search_with_nothing_to_change_ends_without_waiting_for_its_deadline(monkeypatch):
    # One task with one option, started late by busy nodes: its makespan (550 s) is above the
    # bound (500 s), and every proposal (move it earlier, swap it with itself) changes nothing.
    # Each such proposal counts as one without improvement, so the search stalls out; before,
    # it drew proposals until the deadline (here 10 minutes).
    monkeypatch.setattr(heuristic.random, "Random", _CountedRandom)
    _CountedRandom.drawn = 0
    prof = ProfileTable.from_rows([{"task": "z", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 500}])
    problem = build_problem(prof, ClusterSpec.uniform(2, 2), PlanningContext(node_available_s={"node-0": 100.0,
                                                                                              "node-1": 50.0}))
    bound = lower_bound(problem)
    assert bound.value == pytest.approx(500.0)
    result = heuristic.heuristic_schedule(problem, bound, time_limit_s=600.0)
    assert result.schedule.makespan == pytest.approx(550.0)
    assert _CountedRandom.drawn <= 10 * heuristic.STALL
