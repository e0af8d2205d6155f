"""`ray-saturn plan`: contract 2 output and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ray_saturn import ClusterSpec, Plan, ProfileTable, validate_plan
from ray_saturn.cli import main


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def profile_csv(tmp_path, small_profile):
    return str(small_profile.write(tmp_path / "profile.csv"))


def test_plan_json_is_contract_2(capsys, profile_csv, small_profile):
    code, out, err = run_cli(
        capsys, "plan", profile_csv, "--nodes", "2", "--gpus-per-node", "2", "--json", "--time-limit", "5"
    )
    assert code == 0, err
    data = json.loads(out)
    assert set(data) >= {"policy", "makespan_s", "lower_bound_s", "solve_time_s", "status", "assignments"}
    assert data["policy"] == "saturn" and data["status"] in ("optimal", "feasible")
    for a in data["assignments"]:
        assert set(a) >= {"task", "strategy", "gpus", "nodes", "start_s", "end_s"}
    validate_plan(Plan.from_dict(data), small_profile, ClusterSpec.uniform(2, 2))


def test_plan_table_and_heterogeneous_cluster(capsys, tmp_path, profile_csv):
    cfile = tmp_path / "cluster.json"
    cfile.write_text(json.dumps({"nodes": [{"name": "big", "gpus": 4}, {"name": "small", "gpus": 2}]}))
    code, out, err = run_cli(
        capsys,
        "plan",
        profile_csv,
        "--cluster",
        str(cfile),
        "--policy",
        "fifo-whole-node",
        "-o",
        str(tmp_path / "plan.json"),
    )
    assert code == 0, err
    assert "makespan" in out and "lower bound" in out and "gap" in out
    plan = Plan.from_json((tmp_path / "plan.json").read_text())
    assert plan.policy == "fifo-whole-node"


def test_deterministic_flag_gives_the_same_plan(capsys, profile_csv):
    outs = []
    for _ in range(2):
        code, out, err = run_cli(
            capsys,
            "plan",
            profile_csv,
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--json",
            "--time-limit",
            "1",
            "--deterministic",
            "--seed",
            "3",
        )
        assert code == 0, err
        outs.append(json.loads(out)["assignments"])
    assert outs[0] == outs[1]


def test_example_profile_plans(capsys):
    code, out, err = run_cli(
        capsys, "plan", "--example", "--nodes", "4", "--gpus-per-node", "4", "--json", "--time-limit", "3"
    )
    assert code == 0, err
    assert len(json.loads(out)["assignments"]) == 24


@pytest.mark.parametrize(
    "args, message",
    [
        (["plan", "missing.csv", "--nodes", "1", "--gpus-per-node", "1"], "missing.csv: no such profile file"),
        (["plan", "PROFILE", "--nodes", "1"], "give --nodes N and --gpus-per-node G"),
        (["plan", "PROFILE", "--nodes", "1", "--gpus-per-node", "1"], "task 'c' fits nowhere on this cluster"),
        (["plan", "PROFILE", "--nodes", "2", "--gpus-per-node", "2", "--policy", "magic"], "unknown policy 'magic'"),
        (["plan", "PROFILE", "--nodes", "0", "--gpus-per-node", "2"], "--nodes: '0' is not a whole number from 1"),
        (["plan", "PROFILE", "--nodes", "2", "--gpus-per-node", "2", "--time-limit", "0"],
         "--time-limit: '0' is not a finite number > 0"),
        (["plan", "PROFILE", "--nodes", "2", "--gpus-per-node", "2", "--time-limit", "nan"],
         "--time-limit: 'nan' is not a finite number > 0"),
        (["plan", "PROFILE", "--nodes", "2", "--gpus-per-node", "2", "--time-limit", "inf"], "'inf' is not a finite"),
        (["plan", "PROFILE", "--nodes", "2", "--gpus-per-node", "2", "--seed", "-1"], "--seed: '-1' is not a whole"),
        (["plan", "PROFILE", "--nodes", "100000000", "--gpus-per-node", "2"], "from 1 to 100000"),
        (["plan", "PROFILE", "--nodes", "2", "--gpus-per-node", "2", "-o", "NOFOLDER/p.json"], "does not exist"),
        (["plan", "PROFILE", "--nodes", "2", "--gpus-per-node", "2", "-o", "TMP"], "is a folder"),
        (["plan", "PROFILE", "--nodes", "2", "--gpus-per-node", "2", "--bogus"],
         "ray-saturn plan: error: unrecognized arguments: --bogus (see ray-saturn plan --help)"),
        (["status", "TMP", "extra"], "ray-saturn status: error: unrecognized arguments: extra (see ray-saturn status"),
        (["plan", "BAD", "--nodes", "2", "--gpus-per-node", "2"], "row 1: step_time_s is -1.0"),
        (["plan", "HUGESTEPS", "--nodes", "2", "--gpus-per-node", "2"], "row 1: steps is 1e+23; give a whole"),
        (["plan", "HUGETIME", "--nodes", "2", "--gpus-per-node", "2"], "beyond 1e+12 s"),
        (["plan", "NANTIME", "--nodes", "2", "--gpus-per-node", "2"], "row 1: step_time_s is inf"),
        (["plan", "PROFILE", "--cluster", "INFCLUSTER"], "node 'a' gpus is inf; give a whole number from 1 to 1024"),
        (["plan", "PROFILE", "--cluster", "NANCLUSTER"], "node 'a' gpus is nan; give a whole number"),
        (["plan", "--nodes", "2", "--gpus-per-node", "2"], "give a PROFILE file or --example"),
        (["plan", "PROFILE", "--example", "--nodes", "2", "--gpus-per-node", "2"], "give a PROFILE file or --example"),
        (["simulate", "--nodes", "2", "--gpus-per-node", "2"], "give a PROFILE file or --example"),
        (["simulate", "PROFILE", "--example", "--nodes", "2", "--gpus-per-node", "2"],
         "give a PROFILE file or --example"),
        (["emulate", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "0.001"],
         "give a PROFILE file or --example"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, profile_csv, args, message):
    files = {
        "BAD": "task,strategy,gpus,step_time_s,steps\na,ddp,1,-1,3\n",
        "HUGESTEPS": "task,strategy,gpus,step_time_s,steps\na,ddp,1,1.0,99999999999999999999999\n",
        "HUGETIME": "task,strategy,gpus,step_time_s,steps\na,ddp,1,1e308,10\n",
        "NANTIME": "task,strategy,gpus,step_time_s,steps\na,ddp,1,inf,10\n",
        "INFCLUSTER": '{"nodes": [{"name": "a", "gpus": Infinity}]}',
        "NANCLUSTER": '{"nodes": [{"name": "a", "gpus": NaN}]}',
    }
    paths = {"PROFILE": profile_csv, "TMP": str(tmp_path), "NOFOLDER/p.json": str(tmp_path / "nofolder" / "p.json")}
    for key, text in files.items():
        path = tmp_path / (key.lower() + (".json" if "CLUSTER" in key else ".csv"))
        path.write_text(text)
        paths[key] = str(path)
    args = [paths.get(a, a) for a in args]
    code, _out, err = run_cli(capsys, *args)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("which", ["profile", "cluster"])
def test_plan_output_over_its_own_input_is_refused_and_nothing_is_overwritten(capsys, tmp_path, profile_csv, which):
    cluster = tmp_path / "cluster.json"
    cluster.write_text('{"nodes": [{"name": "a", "gpus": 2}, {"name": "b", "gpus": 2}]}')
    target = profile_csv if which == "profile" else str(cluster)
    before = Path(target).read_text()
    code, _out, err = run_cli(capsys, "plan", profile_csv, "--cluster", str(cluster), "-o", target)
    assert code == 2 and err.count("\n") == 1 and "would overwrite it: give another file" in err, err
    assert Path(target).read_text() == before


def test_console_script_runs(tmp_path, profile_csv):
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from ray_saturn.cli import main; raise SystemExit(main())",
            "plan",
            profile_csv,
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--json",
            "--time-limit",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["assignments"]


def test_profile_round_trip_through_cli(capsys, tmp_path, small_profile):
    pq = small_profile.write(tmp_path / "p.parquet")
    code, out, _ = run_cli(
        capsys, "plan", str(pq), "--nodes", "2", "--gpus-per-node", "2", "--json", "--time-limit", "2"
    )
    assert code == 0
    assert ProfileTable.read(pq).tasks == [a["task"] for a in json.loads(out)["assignments"]]


def test_version_and_python_dash_m(capsys, profile_csv):
    """`ray-saturn --version` said "the following arguments are required: COMMAND", and `python -m
    ray_saturn.cli` had no __main__ (for machines or jobs without the console script on PATH)."""
    import ray_saturn

    code, out, _err = run_cli(capsys, "--version")
    assert code == 0 and out.strip() == f"ray-saturn {ray_saturn.__version__}"
    proc = subprocess.run(
        [sys.executable, "-m", "ray_saturn.cli", "plan", profile_csv, "--nodes", "2", "--gpus-per-node", "2",
         "--json", "--time-limit", "1"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["assignments"]


def test_a_reader_that_goes_away_ends_the_command_quietly(profile_csv):
    """`ray-saturn plan ... | head -1` ended in a BrokenPipeError traceback; now quietly, as after SIGPIPE."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ray_saturn.cli", "plan", profile_csv, "--nodes", "2", "--gpus-per-node", "2",
         "--time-limit", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_simulate_takes_the_shipped_example_profile(capsys):
    """`simulate --example`, as `plan --example`: a new user has a profile to try without writing one."""
    code, out, err = run_cli(capsys, "simulate", "--example", "--nodes", "4", "--gpus-per-node", "4",
                             "--policies", "fifo-whole-node", "--json")
    assert code == 0, err
    result = json.loads(out)["policies"]["fifo-whole-node"]
    assert result["makespan_s"] > 0 and result["mean_completion_s"] > 0
