"""release/gpu_check.py: exit 2 without CUDA, and a CPU rehearsal of every step (so it cannot rot unseen)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "release" / "gpu_check.py"


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_exits_2_with_a_clear_message():
    proc = _run()
    assert proc.returncode == 2
    assert "CUDA is not available on this machine" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_arguments_exit_2():
    proc = _run("--cpu", "--batch", "15")
    assert proc.returncode == 2 and "divisible by --gpus" in proc.stderr
    proc = _run("--cpu", "--strategies", "nope")
    assert proc.returncode == 2 and "unknown strategy nope" in proc.stderr


def test_cpu_rehearsal_checks_every_strategy(tmp_path):
    from ray_saturn.strategies import strategy_names

    out = tmp_path / "check.json"
    proc = _run("--cpu", "--width", "32", "--depth", "4", "--batch", "16", "--warmup", "1", "--steps", "1",
                "--train-steps", "4", "--skip-demo", "--json", str(out))
    print(proc.stdout[-4000:], proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    measured = {r["strategy"] for r in rows if r["step_ms"] is not None}
    assert measured == set(strategy_names())
    exact = [r for r in rows if r["step_ms"] is not None and r["strategy"] not in ("single", "ddp-compressed")]
    assert exact and all(r["verdict"] == "ok" and r["loss_rel"] <= 1e-4 and r["weight_rel"] <= 1e-4 for r in exact)
    offload = [r for r in rows if r["strategy"] == "fsdp" and '"cpu_offload":true' in r["knobs"]]
    assert offload and all(r["verdict"] == "infeasible" and "needs a CUDA device" in r["note"] for r in offload)
    assert "gpu_check took" in proc.stdout
    assert "SGD + momentum" in proc.stdout  # Adam's updates part two correct runs (see the script's docstring)


def test_the_demo_command_is_one_the_cli_takes(tmp_path, monkeypatch):
    """The demo step's arguments parse with ray-saturn's own parser (the first GPU run found
    ``--steps``, which the CLI never had: the rehearsal skips the demo)."""
    import argparse
    import importlib.util

    from ray_saturn.cli import build_parser

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", gpu_check)  # its dataclasses look their module up
    spec.loader.exec_module(gpu_check)
    argv = gpu_check.demo_argv(argparse.Namespace(demo_scale=0.5), 1, str(tmp_path / "demo"))
    args = build_parser().parse_args(argv)
    assert args.command == "demo" and args.gpus == 1 and args.scale == 0.5 and args.json
    proc = _run("--cpu", "--demo-scale", "0")
    assert proc.returncode == 2 and "--demo-scale is 0.0; it must be > 0" in proc.stderr
