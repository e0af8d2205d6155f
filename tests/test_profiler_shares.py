"""Share rows (gpus = 1/k): k copies of a task on one (logical) GPU at once, written only where k fit.

The Ray tests run on a local Ray with 2 logical GPUs (gloo, toy models) and never more than two
training processes at once: a whole-GPU trial, or the two copies of a 1/2 share. A 1/4 share is
refused by the memory budget before anything is started.
"""

from __future__ import annotations

import json

import pytest
from ray_head import local_ray

import ray_saturn
from ray_saturn.errors import ProfileError, SpecError
from ray_saturn.profile_table import ProfileTable
from ray_saturn.profiler import Profiler, knobs_for
from ray_saturn.profiler import profiler as profiler_mod
from ray_saturn.profiler.shares import ShareSpec, check_shares, fit_reason, run_shares, whole_gpu_budget, window_s
from ray_saturn.profiler.store import ProfileStore, StoredShare, StoredTrial
from ray_saturn.spec import ClusterSpec
from ray_saturn.toy import faulty_task, mlp_task

CLUSTER = ClusterSpec.uniform(1, 2)
# min_measure_s > 0: the copies time a window of a few hundred ms, not a few ms of toy steps
FAST = {"warmup": 1, "steps": 3, "min_measure_s": 0.2, "segment_costs": False, "max_concurrent": 1}


# ---------------------------------------------------------------- no Ray
@pytest.mark.parametrize("bad", [(3,), (1,), (16,), ("x",), (True,), (2.5,), "2,3"])
def test_a_share_not_in_2_4_8_is_one_line_error(bad):
    with pytest.raises(SpecError, match=r"is not one of 2, 4, 8; give k of the share 1/k") as err:
        Profiler(CLUSTER, shares=bad)
    assert "\n" not in str(err.value)


def test_shares_are_sorted_once_and_default_to_none():
    assert check_shares([4, 2, 4, "8"]) == (2, 4, 8)
    assert check_shares(None) == () and Profiler(CLUSTER).shares == ()


def test_fit_window_and_budget():
    assert fit_reason(4, 0.3, 1.0) == "4 copies x 0.3 GB peak memory > 1 GB per device"
    assert fit_reason(2, 0.5, 1.0) is None  # exactly full fits
    assert fit_reason(8, None, 1.0) is None and fit_reason(8, 1.0, None) is None  # nothing to check
    assert whole_gpu_budget(12.0, 80.0) == 12.0 and whole_gpu_budget(None, 80.0) == 80.0
    assert window_s(4, 0.1, 5, 0.5, 600.0) == pytest.approx(3.0)
    assert window_s(2, 1e-4, 5, 0.5, 600.0) == 0.5  # at least min_measure_s
    assert window_s(8, 10.0, 5, 0.5, 100.0) == 25.0  # at most a quarter of the trial timeout


