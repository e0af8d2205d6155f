"""Progress in whole steps: no step is lost to rounding, in the counter or in the simulator."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_saturn import ClusterSpec, ProfileTable
from ray_saturn.sim import SimConfig, simulate
from ray_saturn.stepping import steps_done_by

STEP_S = st.floats(1e-4, 1e3, allow_nan=False, allow_infinity=False)
STEPS = st.integers(1, 10**7)
START_S = st.floats(0.0, 1e9, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(start=START_S, step=STEP_S, n=STEPS, frac=st.floats(0.0, 1.0))
def test_every_step_counts_at_its_end(start, step, n, frac):
    assert steps_done_by(start + n * step, start, step, n) == n
    i = int(frac * n)
    assert steps_done_by(start + i * step, start, step, n) >= i
    assert steps_done_by(start + i * step, start, step, n) <= n
    assert steps_done_by(start, start, step, n) == 0 or start + step <= start  # no step before the first ends
    assert steps_done_by(start - 1.0, start, step, n) == 0


def test_the_reported_case_keeps_its_last_step():
    # ncf-48 in the issue: 58,253 steps of 0.0074 s, started late in a long run.
    for start in (0.0, 12_345.678, 98_765.4321, 3.3e6):
        assert steps_done_by(start + 58_253 * 0.0074, start, 0.0074, 58_253) == 58_253


def test_bad_step_time_is_an_error():
    with pytest.raises(ValueError, match="step time"):
        steps_done_by(1.0, 0.0, 0.0, 10)


@settings(max_examples=40, deadline=None)
@given(first=st.tuples(STEP_S, STEPS), second=st.tuples(STEP_S, STEPS))
def test_the_simulator_runs_every_step(first, second):
    # Two tasks one after the other on one GPU: the second starts at an arbitrary, large time.
    # A lost step is a SimulationError ("finished with N-1 of N steps").
    rows = [
        {"task": name, "strategy": "ddp", "gpus": 1, "step_time_s": s, "steps": n}
        for name, (s, n) in (("a", first), ("b", second))
    ]
    profile = ProfileTable.from_rows(rows)
    result = simulate(profile, ClusterSpec.uniform(1, 1), "fifo-min-gpus", SimConfig(noise=0.0))
    assert all(r.finish_s is not None for r in result.tasks)
    assert result.makespan_s == pytest.approx(first[0] * first[1] + second[0] * second[1], rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(step=STEP_S, n=STEPS, before=st.floats(0.0, 1e-7))
def test_a_finish_handled_with_an_earlier_event_keeps_its_last_step(step, n, before):
    # b arrives up to 1e-7 s before a's last step ends: the simulator handles both events together, at
    # b's arrival; a must still finish with every step (it used to lose its last one).
    rows = [{"task": t, "strategy": "ddp", "gpus": 1, "step_time_s": step, "steps": n} for t in ("a", "b")]
    arrivals = {"a": 0.0, "b": max(0.0, n * step - before)}
    result = simulate(ProfileTable.from_rows(rows), ClusterSpec.uniform(1, 2), "fifo-min-gpus",
                      SimConfig(noise=0.0, arrivals=arrivals))
    assert all(r.finish_s is not None for r in result.tasks)


def test_a_step_time_far_below_the_event_tolerance_loses_no_step():
    # Ten steps of 1e-320 s: a's progress report and its finish fall in one batch of events.
    rows = [{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1e-320, "steps": 10}]
    result = simulate(ProfileTable.from_rows(rows), ClusterSpec.uniform(1, 1), "saturn-static", SimConfig())
    assert result.tasks[0].finish_s is not None
