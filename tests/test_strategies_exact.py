"""Every exact strategy on 2 gloo workers trains like one process; checkpoints move between them."""

from __future__ import annotations

import os

import pytest
import torch
from dist_helpers import run_workers

from ray_saturn.strategies import StrategyError, WorkerContext, get_strategy, train_worker
from ray_saturn.strategies.checkpoint import latest_checkpoint, load_checkpoint
from ray_saturn.strategies.introspect import build_model
from ray_saturn.toy import mlp_task
from ray_saturn.workloads.text import gpt_task

STEPS = 8
TASK = dict(name="mlp", lr=0.01, depth=4, width=32, batch_size=16, batches=5)
EXACT_2 = {
    "ddp": {},
    "fsdp": {},
    "fsdp-ac": {"activation_checkpointing": True, "reshard_after_forward": False},
    "pipeline": {"microbatches": 4, "split": "layers"},
    "pipeline-params": {"microbatches": 1, "split": [3]},
    "zero": {},
    "zero-unbucketed": {"reduce_buffer_size": 0},
}
COMPRESSED = {
    "q8": {"method": "quantize", "bits": 8},
    "q4": {"method": "quantize", "bits": 4},
    "psgd": {"method": "powersgd", "rank": 1},
}
LONG = 80
CHAIN = 15
#: strategies whose per-worker peak memory the search measures on 2 workers
MEASURED = ("ddp", "zero", "fsdp")
#: A transformer with tied input/output embeddings (FSDP must keep them in one group).
GPT = dict(width=32, depth=2, heads=2, context=16, batch_size=8, batches=4, max_steps=STEPS, name="gpt")


def _sgd(params, hp):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def gpt():
    """The GPT task with SGD: Adam would blow the rounding noise on the key bias (whose true
    gradient is 0: softmax ignores it) up to full-size steps, in one process as in two."""
    t = gpt_task(**GPT)
    t.optimizer = _sgd
    return t


def task(**kw):
    return mlp_task(**{**TASK, **kw})


def train(strategy, knobs, root, name, target, t=None, every=None):
    losses: list[float] = []
    train_worker(
        t or task(),
        strategy,
        knobs,
        target_step=target,
        checkpoint_dir=os.path.join(root, name),
        checkpoint_every=every or target,
        report=lambda r: losses.append(r["loss"]),
    )
    return losses


def job_a(rank, root):
    out = {}
    for name, knobs in EXACT_2.items():
        out[name] = train(name.split("-")[0], knobs, root, name, STEPS)
    out["chain-fsdp"] = train("fsdp", {}, root, "chain", 3)
    out["gpt-fsdp"] = train("fsdp", {}, root, "gpt-fsdp", STEPS, gpt())
    out["gpt-ddp"] = train("ddp", {}, root, "gpt-ddp", STEPS, gpt())
    out["gpt-zero"] = train("zero", {"reduce_buffer_size": 0}, root, "gpt-zero", STEPS, gpt())
    long = task(batches=8, max_steps=LONG)
    out["long-ddp"] = train("ddp", {}, root, "long-ddp", LONG, long)
    for name, knobs in COMPRESSED.items():
        out[f"long-{name}"] = train("ddp-compressed", knobs, root, f"long-{name}", LONG, long)
    ctx = WorkerContext.current()
    out["x-peak-gb"] = {s: get_strategy(s).search(task(), ctx, warmup=1, steps=1).peak_mem_gb for s in MEASURED}
    bad = task()
    bad.optimizer = _needs_tag
    try:
        train("zero", {}, root, "zero-bad-optimizer", 1, bad)
        out["x-zero-error"] = None
    except StrategyError as exc:
        out["x-zero-error"] = str(exc)
    return out


class _TaggedSGD(torch.optim.SGD):
    """An optimizer zero cannot rebuild from its defaults (``tag`` is not among them)."""

    def __init__(self, params, tag, lr=0.1):
        super().__init__(params, lr=lr)


def _needs_tag(params, hp):
    return _TaggedSGD(params, "x")


def job_b(rank, root):
    return {
        "chain-pipeline": train("pipeline", {"microbatches": 2}, root, "chain", 9),
        "chain-zero": train("zero", {}, root, "chain", 12),
        "chain-ddp": train("ddp", {}, root, "chain", CHAIN),
    }


def _single_from(root, name, t=None):
    """A one-process runner loaded from a run's last checkpoint (any writer layout)."""
    t = t or task()
    runner = get_strategy("single").prepare(build_model(t), t, {}, WorkerContext(0, 1, torch.device("cpu")))
    path = os.path.join(root, name)
    load_checkpoint(latest_checkpoint(path), runner.module, runner.optimizer, path)
    return runner


def weights(root, name, t=None):
    """Final weights of a run, read back into a plain one-process model (any writer layout)."""
    return {k: v.clone() for k, v in _single_from(root, name, t).module.state_dict().items()}


