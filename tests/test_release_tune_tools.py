"""The Tune benchmark's analysis tools: the multi-run summary and the ASHA model of the search."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

RELEASE = Path(__file__).resolve().parents[1] / "release"
sys.path.insert(0, str(RELEASE))

import tune_asha_model  # noqa: E402
import tune_benchmark  # noqa: E402
import tune_hook_breakdown  # noqa: E402


def _details(path: Path, saturn: float, plain_1: float, plain_node: float) -> str:
    run = {"best_metric": 0.1, "errored": 0, "moves": 1, "resizes_that_changed_size": 1, "max_hook_ms": 9.0}
    path.write_text(json.dumps({
        "saturn": {**run, "search_time_s": saturn},
        "plain-1gpu": {**run, "search_time_s": plain_1},
        "plain-whole-node": {**run, "search_time_s": plain_node},
    }))
    return str(path)


def test_summary_gives_per_run_ratios_their_mean_and_the_ratio_of_means(tmp_path, capsys):
    a = _details(tmp_path / "a.json", 80.0, 100.0, 120.0)  # 0.8 against plain-1gpu
    b = _details(tmp_path / "b.json", 120.0, 150.0, 100.0)  # 1.2 against plain-whole-node
    assert tune_benchmark.summarize([a, b]) == 0
    out = capsys.readouterr().out
    assert "ratio 0.800" in out and "ratio 1.200" in out
    assert "mean 1.000 (standard error 0.200)" in out
    assert "mean saturn / mean better plain: 1.000" in out
    assert tune_benchmark.summarize([a]) == 0
    out = capsys.readouterr().out
    assert "1 runs: saturn / better plain Tune per run: mean 0.800 (standard error - (one run))" in out


def test_summary_of_a_file_that_is_not_a_run_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"plain-1gpu": {}}')
    with pytest.raises(SystemExit) as exc:
        tune_benchmark.summarize([str(bad)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.json" in err and "--details" in err


def test_asha_model_search_time_of_one_trial_is_its_start_plus_its_reports():
    args = SimpleNamespace(nodes=1, gpus_per_node=2, reports=4, time_scale=0.5, startup_core_s=1.0, cores=2.0)
    rows, steps = {"t": {1: 1.0, 2: 0.6}}, {"t": 8}
    model = tune_asha_model.Model(rows, steps, args)
    pols = tune_asha_model.policies(model)
    # A start alone takes 1 core-s / 0.5 = 2 profile s; 8 steps of 1.0 s on 1 GPU, of 0.6 s on 2.
    assert model.search([("t", 0.5)], *pols["plain-1gpu"]) == pytest.approx(2.0 + 8.0)
    assert model.search([("t", 0.5)], *pols["plain-whole-node"]) == pytest.approx(2.0 + 4.8)


def test_asha_model_stops_the_worse_of_two_trials_at_the_first_rung():
    # Two trials side by side; the one reaching a rung second is stopped there when it is worse.
    args = SimpleNamespace(nodes=1, gpus_per_node=2, reports=4, time_scale=1.0, startup_core_s=0.0, cores=2.0)
    rows, steps = {"fast": {1: 1.0}, "slow": {1: 2.0}}, {"fast": 4, "slow": 4}
    model = tune_asha_model.Model(rows, steps, args)
    order, width, grow = tune_asha_model.policies(model)["plain-1gpu"]
    # fast (better quality: lower loss) reaches every rung first; slow, worse, stops at report 1.
    assert model.search([("fast", 0.0), ("slow", 1.0)], order, width, grow) == pytest.approx(4.0)
    # slow better: it goes on to report 4 (8 s); fast, worse but first at rung 1 and 2, stops at rung 4
    # only if slow recorded there first: it did not (fast is there at 4 s, slow at 8 s), so 8 s.
    assert model.search([("fast", 1.0), ("slow", 0.0)], order, width, grow) == pytest.approx(8.0)


def test_fixed_stops_keep_the_best_half_at_each_rung_of_the_population_whatever_the_order():
    quota = tune_benchmark.fixed_quota
    assert [quota(q, 16, 2) for q in (0.99, 0.5, 0.49, 0.25, 0.2, 0.125, 0.1, 0.0625, 0.01)] == [
        1, 1, 2, 2, 4, 4, 8, 8, 16]
    assert quota(0.01, 6, 2) == 6  # past the last rung below max_t a trial trains to the end
    assert [quota(q, 9, 3) for q in (0.5, 0.3, 0.1)] == [1, 3, 9]
    # Over a population the fractions reaching each rung are those of synchronous halving.
    qs = [(i + 0.5) / 64 for i in range(64)]
    reached = [sum(quota(q, 16, 2) >= r for q in qs) for r in (1, 2, 4, 8, 16)]
    assert reached == [64, 32, 16, 8, 4]


def test_fixed_stops_are_asha_to_saturn_and_stop_at_the_quota():
    from ray.tune.schedulers import TrialScheduler

    from ray_saturn.tune._early_stops import early_stop_model

    base = tune_benchmark._asha(16, 2, fixed=True)
    base.set_search_properties("loss", "min")
    trial = SimpleNamespace(trial_id="t0", config={"quality": 0.2}, status="RUNNING")  # quota 4
    base.on_trial_add(None, trial)
    model = early_stop_model(base, "t0")  # SaturnScheduler plans its trials by ASHA's rungs
    assert model is not None and model.rungs and model.max_t == 16 and model.keep == 0.5
    # Trial 0 is alone at every rung (ASHA would keep it to the end); the quota stops it at 4.
    decisions = [base.on_trial_result(None, trial, {"report": r, "loss": 1.0 / r}) for r in (1, 2, 3, 4)]
    assert decisions == [TrialScheduler.CONTINUE] * 3 + [TrialScheduler.STOP]
    # ASHA's bookkeeping goes on: SaturnScheduler reads the trial's standing at its rungs as under ASHA.
    from ray_saturn.tune._early_stops import Standing, rung_standing

    assert rung_standing(base, "t0") == Standing(better=0, others=0)


def test_work_bound_is_the_longer_of_the_busiest_trial_and_the_cluster_area():
    import doctest

    assert doctest.testmod(tune_benchmark, verbose=False).failed == 0  # the docstring examples, work_bound's too
    rows, steps = {"a": {1: 1.0, 2: 0.6, 4: 0.5}, "b": {1: 2.0, 4: 0.4}}, {"a": 160, "b": 16}
    best_a = {"task": "a", "quality": 0.01}  # all 16 reports (10 steps each): 160 x 0.5 = 80 on 4 GPUs
    worst = [{"task": "b", "quality": 0.9}] * 4  # 1 report each: 1 step, 1.6 GPU-s at best (4 x 0.4)
    assert tune_benchmark.work_bound([best_a, *worst], rows, steps, 16, 2, 8) == 80.0
    # On one GPU the area rules: 160 x 1.0 (a's cheapest GPU-seconds) + 4 x 1.6.
    assert tune_benchmark.work_bound([best_a, *worst], rows, steps, 16, 2, 1) == pytest.approx(166.4)
    # A schedule that exists is never below it: everything one after the other on 4 GPUs.
    serial = 160 * 0.5 + 4 * 0.4
    assert tune_benchmark.work_bound([best_a, *worst], rows, steps, 16, 2, 4) <= serial


def test_summary_shows_the_work_bound_of_fixed_stop_runs(tmp_path, capsys):
    path = tmp_path / "f.json"
    _details(path, 80.0, 100.0, 120.0)
    d = json.loads(path.read_text())
    d["saturn"]["work_bound_s"] = 50.0
    path.write_text(json.dumps(d))
    assert tune_benchmark.summarize([str(path)]) == 0
    assert "work bound (--stops fixed) 50 s: saturn 1.60x of it, better plain 2.00x" in capsys.readouterr().out


def test_hook_breakdown_wraps_methods_that_exist_and_counts_reasons_of_one_kind_together():
    # It wraps private methods: a rename must fail here, not at the end of a 6-minute run.
    for label, cls, name in tune_hook_breakdown.PARTS:
        assert callable(getattr(cls, name, None)), (label, cls, name)
    kind = tune_hook_breakdown._kind
    one, other = "eacd7_00020 finished +12 s from its plan", "fc6d6_00003 finished -3.5 s from its plan"
    assert kind(one) == kind(other) == "# finished # s from its plan"
    assert kind("a plan finished in the background") == "a plan finished in the background"
