"""``ray-saturn emulate`` and ``ray_saturn.runtime.emulation.emulate`` on odd and bad input: what must be
refused in one line before the emulated cluster starts (no Ray here), and what the run folder keeps."""

from __future__ import annotations

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
    argv = ["emulate", str(profile), "--nodes", "1", "--gpus-per-node", "2", "--time-scale", "0.01",
            "--run-dir", str(outer / inside)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"is inside the folder of another run ({outer})" in err, err
    assert sorted(p.relative_to(outer) for p in outer.rglob("*") if p.is_file()) == before
    # The Python API refuses it the same way; a folder next to the run is fine up to the cluster.
    with pytest.raises(SaturnError, match="inside the folder of another run"):
        emulate(str(profile), 1, 2, time_scale=0.01, storage=outer / inside)
    with pytest.raises(AssertionError, match="refused before the emulated cluster"):
        emulate(str(profile), 1, 2, time_scale=0.01, storage=tmp_path / "beside")


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