def optimizer_state(root, name):
    """Final optimizer state of a run, per parameter name, read back into one process."""
    runner = _single_from(root, name)
    names = {id(p): n for n, p in runner.module.named_parameters()}
    return {
        f"{names[id(p)]}.{k}": v.clone()
        for p, state in runner.optimizer.state.items()
        for k, v in state.items()
        if isinstance(v, torch.Tensor)
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("strategies"))
    ref = {"single": train("single", {}, root, "single", STEPS)}
    ref["long-single"] = train("single", {}, root, "long-single", LONG, task(batches=8, max_steps=LONG))
    ref["chain-single"] = train("single", {}, root, "chain-ref", CHAIN)
    ref["gpt-single"] = train("single", {}, root, "gpt-single", STEPS, gpt())
    a = run_workers(job_a, 2, root)
    ref.update(a[0])
    assert {k: v for k, v in a[1].items() if not k.startswith("x-")} == {
        k: [] for k in a[0] if not k.startswith("x-")
    }, "only rank 0 reports"
    ref["chain-spill"] = train("spill", {"shards": 3}, root, "chain", 6)
    ref.update(run_workers(job_b, 2, root)[0])
    return root, ref


def assert_same_weights(a, b, atol=1e-5):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-4, msg=f"parameter {k}")


@pytest.mark.parametrize("name", list(EXACT_2))
def test_exact_strategy_matches_one_process(runs, name):
    root, r = runs
    assert len(r[name]) == STEPS
    torch.testing.assert_close(torch.tensor(r[name]), torch.tensor(r["single"]), rtol=1e-4, atol=1e-6)
    assert_same_weights(weights(root, name), weights(root, "single"))


@pytest.mark.parametrize("name", ["zero", "zero-unbucketed"])
def test_zero_checkpoint_holds_every_optimizer_shard(runs, name):
    """Each worker wrote the Adam state of the parameters it owns: read into one process, it is
    the whole state of one-process training (a lost shard would be missing or still zero)."""
    root, _ = runs
    got, ref = optimizer_state(root, name), optimizer_state(root, "single")
    assert got.keys() == ref.keys() and any(k.endswith("exp_avg_sq") for k in ref)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)


def test_zero_and_fsdp_use_less_memory_per_worker_than_ddp(runs):
    """The profiler's CPU memory figure (tensor bytes per worker) shows the sharding."""
    _, r = runs
    peak = r["x-peak-gb"]
    print({k: f"{v * 1e6:.1f} kB" for k, v in peak.items()})
    assert peak["zero"] < 0.8 * peak["ddp"] and peak["fsdp"] < 0.8 * peak["ddp"]


def test_zero_says_when_it_cannot_rebuild_the_optimizer(runs):
    _, r = runs
    assert "zero rebuilds the optimizer on each shard as _TaggedSGD(params, **defaults)" in r["x-zero-error"]
    assert "use ddp or fsdp" in r["x-zero-error"]


@pytest.mark.parametrize("name", ["gpt-fsdp", "gpt-ddp", "gpt-zero"])
def test_tied_weights_transformer_matches_one_process(runs, name):
    root, r = runs
    assert len(r[name]) == STEPS
    torch.testing.assert_close(torch.tensor(r[name]), torch.tensor(r["gpt-single"]), rtol=1e-4, atol=1e-6)
    assert_same_weights(weights(root, name, gpt()), weights(root, "gpt-single", gpt()))


def test_spill_matches_one_process(tmp_path):
    ref = train("single", {}, str(tmp_path), "single", STEPS)
    for shards in (1, 2, 7):
        got = train("spill", {"shards": shards}, str(tmp_path), f"spill{shards}", STEPS)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-5, atol=1e-7)
        assert_same_weights(weights(str(tmp_path), f"spill{shards}"), weights(str(tmp_path), "single"))


def test_reference_really_trains(runs):
    _, r = runs
    assert r["long-single"][-1] < 0.5 * r["long-single"][0]


def test_switch_strategy_and_worker_count_mid_training(runs):
    """fsdp on 2 -> spill on 1 -> pipeline on 2 -> zero on 2 -> ddp on 2 equals uninterrupted single
    training (Adam: every optimizer state moves between sharded, stage-split and whole layouts)."""
    root, r = runs
    chain = r["chain-fsdp"] + r["chain-spill"] + r["chain-pipeline"] + r["chain-zero"] + r["chain-ddp"]
    assert len(chain) == CHAIN
    torch.testing.assert_close(torch.tensor(chain), torch.tensor(r["chain-single"]), rtol=1e-4, atol=1e-6)
    assert_same_weights(weights(root, "chain"), weights(root, "chain-ref"))


#: ddp-compressed's stated margin: mean loss of the last 10 steps within 25% (+0.01) of exact DDP's.
MARGIN_REL, MARGIN_ABS = 0.25, 0.01


@pytest.mark.parametrize("name", list(COMPRESSED))
def test_compressed_ddp_converges_within_margin(runs, name):
    _, r = runs
    exact, got = r["long-ddp"], r[f"long-{name}"]
    torch.testing.assert_close(torch.tensor(exact), torch.tensor(r["long-single"]), rtol=1e-4, atol=1e-6)
    tail_exact = sum(exact[-10:]) / 10
    tail = sum(got[-10:]) / 10
    assert tail < 0.5 * got[0], f"{name} did not train: {got[0]:.4f} -> {tail:.4f}"
    assert tail <= tail_exact * (1 + MARGIN_REL) + MARGIN_ABS, f"{name}: {tail:.4f} vs exact {tail_exact:.4f}"
    assert got != exact, "compression changed nothing; is the hook installed?"
