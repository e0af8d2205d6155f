"""CLI fuzzing: any profile, cluster file or flags give exit 2 with one line, or exit 0 with a valid plan.

Half the examples are valid inputs (so the plans themselves are checked);
the others corrupt one thing: a profile cell, the cluster file or a flag.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_saturn import ClusterSpec, Plan, ProfileTable, validate_plan
from ray_saturn.cli import main

# Numbers as a user might type them: edge cases and nonsense.
JUNK_NUMBER = st.one_of(
    st.integers(-3, 10**25).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "abc", "1e3", "nan", "inf", "-inf", "-0", "0", "0.5", "1e308", "1e-320", "2.0", " 3 "]),
)
JUNK_NAME = st.sampled_from(["", "../x", "d e", "t,1", "a" * 300, "n0"])
COLUMNS = ["task", "strategy", "gpus", "nodes", "step_time_s", "steps", "feasible"]
POLICIES = ["saturn", "fifo-whole-node", "fifo-max-gpus", "fifo-min-gpus", "fifo-fastest", "optimus-greedy", "random"]


@st.composite
def valid_rows(draw, max_nodes: int):
    rows = []
    for t in range(draw(st.integers(1, 5))):
        configs = {(1, 1)} | {
            (draw(st.integers(1, 4)) * k, k) for k in draw(st.lists(st.integers(1, max_nodes), max_size=3))
        }
        steps = draw(st.integers(1, 10**6))
        for gpus, k in sorted(configs):
            feasible = (gpus, k) == (1, 1) or draw(st.booleans())
            step = draw(st.floats(1e-4, 1e3)) if feasible else None
            rows.append([f"t{t}", draw(st.sampled_from(["ddp", "fsdp"])), gpus, k,
                         "" if step is None else repr(step), steps, "true" if feasible else "false"])
    return rows


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _check_one_line(code: int, out: str, err: str, command: str, argv: list[str]) -> None:
    assert code in (0, 2), (code, argv, err[-2000:])
    if code == 2:
        assert len(err.splitlines()) == 1 and err.startswith(f"ray-saturn {command}: error: "), err
        assert "Traceback" not in err


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_plan_fuzz(data):
    mode = data.draw(st.sampled_from(["valid", "valid", "valid", "cell", "cluster", "flag"]))
    nodes = data.draw(st.integers(1, 3))
    caps = data.draw(st.lists(st.integers(1, 4), min_size=nodes, max_size=nodes))
    rows = data.draw(valid_rows(nodes))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if mode == "cell":
            r, c = data.draw(st.integers(0, len(rows) - 1)), data.draw(st.integers(0, len(COLUMNS) - 1))
            rows[r][c] = data.draw(JUNK_NAME if c < 2 else JUNK_NUMBER)
        profile_path = folder / "profile.csv"
        with profile_path.open("w", newline="") as f:
            csv.writer(f).writerows([COLUMNS, *rows])
        cluster = {"nodes": [{"name": f"n{i}", "gpus": g} for i, g in enumerate(caps)]}
        if mode == "cluster":
            what = data.draw(st.sampled_from(["gpus", "name", "json", "uniform"]))
            if what == "gpus":
                cluster["nodes"][0]["gpus"] = data.draw(
                    st.one_of(st.integers(-2, 10**20), st.floats(allow_nan=True, allow_infinity=True), JUNK_NUMBER))
            elif what == "name":
                cluster["nodes"][0]["name"] = data.draw(JUNK_NAME)
        cluster_path = folder / "cluster.json"
        cluster_path.write_text("{not json" if mode == "cluster" and what == "json" else json.dumps(cluster))
        if mode == "cluster" and what == "uniform":
            cluster_args = ["--nodes", data.draw(JUNK_NUMBER), "--gpus-per-node", data.draw(JUNK_NUMBER)]
        elif data.draw(st.booleans()) and len(set(caps)) == 1:
            cluster_args = ["--nodes", str(nodes), "--gpus-per-node", str(caps[0])]
        else:
            cluster_args = ["--cluster", str(cluster_path)]
        flags = {
            "--time-limit": data.draw(st.sampled_from(["0.05", "0.1"])),
            "--seed": str(data.draw(st.integers(0, 2**31 - 1))),
            "--policy": data.draw(st.sampled_from(POLICIES)),
            "-o": str(folder / "plan.json"),
        }
        if mode == "flag":
            flag = data.draw(st.sampled_from(sorted(flags)))
            if flag == "-o":  # paths inside the temporary folder only: a junk name would be a file written here
                flags[flag] = data.draw(st.sampled_from([str(folder), str(folder / "missing" / "p.json"), ""]))
            else:
                flags[flag] = data.draw(st.one_of(JUNK_NUMBER, st.sampled_from(["nosuch", ""])))
        argv = ["plan", str(profile_path), *cluster_args, "--json"]
        for flag, value in flags.items():
            argv.append(f"{flag}={value}")  # '=': a value starting with '-' is a value, not a flag
        code, out, err = _run(argv)
        _check_one_line(code, out, err, "plan", argv)
        if code == 2:
            assert out == ""
            return
        plan = Plan.from_dict(json.loads(out))
        assert json.loads(Path(flags["-o"]).read_text()) == json.loads(out)
        profile = ProfileTable.read(profile_path)
        if "--cluster" in cluster_args:
            spec = ClusterSpec.from_json(cluster_path)
        else:
            spec = ClusterSpec.uniform(int(float(cluster_args[1])), int(float(cluster_args[3])))
        validate_plan(plan, profile, spec)
        assert math.isfinite(plan.makespan_s)
        assert 0 <= plan.lower_bound_s <= plan.makespan_s * (1 + 1e-9) + 1e-9


SIM_FLAGS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["--noise", "--restart-cost", "--solver-time-limit", "--replan-gap",
                                   "--recovery", "--seed", "--random-failures", "--replan-window"]),
                  st.one_of(st.sampled_from(["0", "0.1", "1", "2"]), JUNK_NUMBER)),
        st.tuples(st.just("--arrivals"), st.sampled_from(["0", "poisson:60", "poisson:nan", "poisson:inf",
                                                          "profile", "nosuch.csv"])),
        st.tuples(st.just("--failures"), st.sampled_from(["node-1@10", "node-0@5:2", "node-0@nan",
                                                          "node-0@1:inf", "x@1", "node-0", "node-1@3:40"])),
    ),
    max_size=3,
)


FIXED_PROFILE = "task,strategy,gpus,step_time_s,steps\n" + "".join(
    f"t{i},ddp,{g},{2.0 / g:.3f},{50 + 10 * i}\n" for i in range(4) for g in (1, 2)
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flags=SIM_FLAGS, data=st.data())
def test_simulate_fuzz(flags, data):
    # The fixed profile with fuzzed flags, or drawn profile rows (step times 1e-4..1e3 s, up to 1e6
    # steps), valid or with one junk cell, with the default flags.
    mode = data.draw(st.sampled_from(["fixed", "fixed", "rows", "cell"]))
    with tempfile.TemporaryDirectory() as tmp:
        profile_path = Path(tmp) / "profile.csv"
        if mode == "fixed":
            profile_path.write_text(FIXED_PROFILE)
        else:
            flags = []
            rows = data.draw(valid_rows(2))
            if mode == "cell":
                r, c = data.draw(st.integers(0, len(rows) - 1)), data.draw(st.integers(0, len(COLUMNS) - 1))
                rows[r][c] = data.draw(JUNK_NAME if c < 2 else JUNK_NUMBER)
            with profile_path.open("w", newline="") as f:
                csv.writer(f).writerows([COLUMNS, *rows])
        argv = ["simulate", str(profile_path), "--nodes", "2", "--gpus-per-node", "2", "--json",
                "--policies", "fifo-whole-node,saturn-static", "--solver-time-limit", "0.1"]
        for flag, value in flags:
            argv.append(f"{flag}={value}")
        code, out, err = _run(argv)
        _check_one_line(code, out, err, "simulate", argv)
        if code == 0:
            result = json.loads(out)
            assert set(result["policies"]) == {"fifo-whole-node", "saturn-static"}
            for r in result["policies"].values():
                assert math.isfinite(r["makespan_s"]) and r["makespan_s"] >= result["lower_bound_s"] * (1 - 1e-9)
