"""Run a function on N gloo worker processes (torch.multiprocessing spawn) and collect results."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ray_saturn.strategies.worker import exit_finished_process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, out_dir: str, fn: Callable[..., Any], args: tuple) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = fn(rank, *args)
        torch.save(result, os.path.join(out_dir, f"result-{rank}.pt"))
    finally:
        dist.destroy_process_group()
    exit_finished_process()  # the result is on disk


def run_workers(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """``fn(rank, *args)`` on ``world`` processes in one gloo group; returns each rank's result."""
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_entry, args=(world, free_port(), out, fn, args), nprocs=world, join=True)
        return [torch.load(os.path.join(out, f"result-{r}.pt"), weights_only=False) for r in range(world)]
