"""release/online_lp_bound.py: the time-indexed relaxation is a valid bound (never above a schedule's figures)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

RELEASE = Path(__file__).resolve().parents[1] / "release"
sys.path.insert(0, str(RELEASE))

import online_fluid_model as fm  # noqa: E402
import online_lp_bound as lp  # noqa: E402


def test_the_hull_keeps_only_counts_no_mix_of_two_others_beats():
    job = fm.Job("a", "x", 0.0, {1: 100.0, 2: 60.0, 3: 55.0, 4: 30.0})
    assert [g for g, _ in lp.hull(job)] == [1, 4]  # 2 and 3 lie under the chord from 1 to 4
    assert lp.hull(fm.Job("b", "x", 0.0, {2: 50.0, 4: 50.0})) == [(2, pytest.approx(0.02))]


def test_one_job_alone_ends_after_its_set_up_and_fastest_run():
    job = fm.Job("a", "x", 5.0, {1: 100.0, 2: 70.0})
    b = lp.bound([job], 400.0, gpus=2, fine_s=10.0, coarse_s=10.0)
    assert b.status == "optimal" and b.mean_jct_lb_s == pytest.approx(30.0 + 70.0)
    assert lp.bound([job], 90.0, gpus=2, fine_s=10.0, coarse_s=10.0).status == "infeasible"


def test_two_jobs_on_one_gpu_cannot_both_end_early():
    jobs = [fm.Job("a", "x", 0.0, {1: 100.0}), fm.Job("b", "x", 0.0, {1: 100.0})]
    b = lp.bound(jobs, 1000.0, gpus=1, fine_s=10.0, coarse_s=10.0)
    # one after the other is (130 + 230) / 2 = 180 s; the relaxation may overlap the second set-up
    # and loses up to one slot on the mean busy time
    assert 170.0 <= b.mean_jct_lb_s <= 180.0 + 1e-6
    assert lp.least_makespan(jobs, 100.0, 1000.0, gpus=1, fine_s=10.0, coarse_s=10.0)[1] <= 230.0 + 2.5


@pytest.mark.parametrize("seed", range(4))
def test_no_schedule_of_the_fluid_model_beats_the_bound(seed):
    rng = random.Random(seed)
    jobs = []
    for i in range(8):
        base = rng.uniform(200.0, 3000.0)
        runtime = {1: base}
        for g in (2, 4, 8):
            runtime[g] = runtime[g // 2] / rng.uniform(1.2, 1.95)
        jobs.append(fm.Job(f"j{i}", "x", round(rng.uniform(0.0, 2000.0)), runtime))
    for rule in (fm.optimus(), fm.share(beta=1.0), fm.weighted(beta=1.0)):
        r = fm.simulate(jobs, rule, gpus=8, restart_s=30.0)
        b = lp.bound(jobs, r.makespan_s, gpus=8, fine_s=20.0, coarse_s=20.0)
        assert b.status == "optimal" and b.mean_jct_lb_s <= r.mean_jct_s + 1e-6
        lo, _ = lp.least_makespan(jobs, 0.3 * r.makespan_s, r.makespan_s, gpus=8, fine_s=20.0, coarse_s=20.0)
        assert lo <= r.makespan_s
