"""Contract 1: the profile table, its I/O and every kind of malformed input."""

from __future__ import annotations

import dataclasses

import pytest

from ray_saturn import ProfileError, ProfileTable

HEADER = "task,strategy,gpus,nodes,step_time_s,steps,feasible,peak_mem_gb\n"


def write(tmp_path, text, name="p.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_csv_round_trip_keeps_extra_columns(tmp_path):
    p = write(tmp_path, HEADER.strip() + ",note\n" + "a,ddp,2,1,1.5,10,true,3.2,hello\na,fsdp,4,2,,10,false,,oom\n")
    t = ProfileTable.read(p)
    assert t.tasks == ["a"]
    assert [c.runtime_s for c in t.configs("a", feasible_only=True)] == [15.0]
    assert not t.get("a", "fsdp", 4, 2).feasible
    out = t.write(tmp_path / "out.parquet")
    again = ProfileTable.read(out)
    assert again.to_arrow().column("note").to_pylist() == ["hello", "oom"]
    assert [c.key for c in again] == [c.key for c in t]
    csv_out = t.write(tmp_path / "out.csv")
    assert [c.key for c in ProfileTable.read(csv_out)] == [c.key for c in t]


def test_defaults_for_optional_columns(tmp_path):
    p = write(tmp_path, "task,strategy,gpus,step_time_s,steps\nb,ddp,1,2.0,3\n")
    (c,) = ProfileTable.read(p)
    assert (c.nodes, c.feasible, c.peak_mem_gb) == (1, True, None)


@pytest.mark.parametrize(
    "body, message",
    [
        ("task,strategy,gpus,steps\na,ddp,1,3\n", "missing column(s) step_time_s"),
        (HEADER + "a,ddp,1,1,-2,10,true,\n", "row 1: step_time_s is -2.0; it must be a finite number > 0"),
        (HEADER + "a,ddp,1,1,1,10,true,\na,ddp,1,1,2,10,true,\n", "row 2: duplicate of row 1"),
        # a task's steps are the task's: a plan's runtime would depend on the row it picks
        (HEADER + "a,ddp,1,1,1,10,true,\nb,ddp,1,1,1,7,true,\na,ddp,2,1,1,20,true,\n",
         "row 3: steps is 20, but row 1 of task 'a' says 10; every row of a task has its step count"),
        (HEADER + "a,ddp,0,1,1,10,true,\n", "row 1: gpus is 0; give a whole number from 1 to"),
        (HEADER + "a,ddp,1.5,1,1,10,true,\n", "row 1: gpus is 1.5; give a whole number"),
        (HEADER + "a,ddp,4,3,1,10,true,\n", "4 GPUs over 3 nodes do not split evenly"),
        (HEADER + "a,ddp,1,1,,10,true,\n", "step_time_s is empty but the row is feasible"),
        (HEADER + "../etc,ddp,1,1,1,10,true,\n", "task name '../etc' is not allowed"),
        (HEADER + "a,ddp,1,1,1,0,true,\n", "row 1: steps is 0"),
        (HEADER + "a,ddp,1,1,1,10,maybe,\n", "feasible is 'maybe'; use true or false"),
        (HEADER + "a,,1,1,1,10,true,\n", "strategy is empty"),
        (HEADER + "a,ddp,1,1,1,10,true,-1\n", "peak_mem_gb is -1.0"),
        (HEADER + "a,ddp,1,1,inf,10,true,\n", "row 1: step_time_s is inf; give a finite number"),
        (HEADER + "a,ddp,1,1,1e308,10,true,\n", "beyond 1e+12 s"),
        (HEADER + "a,ddp,1,1,1,99999999999999999999999,true,\n", "row 1: steps is 1e+23; give a whole number"),
        (HEADER + "a,ddp,1,1,1,1e16,true,\n", "row 1: steps is 1e+16; give a whole number from 1 to 9007199254740992"),
        (HEADER + "a,ddp,1,1,1,10,true,inf\n", "peak_mem_gb is inf; give a finite number"),
        (HEADER, "the profile has no rows"),
        ("task,task,strategy,gpus,step_time_s,steps\na,b,ddp,1,1,10\n",
         "column(s) task appear more than once in the header; keep one"),
        ("task,strategy,gpus,step_time_s,steps,startup_s\na,ddp,1,1,10,1e300\n",
         "row 1: startup_s is 1e+300; it must be a finite number of seconds >= 0 and <= 1e+12"),
        ("task,strategy,gpus,step_time_s,steps,checkpoint_save_s\na,ddp,1,1,10,2e12\n",
         "row 1: checkpoint_save_s is 2000000000000.0; it must be a finite number of seconds >= 0 and <= 1e+12"),
        ("task,strategy,gpus,step_time_s,steps,weight\na,ddp,1,1,10,1e308\n",
         "row 1: weight is 1e+308; weights are relative: give a number from 1e-06 to 1e+06"),
        ("task,strategy,gpus,step_time_s,steps,weight\na,ddp,1,1,10,0\n", "row 1: weight is 0"),
    ],
)
def test_malformed_profiles_give_one_line_errors(tmp_path, body, message):
    p = write(tmp_path, body)
    with pytest.raises(ProfileError) as exc:
        ProfileTable.read(p)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)
    assert str(p) in str(exc.value)


