"""``ray-saturn emulate`` and ``ray_saturn.runtime.emulation.emulate`` on odd and bad input: what must be
refused in one line before the emulated cluster starts (no Ray here), and what the run folder keeps."""

from __future__ import annotations

import contextlib
import itertools

import pytest

import ray_saturn.runtime.emulation as emulation
from ray_saturn.cli import main
from ray_saturn.errors import SaturnError
from ray_saturn.runtime.emulation import emulate

ROWS = "task,strategy,gpus,step_time_s,steps\na,ddp,1,1.0,100\na,ddp,2,0.6,100\nb,ddp,1,0.5,50\n"


@pytest.fixture
def no_cluster(monkeypatch):
    """Any start of an emulated cluster fails the test: bad input is refused before it."""

    def refuse(*a, **k):
        raise AssertionError("bad input must be refused before the emulated cluster starts")

    monkeypatch.setattr(emulation, "emulated_cluster", refuse)


@pytest.fixture
def profile(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text(ROWS)
    return p


def _an_earlier_run(folder):
    from ray_saturn.profile_table import ProfileTable
    from ray_saturn.runtime.actor import prepare_run
    from ray_saturn.runtime.config import RunSettings, emulation_config
    from ray_saturn.runtime.storage import RunStorage

    table = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10}])
    prepare_run(RunStorage(folder), RunSettings(name="outer", mode="emulate", driver=emulation_config(0.01),
                                                emulated_cluster={"nodes": 1, "gpus_per_node": 1}), table)
    (folder / "tasks" / "a").mkdir(parents=True)


