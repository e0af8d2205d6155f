"""Task and cluster descriptions: validation with errors that say how to fix them."""

from __future__ import annotations

import json

import pytest
import torch

from ray_saturn import ClusterSpec, NodeSpec, SpecError, Task
from ray_saturn.spec import check_name


@pytest.mark.parametrize("bad", ["", "..", ".", "a/b", "../x", "a\x00b", "-rf", ".hidden", "a b", "x" * 200, 7,
                                 "a\n", "a\nb", "a\r", "a\\b", "/abs", "\uff41", "a\u2215b", "a\u2024\u2024"])
def test_names_that_could_escape_a_folder_are_rejected(bad):
    with pytest.raises(SpecError):
        check_name(bad)


def test_a_name_with_a_letter_outside_ascii_is_told_ascii():
    with pytest.raises(SpecError, match="use ASCII letters, digits"):  # it said "letters": é is one
        check_name("bért")


@pytest.mark.parametrize("good", ["bert-4", "gpt_lr1e-3", "a.b", "x+y=z", "A9"])
def test_ordinary_names_pass(good):
    assert check_name(good) == good


def test_a_task_named_with_a_trailing_newline_is_refused(tmp_path):
    # "$" in a regular expression also matches before a final newline: "a\n" passed for a task name.
    from ray_saturn.runtime.storage import RunStorage

    with pytest.raises(SpecError):
        make_task(name="bert\n")
    with pytest.raises(SpecError):
        RunStorage(tmp_path).task_dir("bert\n")
    assert not (tmp_path / "tasks").exists()


def make_task(**kw):
    args = dict(
        name="mlp",
        model=lambda hp: torch.nn.Linear(2, 1),
        data=lambda hp: [],
        loss=lambda out, batch: out.sum(),
        optimizer=lambda params, hp: torch.optim.SGD(params, lr=0.1),
        max_steps=10,
    )
    args.update(kw)
    return Task(**args)


def test_task_validation():
    assert make_task().total_steps == 10
    assert make_task(max_steps=None, epochs=3, steps_per_epoch=7).total_steps == 21
    with pytest.raises(SpecError, match="exactly one of epochs= or max_steps="):
        make_task(epochs=2)
    with pytest.raises(SpecError, match="needs steps_per_epoch"):
        make_task(max_steps=None, epochs=2)
    with pytest.raises(SpecError, match="model must be callable"):
        make_task(model=3)
    with pytest.raises(SpecError, match="not allowed"):
        make_task(name="../../etc")
    with pytest.raises(SpecError, match="max_steps is 0"):
        make_task(max_steps=0)
    assert make_task(strategies="ddp").strategies == ("ddp",)


def test_cluster_specs(tmp_path):
    c = ClusterSpec.uniform(3, 4)
    assert c.total_gpus == 12 and c.names == ("node-0", "node-1", "node-2")
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"nodes": [{"name": "big", "gpus": 8}, {"name": "small", "gpus": 2}]}))
    h = ClusterSpec.from_json(f)
    assert [n.gpus for n in h.nodes] == [8, 2]
    assert ClusterSpec.from_dict(h.to_dict()) == h
    with pytest.raises(SpecError, match="appears twice"):
        ClusterSpec((NodeSpec("a", 1), NodeSpec("a", 2)))
    with pytest.raises(SpecError, match="no nodes"):
        ClusterSpec(())
    with pytest.raises(SpecError, match="GPUs per node is 0; give a whole number from 1 to 1024"):
        ClusterSpec.uniform(2, 0)
    with pytest.raises(SpecError, match="number of nodes is 100000000; give a whole number from 1 to 100000"):
        ClusterSpec.uniform(10**8, 1)  # refused before a node is built
    for bad in ("Infinity", "NaN", "1e30", "2.5", "true", '"four"'):
        f.write_text('{"nodes": [{"name": "a", "gpus": ' + bad + "}]}")
        with pytest.raises(SpecError, match=r"node 'a' gpus is .*; give a whole number from 1 to 1024"):
            ClusterSpec.from_json(f)
    f.write_text("{not json")
    with pytest.raises(SpecError, match="not a readable JSON cluster file"):
        ClusterSpec.from_json(f)
    f.write_text('{"nodes": [{"gpus": 2}]}')
    with pytest.raises(SpecError, match='must be an object with "name" and "gpus"'):
        ClusterSpec.from_json(f)


def test_cluster_inputs_of_the_wrong_kind_are_one_line(tmp_path):
    with pytest.raises(SpecError, match="the cluster's nodes are a NoneType; give a tuple of NodeSpec"):
        ClusterSpec(None)
    with pytest.raises(SpecError, match="cluster file is None; give the path"):
        ClusterSpec.from_json(None)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SpecError, match=r"deep\.json: the JSON is nested too deeply"):
        ClusterSpec.from_json(deep)


def test_a_misspelt_node_key_is_refused_not_dropped(tmp_path):
    """A typo such as "gpu-type" left the node untyped without a word; now it is one line naming the key."""
    f = tmp_path / "c.json"
    f.write_text('{"nodes": [{"name": "a", "gpus": 4, "gpu-type": "A100"}]}')
    with pytest.raises(SpecError, match=r"c\.json: cluster node #0 \('a'\) has unknown key\(s\) gpu-type; "
                       "a node takes name, gpus, gpu_type, node_id"):
        ClusterSpec.from_json(f)
    typed = ClusterSpec.from_dict({"nodes": [{"name": "a", "gpus": 4, "gpu_type": "A100", "node_id": "ab"}]})
    assert ClusterSpec.from_dict(typed.to_dict()) == typed and typed.nodes[0].gpu_type == "A100"


@pytest.mark.parametrize("bad, kind", [(5, "int"), ("a", "str"), ({"a": 1}, "dict"), (None, "NoneType")])
def test_run_tasks_and_storage_of_the_wrong_kind_are_one_line(tmp_path, bad, kind):
    """ray_saturn.run(5, ...) and run_status(None) were TypeErrors from inside; checked before Ray or any folder."""
    import ray_saturn
    from ray_saturn.runtime.storage import StorageError

    with pytest.raises(SpecError, match=f"tasks is a {kind}; give a list of ray_saturn.Task"):
        ray_saturn.run(bad, ClusterSpec.uniform(1, 1), storage=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()
    if not isinstance(bad, str):
        with pytest.raises(StorageError, match=f"the run folder is a {kind}; give a local path or a URI"):
            ray_saturn.run_status(bad)


def test_a_top_level_key_other_than_nodes_is_kept_but_named(tmp_path, caplog):
    """A name or a comment beside "nodes" is fine, but a misspelt setting ("gpu_types": ...) must not pass
    without a word: one warning names the ignored keys."""
    f = tmp_path / "c.json"
    f.write_text('{"name": "lab", "gpu_types": {"a": "A100"}, "nodes": [{"name": "a", "gpus": 4}]}')
    with caplog.at_level("WARNING", logger="ray_saturn.spec"):
        spec = ClusterSpec.from_json(f)
    assert spec.total_gpus == 4
    assert [r.getMessage() for r in caplog.records] == [
        f"{f}: key(s) 'name', 'gpu_types' ignored; a cluster file is read for its \"nodes\" only"]
    caplog.clear()
    f.write_text('{"nodes": [{"name": "a", "gpus": 4}]}')
    with caplog.at_level("WARNING", logger="ray_saturn.spec"):
        ClusterSpec.from_json(f)
    assert not caplog.records
