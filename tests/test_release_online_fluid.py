"""release/online_fluid_model.py: the fluid model of the online benchmark on instances checked by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

RELEASE = Path(__file__).resolve().parents[1] / "release"
sys.path.insert(0, str(RELEASE))

import online_fluid_model as fm  # noqa: E402


def test_two_equal_jobs_share_the_gpus_and_pay_one_restart_each():
    jobs = [fm.Job("a", "x", 0.0, {1: 100.0, 2: 60.0}), fm.Job("b", "x", 0.0, {1: 100.0, 2: 60.0})]
    for rule in (fm.optimus(), fm.share(beta=1.0), fm.weighted(beta=1.0)):
        r = fm.simulate(jobs, rule, gpus=2, restart_s=30.0)
        assert r.makespan_s == pytest.approx(130.0) and r.mean_jct_s == pytest.approx(130.0)
        assert r.changes == 2 and r.utilisation == pytest.approx(1.0)


def test_a_short_arrival_passes_a_long_job_under_share_but_not_under_optimus():
    """One GPU: a 1,000 s job at 0, a 10 s job at 100. Optimus keeps arrival order; the share rule
    gives the GPU to the short job (the long one pauses and pays a second restart)."""
    jobs = [fm.Job("long", "x", 0.0, {1: 1000.0}), fm.Job("short", "y", 100.0, {1: 10.0})]
    fifo = fm.simulate(jobs, fm.optimus(), gpus=1, restart_s=30.0)
    assert fifo.makespan_s == pytest.approx(1070.0)  # long: 30 + 1000; short: then 30 + 10
    assert fifo.mean_jct_s == pytest.approx((1030.0 + 970.0) / 2)
    srpt = fm.simulate(jobs, fm.share(beta=1.0), gpus=1, restart_s=30.0)
    # short: 100 + 30 + 10 = 140; long: 70 s done of 1000, resumes at 140 after a restart: 140 + 30 + 930
    assert srpt.mean_jct_s == pytest.approx((1100.0 + 40.0) / 2)
    assert srpt.makespan_s == pytest.approx(1100.0) and srpt.changes == 4
    assert srpt.jct_by_app_s == {"x": pytest.approx(1100.0), "y": pytest.approx(40.0)}


def test_bad_rules_and_impossible_jobs_are_one_line_errors():
    with pytest.raises(SystemExit, match="unknown rule 'nope'; choose one of: optimus, share, weighted"):
        fm.parse_rule("nope")
    with pytest.raises(SystemExit, match=r"'beta' is not key=number"):
        fm.parse_rule("share:beta")
    with pytest.raises(SystemExit, match=r"unexpected keyword argument 'gamma'"):
        fm.parse_rule("weighted:gamma=2")
    with pytest.raises(ValueError, match="job big: no GPU count of it fits 2 GPUs"):
        fm.simulate([fm.Job("big", "x", 0.0, {4: 10.0})], fm.optimus(), gpus=2)
