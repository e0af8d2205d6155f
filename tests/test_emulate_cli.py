"""``ray-saturn emulate`` end to end (its own local cluster), ``status``, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ray_saturn.cli import main

ROWS = "task,strategy,gpus,step_time_s,steps\n" + "".join(
    f"job-{i},ddp,{g},{1.0 / g**0.8:.4f},{300 * (1 + i % 2)}\n" for i in range(4) for g in (1, 2)
)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    code = "import sys; from ray_saturn.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=240)


@pytest.mark.ray
def test_emulate_json_contract_and_status(tmp_path):
    prof = tmp_path / "p.csv"
    prof.write_text(ROWS)
    run_dir = tmp_path / "run"
    res = _cli(
        "emulate",
        str(prof),
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--time-scale",
        "0.01",
        "--noise",
        "0.2",
        "--run-dir",
        str(run_dir),
        "--json",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert {"planned_makespan_s", "realised_makespan_s", "moves", "replans", "tasks"} <= set(out)
    assert len(out["tasks"]) == 4
    for t in out["tasks"]:
        assert t["state"] == "finished" and t["steps_done"] == t["total_steps"]
        seg = t["segments"][0]
        assert {"strategy", "gpus", "nodes", "start_s", "end_s"} <= set(seg)
    # Profile seconds, not wall: 600 steps of ~1 s can not end before ~600 s.
    assert out["realised_makespan_s"] > 500
    st = _cli("status", str(run_dir))
    assert st.returncode == 0, st.stderr
    assert "driver: finished" in st.stdout and "job-3" in st.stdout and "100%" in st.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["emulate", "{p}", "--nodes", "0", "--gpus-per-node", "2", "--time-scale", "1"], "'0' is not a whole"),
        (["emulate", "{p}", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "0"], "factor > 0"),
        (["emulate", "{p}", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "inf"],
         "argument --time-scale: 'inf' is not a finite factor"),
        (["emulate", "{p}", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "1", "--noise", "nan"],
         "argument --noise: 'nan' is not a finite number"),
        (["emulate", "{p}", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "1", "--policy", "nosuch"],
         "unknown policy 'nosuch'"),
        (["emulate", "{p}", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "1", "--solver-time-limit",
          "nan"], "argument --solver-time-limit: 'nan'"),
        (["emulate", "{wide}", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "1"], "fits nowhere"),
        (["emulate", "{big}", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "1"], "steps is"),
        (["emulate", "{missing}", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "1"], "no such profile file"),
        (["emulate", "{p}", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "1", "--arrivals", "{missing}"],
         "or an existing CSV file (task,arrival_s)"),
        (["emulate", "{p}", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "1", "--arrivals", "poisson:x"],
         "poisson"),
        (["emulate", "{p}", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "1", "--gpu-types", ""],
         "argument --gpu-types: '' is empty; give one GPU type per emulated node"),
        (["emulate", "{p}", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "1", "--gpu-types", "  "],
         "argument --gpu-types: ' ' is empty"),  # the parser's one line collapses spaces
        (["emulate", "{p}", "--nodes", "2", "--gpus-per-node", "2", "--time-scale", "1", "--gpu-types", "a1,b 2"],
         "argument --gpu-types: entry 2 is 'b 2'; use letters"),
        (["emulate", "{p}", "--nodes", "2", "--gpus-per-node", "2", "--time-scale", "1", "--gpu-types", "a1,,a1"],
         "3 GPU type(s) for 2 emulated node(s)"),
        # online (auto with arrivals) or completion on shares: refused before a cluster starts or a policy runs
        (["emulate", "{shares}", "--nodes", "1", "--gpus-per-node", "1", "--time-scale", "1", "--arrivals",
          "poisson:10"], "--objective auto picks online as tasks arrive over time, but objective 'online' does not"),
        (["simulate", "{shares}", "--nodes", "1", "--gpus-per-node", "1", "--objective", "completion"],
         "objective 'completion' does not yet plan shares of one GPU (gpus < 1) or GPU types (gpu_type), which this "
         "profile has; give --objective makespan"),
        (["status", "{missing}"], "no such run folder"),
        (["resume", "{missing}"], "no such run folder"),
        (["run", "{missing}", "--run-dir", "{missing}"], "no such workload file"),
        # a file where a run folder belongs, a folder where a profile belongs: said as such, not "no such"
        (["status", "{p}"], "p.csv: is a file, not a run folder; give the folder the run was started in"),
        (["resume", "{p}"], "p.csv: is a file, not a run folder"),
        (["emulate", "{tmp}", "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "1"],
         "is a folder; give the path of a .csv or .parquet profile file"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch, args, message):
    import ray_saturn.cli.emulate as cli_emulate

    def no_cluster(*a, **k):
        raise AssertionError("bad input must be refused before the emulated cluster starts")

    monkeypatch.setattr(cli_emulate, "emulate", no_cluster)
    prof = tmp_path / "p.csv"
    prof.write_text(ROWS)
    big = tmp_path / "big.csv"
    big.write_text("task,strategy,gpus,step_time_s,steps\na,ddp,1,1.0,99999999999999999999999\n")
    wide = tmp_path / "wide.csv"
    wide.write_text("task,strategy,gpus,step_time_s,steps\na,ddp,4,1.0,10\n")
    missing = str(tmp_path / "nope")
    shares = tmp_path / "shares.csv"
    shares.write_text("task,strategy,gpus,step_time_s,steps\na,single,1/2,1.0,10\nb,single,1,1.0,10\n")
    argv = [a.format(p=prof, missing=missing, big=big, wide=wide, tmp=tmp_path, shares=shares) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_an_empty_gpu_types_entry_is_an_untyped_node():
    from ray_saturn.cli import build_parser

    def parse(text):
        return build_parser().parse_args(["emulate", "p.csv", "--nodes", "3", "--gpus-per-node", "1",
                                          "--time-scale", "1", "--gpu-types", text]).gpu_types

    assert parse("a100,,h100") == ["a100", None, "h100"]
    assert parse(" a100 , h100,") == ["a100", "h100", None]


@pytest.mark.parametrize("extra, objective, arrivals", [
    ([], "makespan", None),
    (["--arrivals", "{trace}"], "online", {"job-0": 0.0, "job-1": 30.0, "job-2": 60.0, "job-3": 90.0}),
    (["--arrivals", "{trace}", "--objective", "completion"], "completion", None),
])
def test_emulate_takes_arrivals_and_an_objective(tmp_path, monkeypatch, extra, objective, arrivals):
    """``--arrivals`` as in ``simulate``; ``--objective auto`` is online when tasks arrive over time
    (and the controller then backfills idle GPUs by default)."""
    import ray_saturn.cli.emulate as cli_emulate

    seen = {}

    def fake(profile, nodes, gpus_per_node, **kw):
        seen.update(kw)
        return {"state": "finished", "tasks": [], "run_dir": "x", "planned_makespan_s": 1.0,
                "realised_makespan_s": 1.0, "moves": 0, "replans": 0, "launch_latency_s": 0, "wall_s": 0}

    monkeypatch.setattr(cli_emulate, "emulate", fake)
    prof = tmp_path / "p.csv"
    prof.write_text(ROWS)
    trace = tmp_path / "t.csv"
    trace.write_text("task,arrival_s\n" + "".join(f"job-{i},{30 * i}\n" for i in range(4)))
    argv = ["emulate", str(prof), "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "0.01",
            *[a.format(trace=trace) for a in extra]]
    assert main(argv) == 0
    assert seen["config"].objective == objective
    if arrivals is not None or not extra:
        assert seen["arrivals"] == arrivals