@pytest.mark.parametrize("inside", ["sub", "tasks", "tasks/a", "tasks/a/deeper"])
def test_a_run_folder_inside_another_run_is_refused(tmp_path, capsys, no_cluster, profile, inside):
    outer = tmp_path / "outer"
    _an_earlier_run(outer)
    before = sorted(p.relative_to(outer) for p in outer.rglob("*") if p.is_file())
    existed = (outer / inside).exists()
    argv = ["emulate", str(profile), "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "0.01",
            "--run-dir", str(outer / inside)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"is inside the folder of another run ({outer})" in err, err
    assert sorted(p.relative_to(outer) for p in outer.rglob("*") if p.is_file()) == before
    assert (outer / inside).exists() == existed  # the refused folder is not left behind, empty
    # The Python API refuses it the same way; a folder next to the run is fine up to the cluster.
    with pytest.raises(SaturnError, match="inside the folder of another run"):
        emulate(str(profile), 1, 2, time_scale=0.01, storage=outer / inside)
    with pytest.raises(AssertionError, match="refused before the emulated cluster"):
        emulate(str(profile), 1, 2, time_scale=0.01, storage=tmp_path / "beside")


def test_stray_files_of_another_program_above_a_run_folder_are_not_a_run(tmp_path):
    """Only a run.json that reads as a run's settings makes a folder a run's: a state.json or events.jsonl of
    another program (in /tmp, say) must not refuse every run folder below it."""
    from ray_saturn.runtime.actor import enclosing_run
    from ray_saturn.runtime.storage import RunStorage

    (tmp_path / "state.json").write_text('{"tasks": {}}')
    (tmp_path / "events.jsonl").write_text("{}\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "run.json").write_text('{"name": "x", "mode": "build"}')  # someone else's run.json
    assert enclosing_run(RunStorage(tmp_path / "a" / "b" / "run")) is None
    _an_earlier_run(tmp_path / "a" / "b")
    assert enclosing_run(RunStorage(tmp_path / "a" / "b" / "run")) == str(tmp_path / "a" / "b")


def _files(folder):
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


@pytest.mark.parametrize("kwargs, message", [
    # A task that fits no node of the emulated cluster: the CLI refused it, the Python API started a
    # cluster and returned a failed run (with a run folder) after ~10 s.
    ({"nodes": 1, "gpus_per_node": 1}, "task 'a' fits nowhere"),
    ({"nodes": 2, "gpus_per_node": 1, "gpu_types": ["fast", "fast"]}, "fits nowhere"),
    # Arrivals of a task the profile does not have (ignored by the driver), or before 0.
    ({"arrivals": {"zzz": 5.0}}, "arrivals: task(s) 'zzz' are not in the profile"),
    ({"arrivals": {"a": -5.0}}, "arrivals['a'] is -5.0; give a finite number from 0"),
    ({"arrivals": [("a", 1.0)]}, "arrivals is a list; give a mapping"),
    # A time scale checked only as 'not > 0' when a config was given: inf slept for ever, 'x' a TypeError.
    ({"time_scale": float("inf"), "config": "cfg"}, "time_scale (wall seconds per profile second) is inf"),
    ({"time_scale": "x"}, "time_scale (wall seconds per profile second) is 'x'"),
    ({"time_scale": 1e-320}, "whose inverse is finite too"),
    # A GPU-type string for a list: was '4 GPU type(s) for 2 emulated node(s)'.
    ({"gpu_types": "fast"}, "gpu_types is the text 'fast'; give a list of one GPU type per emulated node"),
    # Ray not running: was RaySystemError from the state API, after the run folder was written.
    ({"use_running_ray": True}, "use_running_ray=True but Ray is not initialised"),
])
def test_the_python_api_refuses_before_anything_starts(tmp_path, no_cluster, kwargs, message):
    from ray_saturn.profile_table import ProfileTable
    from ray_saturn.runtime.config import emulation_config

    table = ProfileTable.from_rows([
        {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 100},
        {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 100, "gpu_type": "fast"},
    ])
    kw = {"nodes": 1, "gpus_per_node": 2, "time_scale": 0.01, **kwargs}
    if kw.get("config") == "cfg":
        kw["config"] = emulation_config(0.01)
    run_dir = tmp_path / "run"
    with pytest.raises(SaturnError) as info:
        emulate(table, kw.pop("nodes"), kw.pop("gpus_per_node"), storage=run_dir, **kw)
    assert message in str(info.value) and "\n" not in str(info.value), info.value
    assert _files(run_dir) == []


CLUSTER = '{"nodes": [{"name": "big", "gpus": 3}, {"name": "x,y", "gpus": 1, "gpu_type": "slow"}]}'
TYPED = ("task,strategy,gpus,step_time_s,steps,gpu_type\nwide,ddp,3,0.5,300,\nwide,ddp,2,0.7,300,\n"
         "s1,single,1,1.0,200,slow\ns1,single,1,0.8,200,\ns2,single,1/2,1.0,150,slow\ns3,ddp,2,0.4,300,\n")


def test_emulate_takes_a_cluster_file(tmp_path, monkeypatch, capsys):
    """``emulate --cluster FILE`` as ``plan`` and ``simulate`` take it (was: '--nodes, --gpus-per-node are
    required'): nodes of different sizes and types, checked before the cluster starts, recorded for resume."""
    import ray_saturn.cli.emulate as cli_emulate

    seen = {}

    def fake(profile, nodes, gpus_per_node, **kw):
        seen.update(kw, nodes=nodes, gpus_per_node=gpus_per_node)
        return {"state": "finished", "tasks": [], "run_dir": "x", "planned_makespan_s": 1.0,
                "realised_makespan_s": 1.0, "moves": 0, "replans": 0, "launch_latency_s": 0, "wall_s": 0}

    monkeypatch.setattr(cli_emulate, "emulate", fake)
    prof, cluster = tmp_path / "p.csv", tmp_path / "c.json"
    prof.write_text(TYPED)
    cluster.write_text(CLUSTER)
    base = ["emulate", str(prof), "--time-scale", "0.01"]
    assert main([*base, "--cluster", str(cluster)]) == 0
    assert seen["nodes"] is None and seen["gpus_per_node"] is None
    assert [(n.name, n.gpus, n.gpu_type) for n in seen["cluster"].nodes] == [("big", 3, None), ("x,y", 1, "slow")]
    capsys.readouterr()
    small = tmp_path / "small.json"
    small.write_text('{"nodes": [{"name": "a", "gpus": 1}, {"name": "b", "gpus": 1, "gpu_type": "slow"}]}')
    huge = tmp_path / "huge.json"
    huge.write_text('{"nodes": [{"name": "a", "gpus": 1000}]}')
    for argv, message in [
        ([*base, "--cluster", str(cluster), "--nodes", "2"], "give either --cluster FILE or --nodes N"),
        ([*base, "--cluster", str(cluster), "--gpu-types", "a,b"], "give either --cluster FILE or --nodes N"),
        ([*base, "--nodes", "2"], "give --nodes N and --gpus-per-node G (or --cluster FILE)"),
        ([*base, "--cluster", str(tmp_path / "nope.json")], "no such cluster file"),
        ([*base, "--cluster", str(small)], "fits nowhere"),
        ([*base, "--cluster", str(huge)], "worker slots are more than this machine can emulate"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


def test_the_python_api_records_a_cluster_file_and_resume_starts_it_again(tmp_path, monkeypatch):
    """``emulate(cluster=...)``: the nodes go to the emulated cluster and into run.json, from which a resumed
    emulation starts the same nodes."""
    from ray_saturn.runtime.journal import Journal
    from ray_saturn.runtime.storage import RunStorage

    started = []

    @contextlib.contextmanager
    def fake_cluster(*a, **k):
        started.append((a, k))
        raise RuntimeError("stop here")
        yield

    monkeypatch.setattr(emulation, "emulated_cluster", fake_cluster)
    prof, cluster = tmp_path / "p.csv", tmp_path / "c.json"
    prof.write_text(TYPED)
    cluster.write_text(CLUSTER)
    with pytest.raises(SaturnError, match="give either cluster or nodes"):
        emulate(str(prof), 2, 2, cluster=str(cluster), time_scale=0.01, storage=tmp_path / "x")
    with pytest.raises(SaturnError, match="give nodes and gpus_per_node"):
        emulate(str(prof), time_scale=0.01, storage=tmp_path / "x")
    with pytest.raises(RuntimeError, match="stop here"):
        emulate(str(prof), cluster=str(cluster), time_scale=0.01, storage=tmp_path / "run")
    (args, kw), = started
    assert args == () and [n.name for n in kw["cluster"].nodes] == ["big", "x,y"]
    journal = Journal(RunStorage(tmp_path / "run", create=False))
    with pytest.raises(RuntimeError, match="stop here"), emulation.emulated_context(journal):
        pass
    assert started[1][1]["cluster"] == kw["cluster"]


@pytest.mark.ray
def test_an_emulated_cluster_file_runs_to_the_contract(tmp_path):
    """One emulation on a cluster file's nodes (3 GPUs untyped, 1 of type slow, a name with a comma): every
    task finishes on the nodes named in the file, one task's segments never overlap, and no node (nor
    device) ever holds more than it has."""
    prof, cluster = tmp_path / "p.csv", tmp_path / "c.json"
    prof.write_text(TYPED)
    cluster.write_text(CLUSTER)
    out = emulate(str(prof), cluster=str(cluster), time_scale=0.005, storage=tmp_path / "run")
    assert out["state"] == "finished", out
    caps = {"big": 3, "x,y": 1}
    assert isinstance(out["moves"], int) and isinstance(out["replans"], int)
    use: dict = {}
    latest = 0.0
    for t in out["tasks"]:
        assert t["state"] == "finished" and t["steps_done"] == t["total_steps"], t
        segs = sorted(t["segments"], key=lambda s: s["start_s"])
        assert all(a["end_s"] <= b["start_s"] for a, b in itertools.pairwise(segs)), segs
        for s in segs:
            assert set(s["nodes"]) <= set(caps), s
            latest = max(latest, s["end_s"])
            for node, devs in s["devices"].items():
                for d, share in devs:
                    use.setdefault((node, d), []).append((s["start_s"], s["end_s"], share))
    assert {t["task"]: t["segments"][-1]["nodes"] for t in out["tasks"]}["wide"] == ["big"]
    for (node, d), spans in use.items():
        assert d < caps[node], (node, d)
        for start, _, _ in spans:
            assert sum(sh for a, b, sh in spans if a <= start < b) <= 1.0 + 1e-9, (node, d, spans)
    assert out["realised_makespan_s"] >= latest
