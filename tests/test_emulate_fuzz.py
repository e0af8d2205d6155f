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