def test_unreadable_and_unknown_files(tmp_path):
    with pytest.raises(ProfileError, match="no such profile file"):
        ProfileTable.read(tmp_path / "nope.csv")
    with pytest.raises(ProfileError, match="unknown profile format"):
        ProfileTable.read(write(tmp_path, "x", name="p.txt"))
    with pytest.raises(ProfileError, match="cannot parse"):
        ProfileTable.read(write(tmp_path, "\x00\x01garbage", name="p.parquet"))


def test_unregistered_strategy_and_infeasible_task(small_profile):
    with pytest.raises(ProfileError, match=r"strategy 'fsdp' is not registered \(registered: ddp\)"):
        small_profile.check_strategies(["ddp"])
    small_profile.check_strategies(["ddp", "fsdp"])
    t = ProfileTable.from_rows(
        [
            {"task": "x", "strategy": "ddp", "gpus": 1, "step_time_s": None, "steps": 3, "feasible": False,
             "reason": "peak memory 0.20 GB exceeds the 0.1 GB per GPU"},
            {"task": "x", "strategy": "fsdp", "gpus": 2, "step_time_s": None, "steps": 3, "feasible": False},
        ]
    )
    with pytest.raises(
        ProfileError,
        match=r"task 'x' has no feasible configuration \(ddp on 1 GPU\(s\): peak memory 0.20 GB exceeds the 0.1 GB "
        r"per GPU; fsdp on 2 GPU\(s\): no reason given\)",
    ):
        t.check_feasible()


def test_replace_builds_remaining_work(small_profile):
    rest = small_profile.replace(lambda c: None if c.task == "c" else type(c)(**{**c.__dict__, "steps": 5}))
    assert rest.tasks == ["a", "b"]
    assert all(c.steps == 5 for c in rest)


@pytest.mark.parametrize(("rows", "message"), [
    (None, "rows is a NoneType; give a list of dicts"),
    ("abc", "rows is a str; give a list of dicts"),
    ([1, 2], "row 1: a int, not a dict of column -> value"),
    ([{"task": "a", "strategy": "ddp", "gpus": 10**30, "step_time_s": 1.0, "steps": 1}],
     "row 1: gpus is '1000000000000000000000000000000'; give a whole number from 1 to"),
])
def test_from_rows_of_the_wrong_kind_is_one_line(rows, message):
    with pytest.raises(ProfileError, match=message) as err:
        ProfileTable.from_rows(rows)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("path", "message"), [
    (None, "profile path is None; give the path"),
    (5, "profile path is 5; give the path"),
    ("x" * 5000 + ".csv", "not a usable profile path"),
])
def test_read_of_a_path_that_is_no_path_is_one_line(path, message):
    with pytest.raises(ProfileError, match=message):
        ProfileTable.read(path)


def test_write_to_an_unwritable_place_is_one_line(tmp_path):
    t = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 1}])
    for where in ("/proc/saturn-p.csv", "/proc/saturn-dir/p.parquet"):
        with pytest.raises(ProfileError, match=f"{where}: cannot write the profile .*folder you can write"):
            t.write(where)
    (tmp_path / "file").write_text("")
    with pytest.raises(ProfileError, match="cannot write the profile"):
        t.write(tmp_path / "file" / "p.csv")  # under a file


