"""`run`, `profile` and `demo` refuse bad flags and inputs with one line and exit 2, before Ray starts.

(`plan`, `simulate` and `emulate` have theirs in test_cli_plan.py, test_cli_fuzz.py and test_emulate_cli.py.)
"""

from __future__ import annotations

import re

import pytest

from ray_saturn.cli import main

WORKLOAD = "from ray_saturn.toy import mlp_task\ntasks = [mlp_task('m')]\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "{w}", "--storage", "{tmp}/r", "--checkpoint-interval", "inf"],
         "argument --checkpoint-interval: 'inf' is not a finite number > 0 (seconds)"),
        (["run", "{w}", "--storage", "{tmp}/r", "--checkpoint-interval", "nan"], "--checkpoint-interval: 'nan'"),
        (["run", "{w}", "--storage", "{tmp}/r", "--solver-time-limit", "inf"], "--solver-time-limit: 'inf'"),
        (["run", "{w}", "--storage", "{tmp}/r", "--policy", "nosuch"], "unknown policy 'nosuch'"),
        (["profile", "{w}", "-o", "{tmp}/p.csv", "--num-gpus", "0"], "--num-gpus: '0' is not a whole number"),
        (["profile", "{w}", "-o", "{tmp}/p.csv", "--num-gpus", "2", "--address", "127.0.0.1:1"],
         "--num-gpus starts a local Ray and --address joins one; give one of them"),
        (["run", "{w}", "--storage", "{tmp}/r", "--num-gpus", "0"], "--num-gpus: '0' is not a whole number"),
        (["run", "{w}", "--storage", "{tmp}/r", "--profile", "{tmp}/nope.csv"], "nope.csv: no such profile file"),
        (["run", "{w}", "--storage", "{tmp}/r", "--num-gpus", "1", "--profile", "{tmp}/nope.csv"],
         "nope.csv: no such profile file"),
        (["run", "{w}", "--storage", "{tmp}/r", "--num-gpus", "1", "--profile", "{tmp}/bad.csv"],
         "bad.csv row 1: gpus is 'abc'"),
        (["run", "{w}", "--storage", "{tmp}/r", "--profile", "{tmp}/other.csv"],
         "other.csv: the profile has no rows for task(s) m; profile them"),
        (["run", "{w}", "--storage", "{tmp}/r", "--num-gpus", "1", "--profile", "{tmp}/warp.csv"],
         "warp.csv row 1: strategy 'warp' is not registered"),
        # Rows that disagree with the workload: the run would train other steps, a strategy the task rules
        # out, or fail on its workers after the run started.
        (["run", "{w}", "--storage", "{tmp}/r", "--profile", "{tmp}/steps.csv"],
         "steps.csv row 1 (task 'm', single on 1 GPU(s)): steps is 10, but the workload trains 'm' for 100 steps; "
         "set steps to 100"),
        (["run", "{w}", "--storage", "{tmp}/r", "--profile", "{tmp}/single2.csv"],
         "single2.csv row 1 (task 'm', single on 2 GPU(s)): single runs on at most 1 GPU(s), not 2"),
        (["run", "{tmp}/only.py", "--storage", "{tmp}/r", "--profile", "{tmp}/ddp.csv"],
         "ddp.csv row 1 (task 'm', ddp on 2 GPU(s)): task 'm' allows only single (its strategies=)"),
        (["resume", "{tmp}/r", "--num-gpus", "two"], "--num-gpus: 'two' is not a whole number"),
        (["profile", "{w}", "-o", "{tmp}/p.csv", "--warmup", "-1"], "--warmup: '-1' is not a whole number"),
        (["profile", "{w}", "-o", "{tmp}/p.csv", "--steps", "1.5"], "--steps: '1.5' is not a whole number"),
        # Python's int() and float() read "1_0" as 10: a typo, not a number
        (["profile", "{w}", "-o", "{tmp}/p.csv", "--steps", "1_0"], "--steps: '1_0' is not a whole number"),
        (["run", "{w}", "--storage", "{tmp}/r", "--checkpoint-interval", "6_0"], "--checkpoint-interval: '6_0'"),
        (["profile", "{w}", "-o", "{tmp}/p.csv", "--trial-timeout", "nan"], "--trial-timeout: 'nan'"),
        (["profile", "{w}", "-o", "{tmp}/p.csv", "--memory-limit-gb", "inf"],
         "--memory-limit-gb: 'inf' is not a finite number > 0 (GB)"),
        (["profile", "{w}", "-o", "{tmp}/nofolder/p.csv"], "folder '{tmp}/nofolder' does not exist"),
        (["profile", "{w}", "-o", "{tmp}"], "is a folder"),
        (["profile", "{w}", "-o", "{tmp}/p.json"], "written as .csv or .parquet"),
        (["profile", "{w}", "-o", "{tmp}/p.csv", "--cluster", "{tmp}/nan.json"], "node 'a' gpus is nan"),
        (["profile", "{w}", "-o", "{tmp}/p.csv", "--gpus-per-node", "2"], "give --nodes N and --gpus-per-node G"),
        (["profile", "{w}", "-o", "{tmp}/p.csv", "--strategies", "nosuch"], "nosuch"),
        (["profile", "{tmp}/three.py", "-o", "{tmp}/p.csv"], "`tasks` is a int; make it a list"),
        (["profile", "{tmp}/none.py", "-o", "{tmp}/p.csv"], "no such workload file"),
        (["profile", "{tmp}/nope.py", "-o", "{tmp}/p.csv", "--num-gpus", "1"],
         "nope.py: task 'm': strategy 'nope' is not registered (registered: "),
        (["run", "{tmp}/nope.py", "--storage", "{tmp}/r", "--num-gpus", "1"], "task 'm': strategy 'nope' is not"),
        (["demo", "--scale", "inf"], "argument --scale: 'inf' is not a finite number > 0 (factor)"),
        (["demo", "--scale", "0"], "argument --scale: '0'"),
        (["demo", "--gpus", "0"], "argument --gpus: '0' is not a whole number from 1 to 1024"),
        (["demo", "--out", "{w}"], "is a file; give a folder"),
    ],
)
def test_bad_input_is_one_line_before_ray_starts(tmp_path, capsys, no_ray, args, message):
    (tmp_path / "w.py").write_text(WORKLOAD)
    (tmp_path / "three.py").write_text("tasks = 3\n")
    (tmp_path / "nope.py").write_text(
        "from dataclasses import replace\nfrom ray_saturn.toy import mlp_task\n"
        "tasks = [replace(mlp_task('m'), strategies=('nope',))]\n"
    )
    (tmp_path / "nan.json").write_text('{"nodes": [{"name": "a", "gpus": NaN}]}')
    head = "task,strategy,gpus,step_time_s,steps\n"
    (tmp_path / "bad.csv").write_text(head + "m,ddp,abc,1.0,10\n")
    (tmp_path / "other.csv").write_text(head + "a,ddp,1,1.0,10\n")
    (tmp_path / "warp.csv").write_text(head + "m,warp,1,1.0,10\n")
    (tmp_path / "steps.csv").write_text(head + "m,single,1,1.0,10\nm,ddp,2,0.6,10\n")
    (tmp_path / "single2.csv").write_text(head + "m,single,2,1.0,100\n")
    (tmp_path / "ddp.csv").write_text(head + "m,ddp,2,1.0,100\n")
    (tmp_path / "only.py").write_text(
        "from dataclasses import replace\nfrom ray_saturn.toy import mlp_task\n"
        "tasks = [replace(mlp_task('m'), strategies=('single',))]\n"
    )
    argv = [a.format(w=tmp_path / "w.py", tmp=tmp_path) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("command", [["run", "{w}", "--storage", "{tmp}/r"], ["resume", "{tmp}/r"],
                                     ["profile", "{w}", "-o", "{tmp}/p.csv"]])
def test_num_gpus_with_ray_address_set_is_one_line(tmp_path, capsys, no_ray, monkeypatch, command):
    (tmp_path / "w.py").write_text(WORKLOAD)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    argv = [a.format(w=tmp_path / "w.py", tmp=tmp_path) for a in command] + ["--num-gpus", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--num-gpus starts a local Ray, but RAY_ADDRESS is set (127.0.0.1:6379); drop --num-gpus" in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("address", ["127.0.0.1:1", "999.1.1.1:1"])
def test_profile_with_an_address_where_no_ray_answers_fails_fast(tmp_path, capsys, no_ray, address):
    import time

    (tmp_path / "w.py").write_text(WORKLOAD)
    t0 = time.monotonic()
    assert main(["profile", str(tmp_path / "w.py"), "-o", str(tmp_path / "p.csv"), "--address", address]) == 2
    err = capsys.readouterr().err
    assert f"--address {address}: no Ray cluster answers there" in err and "ray start --head" in err, err
    assert len(err.strip().splitlines()) == 1 and time.monotonic() - t0 < 10


def test_profile_without_ray_or_num_gpus_starts_a_local_ray_as_the_readme_says(tmp_path, capsys, monkeypatch):
    """README: profile joins RAY_ADDRESS or a running cluster, or starts a local one private to the process.
    It asked Ray for address="auto", which raises a ConnectionError (a traceback) when none runs; then for a
    plain ray.init(), which starts one without authentication on the machine's address."""
    import ray
    import ray._private.services as services

    from ray_saturn.errors import SaturnError

    asked = []

    def init(*args, **kwargs):
        asked.append(kwargs.get("address", args[0] if args else None))
        raise SaturnError("stop here")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: None)  # no `ray start` cluster
    (tmp_path / "w.py").write_text(WORKLOAD)
    assert main(["profile", str(tmp_path / "w.py"), "-o", str(tmp_path / "p.csv")]) == 2
    assert asked == ["local"], asked  # with token auth on 127.0.0.1 (test_runtime_local.py)


def test_the_demo_library_refuses_an_infinite_scale():
    from ray_saturn.demo import DemoError, demo_tasks

    with pytest.raises(DemoError, match=r"scale .* is inf; give a finite number > 0"):
        demo_tasks(float("inf"))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("checkpoint_interval_s", float("inf"), "DriverConfig.checkpoint_interval_s is inf; give a finite number > 0"),
        ("solver_time_limit_s", float("nan"), "DriverConfig.solver_time_limit_s is nan"),
        ("restart_s", -1.0, "DriverConfig.restart_s is -1.0; give a finite number >= 0"),
        ("min_reports", 2.5, "DriverConfig.min_reports is 2.5; give a whole number"),
        ("seed", -1, "DriverConfig.seed is -1"),
        ("reuse_workers", "no", "DriverConfig.reuse_workers is 'no'; give True or False"),
    ],
)
def test_driver_config_checks_its_numbers(field, value, message):
    from ray_saturn.errors import SaturnError
    from ray_saturn.runtime.config import DriverConfig

    with pytest.raises(SaturnError, match=re.escape(message)):
        DriverConfig(**{field: value})


