"""Run every strategy's knob search and a short training on real CUDA GPUs.

Prints, per strategy: the chosen knobs, the median step time, the peak
memory per GPU (torch.cuda.max_memory_allocated), the short training's loss,
and which strategies or knob settings are infeasible and why. One-GPU
strategies (single, spill) run in this process; the others on
min(2, GPUs) NCCL workers (they are reported as not run with one GPU).

    python release/gpu_check.py [--width 4096] [--depth 8] [--batch 64] [--train-steps 20]

Exits with status 2 and a message when CUDA is not available.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _task(args):
    from ray_saturn.toy import mlp_task

    return mlp_task(
        "gpu-check",
        features=args.width,
        width=args.width,
        depth=args.depth,
        batch_size=args.batch,
        batches=4,
        max_steps=args.train_steps,
    )


def _check(strategy: str, args) -> list[str]:
    from ray_saturn.strategies import WorkerContext, get_strategy, train_worker

    ctx = WorkerContext.current()
    task = _task(args)
    lines = []
    result = get_strategy(strategy).search(task, ctx, warmup=args.warmup, steps=args.steps)
    for t in result.trials:
        what = (
            f"{t.step_time_s * 1e3:8.2f} ms/step, peak {t.peak_mem_gb:6.2f} GB"
            if t.feasible
            else f"infeasible: {t.reason}"
        )
        lines.append(f"  {strategy:<15} {ctx.world_size} GPU  {dict(t.knobs)}  {what}")
    if not result.feasible:
        lines.append(f"  {strategy:<15} INFEASIBLE: {result.reason}")
        return lines
    losses: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        # the checkpoint folder must be shared by the workers: rank 0's temp dir is broadcast
        if ctx.distributed:
            import torch.distributed as dist

            box = [d]
            dist.broadcast_object_list(box, src=0)
            d = box[0]
        out = train_worker(
            task,
            strategy,
            result.knobs,
            target_step=args.train_steps,
            checkpoint_dir=d,
            checkpoint_every=args.train_steps,
            report=lambda r: losses.append(r["loss"]),
        )
    lines.append(
        f"  {strategy:<15} BEST {dict(result.knobs)}: {result.step_time_s * 1e3:.2f} ms/step, "
        f"peak {result.peak_mem_gb:.2f} GB; trained {out.final_step} steps "
        f"({out.mean_step_time_s * 1e3:.2f} ms/step), loss {losses[0]:.4f} -> {losses[-1]:.4f}"
        if losses
        else f"  {strategy:<15} BEST {dict(result.knobs)} (rank > 0)"
    )
    return lines


def _worker(rank: int, world: int, port: int, args, strategies) -> None:
    import torch.distributed as dist

    from ray_saturn.strategies.device import use_rank_device

    os.environ["LOCAL_RANK"] = str(rank)
    rd = use_rank_device(rank)
    dist.init_process_group(
        rd.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        for s in strategies:
            lines = _check(s, args)
            if rank == 0:
                print("\n".join(lines), flush=True)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--train-steps", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "gpu_check: CUDA is not available on this machine "
            "(torch.cuda.is_available() is False); "
            "run it on a machine with an NVIDIA GPU and a CUDA build of torch.",
            file=sys.stderr,
        )
        return 2
    from ray_saturn.strategies import get_strategy, strategy_names

    n = torch.cuda.device_count()
    print(
        f"{n} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}; "
        f"model: MLP width {args.width}, "
        f"depth {args.depth}, batch {args.batch}"
    )
    one = [s for s in strategy_names() if get_strategy(s).max_gpus == 1]
    many = [s for s in strategy_names() if s not in one]
    for s in one:
        print("\n".join(_check(s, args)), flush=True)
    if n < 2:
        for s in many:
            print(f"  {s:<15} not run: needs 2 GPUs, this machine has {n}")
        return 0
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(2, _free_port(), args, many), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