def test_the_cli_flag(tmp_path, capsys):
    from ray_saturn.cli import build_parser, main

    parse = build_parser().parse_args
    assert parse(["profile", "t.py", "-o", "p.csv", "--shares", "4,2"]).shares == (2, 4)
    assert parse(["profile", "t.py", "-o", "p.csv"]).shares == ()
    for bad, words in (("3", "'3' is not one of 2, 4, 8"), (",", "names no share")):
        assert main(["profile", str(tmp_path / "t.py"), "-o", str(tmp_path / "p.csv"), "--shares", bad]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1


def test_share_store_round_trip_and_a_broken_one(tmp_path):
    path = tmp_path / "store.parquet"
    store = ProfileStore(path)
    store.put(StoredTrial("sig", "single", 1, 1, 0.1, True, 0.2, None, "{}", 1.0))
    share = StoredShare("sig", "single", 2, 0.15, 0.14, 0.2, 10.0, None, 2.0)
    store.put_share(share)
    store.flush()
    again = ProfileStore(path)
    assert again.share("sig", "single", 2) == share and again.share("sig", "single", 4) is None
    assert share.feasible and not StoredShare("s", "single", 4, None, None, 1, 1, "too big", 0).feasible
    store.shares_path.write_text(json.dumps([{"signature": "sig"}]))
    with pytest.raises(ProfileError, match=r"store.shares.json: not a readable share store .*; delete it"):
        ProfileStore(path)


def _measured(sig: str, feasible: bool = True, peak: float = 0.1) -> dict:
    t = StoredTrial(sig, "single", 1, 1, 0.01 if feasible else None, feasible, peak if feasible else None,
                    None if feasible else "RuntimeError: toy model failure", '{"k": 1}' if feasible else "{}", 1.0)
    return {t.key: t}


def test_shares_that_cannot_be_measured_or_do_not_fit_are_reported_and_not_run(monkeypatch):
    monkeypatch.setattr(profiler_mod, "query_device_memory_gb", lambda timeout_s: 1.0)
    ran = []
    monkeypatch.setattr(profiler_mod, "run_shares", lambda specs, *a, **k: ran.extend(specs) or [])
    p = Profiler(CLUSTER, strategies=["single", "ddp"], shares=(2, 4, 8), memory_limit_gb=0.5)
    only_ddp = mlp_task("ddp-only")
    only_ddp.strategies = ("ddp",)
    tasks = [mlp_task("fits"), faulty_task("broken", "raise"), only_ddp]
    sigs = {"fits": "s1", "broken": "s2", "ddp-only": "s3"}
    measured = {**_measured("s1", peak=0.2), **_measured("s2", feasible=False)}
    shares = p._measure_shares(tasks, sigs, measured, CLUSTER)
    # fits: 2 x 0.2 GB fits the 0.5 GB budget (memory_limit_gb, under the device's 1 GB); 4 and 8 do not
    assert [(s.signature, s.copies) for s in ran] == [("s1", 2)] and ran[0].knobs == {"k": 1}
    refused = {s.copies: s.reason for s in shares.found["s1"]}
    assert set(refused) == {4, 8}
    assert refused[4] == "4 copies x 0.2 GB peak memory > 0.5 GB per device (the whole-GPU row's peak; not run)"
    assert all("whole-GPU single row is infeasible (RuntimeError" in s.reason for s in shares.found["s2"])
    assert all("not profiled with; add single" in s.reason for s in shares.found["s3"])
    # refusals by the budget are kept in the store; those that depend on the options are not
    assert p.store.share("s1", "single", 4) is not None and p.store.share("s2", "single", 2) is None
    table = p._table(tasks, sigs, measured, set(), None, shares)
    assert not table.has_shares and not any(c.is_share for c in table)


def test_measured_copies_that_do_not_fit_or_failed_are_reported_not_written(monkeypatch):
    from ray_saturn.profiler.shares import CopyResult, ShareOutcome

    monkeypatch.setattr(profiler_mod, "query_device_memory_gb", lambda timeout_s: 1.0)

    def measured_copies(specs, *a, **k):
        fits, grew, failed = (ShareOutcome(s) for s in specs)
        for o, peak in ((fits, 0.2), (grew, 0.7)):  # 0.7 GB per copy: 2 do not fit the 1 GB device
            o.copies = [CopyResult(0.02, 9, peak, ("0",)), CopyResult(0.03, 7, peak, ("0",))]
            o.step_time_s, o.mean_step_s, o.peak_mem_gb, o.device_mem_gb, o.cost_gpu_s = 0.03, 0.025, peak, 1.0, 2.0
        failed.reason = "a copy failed: RuntimeError: toy model failure"
        return [fits, grew, failed]

    monkeypatch.setattr(profiler_mod, "run_shares", measured_copies)
    p = Profiler(CLUSTER, strategies=["single"], shares=(2,))
    tasks = [mlp_task("fits"), mlp_task("grew"), mlp_task("failed")]
    sigs = {"fits": "s1", "grew": "s2", "failed": "s3"}
    measured = {**_measured("s1", peak=0.2), **_measured("s2", peak=0.3), **_measured("s3", peak=0.2)}
    shares = p._measure_shares(tasks, sigs, measured, CLUSTER)
    assert (shares.run, shares.workers_started, shares.cost_gpu_s) == (3, 6, 4.0)
    [fits], [grew], [failed] = (shares.found[s] for s in ("s1", "s2", "s3"))
    assert fits.feasible and (fits.step_time_s, fits.mean_step_s, fits.budget_gb) == (0.03, 0.025, 1.0)
    assert grew.reason == "2 copies x 0.7 GB peak memory > 1 GB per device"
    assert failed.reason == "a copy failed: RuntimeError: toy model failure"
    assert p.store.share("s2", "single", 2) == grew  # kept: a second run does not measure it again
    table = p._table(tasks, sigs, measured, set(), None, shares)
    assert [c.task for c in table if c.is_share] == ["fits"]
    assert table.get("fits", "single", 0.5).step_time_s == pytest.approx(0.03)


def test_share_rows_carry_the_whole_gpu_row_with_the_share_measured():
    row = {"task": "a", "strategy": "single", "gpus": 1, "nodes": 1, "step_time_s": 0.024, "steps": 10,
           "feasible": True, "peak_mem_gb": 0.2, "knobs": '{"k": 1}', "signature": "s", "cached": False,
           "cost_gpu_s": 1.0, "startup_s": 3.0, "trial_step_time_s": 0.012, "step_factor": 2.0}
    ok = StoredShare("s", "single", 2, 0.016, 0.015, 0.21, 10.0, None, 2.5)
    big = StoredShare("s", "single", 4, None, None, 0.21, 0.5, "4 copies x ...", 0.0)
    rows = profiler_mod._share_rows(row, [ok, big], {ok.key})
    assert len(rows) == 1
    r = rows[0]
    assert (r["gpus"], r["nodes"], r["peak_mem_gb"], r["device_mem_gb"], r["cached"]) == (0.5, 1, 0.21, 10.0, True)
    assert r["trial_step_time_s"] == pytest.approx(0.016)  # the copies' batch draws are in their steps
    assert r["step_time_s"] == pytest.approx(0.032)  # times the whole row's step factor
    assert (r["startup_s"], r["knobs"], r["cost_gpu_s"]) == (3.0, '{"k": 1}', 2.5)
    table = ProfileTable.from_rows([row, r])
    share = table.get("a", "single", 0.5)
    assert share.is_share and share.copies == 2 and share.feasible
    assert knobs_for(table, "a", "single", 0.5) == {"k": 1}


# ---------------------------------------------------------------- on Ray (logical GPUs)
@pytest.fixture(scope="module")
def ray_local():
    with local_ray(num_gpus=2, num_cpus=2):
        yield


@pytest.fixture(scope="module")
def halves(ray_local, tmp_path_factory):
    store = str(tmp_path_factory.mktemp("store") / "store.parquet")
    tasks = [mlp_task("a", lr=0.1, max_steps=400), mlp_task("a-seed2", lr=0.01, seed=2, max_steps=300)]
    result = Profiler(CLUSTER, strategies=["single"], store=store, shares=(2,), **FAST).run(tasks)
    return tasks, store, result


@pytest.mark.ray
def test_a_half_share_row_is_measured_once_per_signature(halves):
    tasks, _, result = halves
    table = result.table
    assert result.trials_run == 1 and result.shares_run == 1 and result.shares_cached == 0
    assert result.workers_started == 3  # one warm whole-GPU worker, then the two copies
    assert result.infeasible == [] and "1 share(s) of a device" in result.summary()
    for t in tasks:
        whole, half = table.get(t.name, "single", 1), table.get(t.name, "single", 0.5)
        assert half.is_share and half.copies == 2 and half.nodes == 1 and half.feasible
        assert half.steps == t.total_steps
        # same job, same knobs, same way of counting memory: one copy's peak is the whole-GPU peak's
        assert half.peak_mem_gb == pytest.approx(whole.peak_mem_gb, rel=0.25)
        # two copies on 2 cores: not a timing assertion, only that it is the same job's step
        assert 0.2 * whole.step_time_s < half.step_time_s < 20 * whole.step_time_s
    arrow = table.to_arrow().to_pylist()
    halves_rows = [r for r in arrow if r["gpus"] == 0.5]
    assert {r["signature"] for r in halves_rows} == {arrow[0]["signature"]}  # one signature, measured once
    assert all(r["device_mem_gb"] >= 2 * r["peak_mem_gb"] for r in halves_rows)
    plan = ray_saturn.plan(table, CLUSTER)
    ray_saturn.validate_plan(plan, table, CLUSTER)


@pytest.mark.ray
def test_the_store_keeps_shares(halves):
    tasks, store, first = halves
    again = Profiler(CLUSTER, strategies=["single"], store=store, shares=(2,), **FAST).run(tasks[:1])
    assert (again.trials_run, again.shares_run, again.shares_cached, again.cost_gpu_s) == (0, 0, 1, 0.0)
    assert again.table.get("a", "single", 0.5).step_time_s == first.table.get("a", "single", 0.5).step_time_s
    # without shares= the same store gives today's table: no share rows
    plain = Profiler(CLUSTER, strategies=["single"], store=store, **FAST).run(tasks[:1])
    assert not plain.table.has_shares and plain.shares_cached == 0


@pytest.mark.ray
def test_a_share_that_does_not_fit_the_budget_gives_no_row_and_a_reason(halves):
    _, _, first = halves
    peak = first.table.get("a", "single", 1).peak_mem_gb
    budget = 3 * peak  # 2 copies fit, 4 do not
    result = Profiler(CLUSTER, strategies=["single"], shares=(2, 4), memory_limit_gb=budget, **FAST).run(
        [mlp_task("a", lr=0.1, max_steps=400)]
    )
    assert result.shares_run == 1  # the 1/2 share ran; the 1/4 one was refused before starting anything
    assert result.table.get("a", "single", 1).feasible and result.table.get("a", "single", 0.5).feasible
    assert result.table.to_arrow().column("device_mem_gb").to_pylist()[-1] == pytest.approx(budget)
    with pytest.raises(ProfileError, match="no row"):
        result.table.get("a", "single", 0.25)
    [(task, strategy, gpus, reason)] = result.infeasible
    assert (task, strategy, gpus) == ("a", "single", 0.25)
    assert reason.startswith("4 copies x ") and "GB per device (the whole-GPU row's peak; not run)" in reason


@pytest.mark.ray
def test_copies_share_one_device_and_a_failing_or_hanging_copy_is_a_reason(ray_local):
    kw = {"warmup": 1, "steps": 3, "min_time_s": 0.1}
    specs = [
        ShareSpec(mlp_task("ok"), "s1", 2, {}, 0.001),
        ShareSpec(faulty_task("raises", "raise"), "s2", 2, {}, 0.001),
        ShareSpec(faulty_task("hangs", "hang"), "s3", 2, {}, 0.001),
    ]
    ok, raises, hangs = run_shares(specs, kw, timeout_s=6.0, placement_timeout_s=30.0, concurrent=1)
    assert ok.feasible and len(ok.copies) == 2
    assert len({c.gpu_ids for c in ok.copies}) == 1 and len(ok.copies[0].gpu_ids) == 1  # the same one device
    assert all(c.steps >= 1 for c in ok.copies) and ok.step_time_s == max(c.step_time_s for c in ok.copies)
    assert ok.mean_step_s <= ok.step_time_s and ok.device_mem_gb > 0 and ok.cost_gpu_s > 0
    assert not raises.feasible and "a copy failed: RuntimeError: toy model failure" in raises.reason
    assert not hangs.feasible and hangs.reason == "hung: the copies were not warm within 6 s; killed"


@pytest.mark.ray
def test_copies_whose_processes_do_not_start_in_time_are_a_reason(ray_local, monkeypatch):
    from ray_saturn.profiler import shares

    monkeypatch.setattr(shares, "STARTUP_TIMEOUT_S", 0.001)  # no Ray worker starts within a millisecond
    (out,) = run_shares([ShareSpec(mlp_task("slow-start"), "s9", 2, {}, 0.001)], {"warmup": 1, "steps": 3},
                        timeout_s=6.0, placement_timeout_s=30.0)
    assert not out.feasible and out.reason == "the copies' processes did not start within 0.001 s"
    assert out.copies == [] and out.cost_gpu_s > 0