def test_the_cli_defaults_are_the_library_defaults():
    import inspect

    from ray_saturn.cli import build_parser
    from ray_saturn.profiler import Profiler
    from ray_saturn.runtime.config import DriverConfig, emulation_config
    from ray_saturn.sim import SimConfig
    from ray_saturn.solver import solve

    def defaults_of(fn):
        return {k: p.default for k, p in inspect.signature(fn).parameters.items()}

    parse = build_parser().parse_args
    run, cfg = parse(["run", "w.py", "--storage", "r"]), DriverConfig()
    assert (run.policy, run.checkpoint_interval, run.solver_time_limit) == (
        cfg.policy, cfg.checkpoint_interval_s, cfg.solver_time_limit_s)
    sim, sim_cfg = parse(["simulate", "p.csv"]), SimConfig()
    assert (sim.restart_cost, sim.solver_time_limit) == (sim_cfg.restart_s, sim_cfg.solver_time_limit_s)
    plan, solve_defaults = parse(["plan", "p.csv"]), defaults_of(solve)
    assert (plan.policy, plan.time_limit) == (solve_defaults["policy"], solve_defaults["time_limit_s"])
    emu = parse(["emulate", "p.csv", "--nodes", "1", "--gpus-per-node", "1", "--time-scale", "1"])
    emu_defaults = defaults_of(emulation_config)
    assert (emu.policy, emu.solver_time_limit) == (emu_defaults["policy"], emu_defaults["solver_time_limit_s"])
    prof, prof_defaults = parse(["profile", "t.py", "-o", "p.csv"]), defaults_of(Profiler)
    assert (prof.warmup, prof.steps, prof.min_measure, prof.trial_timeout) == (
        prof_defaults["warmup"], prof_defaults["steps"], prof_defaults["min_measure_s"],
        prof_defaults["trial_timeout_s"])