def test_decimal_parquet_columns_are_read_as_numbers(tmp_path):
    from decimal import Decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"task": ["a"], "strategy": ["ddp"], "gpus": pa.array([Decimal("2")]),
                             "step_time_s": pa.array([Decimal("1.5")]), "steps": [10],
                             "startup_s": pa.array([Decimal("0.25")])}), tmp_path / "p.parquet")
    (c,) = ProfileTable.read(tmp_path / "p.parquet")
    assert (c.gpus, c.step_time_s, c.startup_s) == (2, 1.5, 0.25)


def test_strategy_names_are_read_in_any_case_as_the_registered_lower_case_name(tmp_path):
    p = write(tmp_path, "task,strategy,gpus,step_time_s,steps,feasible\na,DDP,2,1.0,10,TRUE\nb, Fsdp ,1,2.0,5,True\n")
    t = ProfileTable.read(p)
    assert t.strategies() == {"ddp", "fsdp"} and t.get("a", "ddp", 2).step_time_s == 1.0
    t.check_strategies(["ddp", "fsdp"])  # executable: the names are the registered ones
    # DDP and ddp are one configuration: a second row for it is a duplicate, not a second configuration.
    dup = write(tmp_path, "task,strategy,gpus,step_time_s,steps\na,DDP,1,1.0,10\na,ddp,1,0.5,10\n", "dup.csv")
    with pytest.raises(ProfileError, match=r"row 2: duplicate of row 1 \(task 'a', strategy 'ddp'"):
        ProfileTable.read(dup)


def test_strategy_names_elsewhere_are_matched_in_any_case_too():
    from ray_saturn.strategies.registry import get_strategy, register
    from ray_saturn.strategies.single import Single
    from ray_saturn.toy import mlp_task

    assert get_strategy("DDP").name == "ddp"
    assert dataclasses.replace(mlp_task("m"), strategies=("Single", "DDP")).strategies == ("single", "ddp")

    class Shouting(Single):
        name = "Shouting"

    from ray_saturn.strategies.base import StrategyError

    with pytest.raises(StrategyError, match="name it in lower case: name = 'shouting'"):
        register(Shouting)


def test_a_header_name_off_by_case_or_spaces_is_pointed_at(tmp_path):
    """'task, strategy' (a space after each comma) or 'Task' said only that task was missing."""
    f = tmp_path / "p.csv"
    f.write_text("Task, strategy,gpus,step_time_s,steps\na,ddp,1,1.0,10\n")
    with pytest.raises(ProfileError, match=r"missing column\(s\) task, strategy; .*; the header has 'Task', "
                       r"' strategy': write each name exactly, in lower case and without spaces"):
        ProfileTable.read(f)


def test_the_missing_column_error_lists_every_optional_column_the_reader_reads(tmp_path):
    """It listed nodes, feasible, peak_mem_gb and the cost columns only: gpu_type, device_mem_gb, weight,
    arrival_s and reason, which ray_saturn reads too, were not said."""
    import inspect
    import re

    import ray_saturn.profile_table as pt
    from ray_saturn.sim import workload
    from ray_saturn.solver import objective

    read = set(re.findall(r'data\["(\w+)"\]', inspect.getsource(pt._normalise))) | set(pt.COST_COLUMNS)
    for module in (objective, workload):  # columns read from the table elsewhere (weight, arrival_s)
        read |= set(re.findall(r'"(\w+)" (?:not )?in table\.column_names', inspect.getsource(module)))
    assert {"gpu_type", "device_mem_gb", "weight", "arrival_s", "reason"} <= read
    assert read - set(pt.REQUIRED) == set(pt.OPTIONAL_COLUMNS), "OPTIONAL_COLUMNS is every optional column read"
    with pytest.raises(ProfileError) as err:
        ProfileTable.read(write(tmp_path, "task,strategy,gpus,steps\na,ddp,1,3\n"))
    optional = re.search(r"\(optional: ([^)]*)\)", str(err.value)).group(1).split(", ")
    assert optional == list(pt.OPTIONAL_COLUMNS), str(err.value)
