"""The first script to run on a GPU node: every strategy on the node's real GPUs, then the demo; one table.

For every registered strategy (one-GPU strategies on 1 GPU, the others on
``--gpus``, default 2), in fresh worker processes that pick their device and
backend with :func:`ray_saturn.strategies.device.use_rank_device` (``cuda:<rank>``
and NCCL):

1. its knob search, exactly as the profiler runs it: the chosen knobs, the
   median step time and the profiler's peak memory per GPU
   (``torch.cuda.max_memory_allocated``, max over workers); knob settings that
   cannot run (and why) get a row each;
2. a short exactness check: ``--train-steps`` steps with the chosen knobs from
   the same seed and data as ``single`` on one GPU (TF32 off), comparing the
   losses and the final weights (read back from its checkpoint into one
   process) with ``single``'s: the largest relative difference, against
   ``--rtol`` for exact strategies (``ddp-compressed`` is approximate by design:
   its mean loss must be within ``--approx-margin`` of ``single``'s);
   the optimizer is SGD with momentum (``--optimizer``, so there is optimizer
   state to shard and checkpoint). Not Adam: Adam scales every update to about
   ``lr``, so a weight whose gradient is rounding noise moves by ``+-lr`` as the
   noise falls, and two correct runs part. On one H200 (2026-12-04), 8 steps at
   lr 0.01 of ``single`` with Adam's for-loop kernel against its foreach kernel
   (same GPU, same gradients up to rounding) left weights 0.49 apart (largest
   difference / largest weight; Frobenius 3.1e-4) with losses within 5e-7;
   ``spill`` (Adam on the CPU) against ``single``: 0.72. With SGD + momentum
   both were bit-identical;
3. the peak memory per GPU of that training (checkpoint included) against the
   profiler's figure (the plan relies on the figure: training must not need
   more than ``--mem-slack`` times it plus ``--mem-slack-gb``).

Then ``ray-saturn demo`` end to end on the node's GPUs (a subprocess with its
own Ray): exit status, wall time, realised against planned makespan.

    python release/gpu_check.py                      # MLP width 4096, depth 8, batch 64, SGD + momentum
    python release/gpu_check.py --gpus 4 --json gpu_check.json
    python release/gpu_check.py --cpu --width 32 --depth 4 --batch 16 --skip-demo   # CPU rehearsal

Exit status: 0 when every check passes, 1 when one fails, 2 when there is no
CUDA (or the arguments are wrong). ``--cpu`` rehearses the same steps on CPU
processes with gloo (figures are then CPU figures: tensor bytes, not GPU
memory); the suite runs it so that this script cannot rot unseen.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

#: Strategies that only approximate one-process training (checked to train, not for exactness).
APPROXIMATE = {"ddp-compressed"}


@dataclass
class Row:
    """One line of the table."""

    strategy: str
    gpus: int
    knobs: str = "-"
    step_ms: float | None = None
    profiled_gb: float | None = None
    trained_gb: float | None = None
    loss_rel: float | None = None
    weight_rel: float | None = None
    verdict: str = ""
    note: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict.startswith("FAIL")


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
        optimizer=args.optimizer,
    )


# ---------------------------------------------------------------- worker side
def _peak_reset(device: torch.device) -> Any:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return None
    from ray_saturn.strategies.memory import TensorMemory

    return TensorMemory()


def _peak_gb(device: torch.device, counter: Any) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) / 1e9
    return counter.peak_bytes(device) / 1e9


def _max_over_workers(value: float, ctx) -> float:
    if not ctx.distributed:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _check(strategy: str, args, ctx, root: str) -> dict[str, Any]:
    """Search and short training of one strategy on this worker group (collective)."""
    import contextlib

    from ray_saturn.strategies import get_strategy, train_worker

    strat = get_strategy(strategy)
    task = _task(args)
    reason = strat.applies(task, ctx.world_size)
    if reason:
        return {"reason": reason, "trials": []}
    result = strat.search(task, ctx, warmup=args.warmup, steps=args.steps)
    trials = [
        {"knobs": dict(t.knobs), "step_time_s": t.step_time_s, "peak_gb": t.peak_mem_gb, "reason": t.reason}
        for t in result.trials
    ]
    if not result.feasible:
        return {"reason": result.reason, "trials": trials}
    losses: list[float] = []
    counter = _peak_reset(ctx.device)
    with counter if counter is not None else contextlib.nullcontext():
        train_worker(
            task,
            strategy,
            result.knobs,
            target_step=args.train_steps,
            checkpoint_dir=os.path.join(root, strategy),
            checkpoint_every=args.train_steps,
            report=lambda r: losses.append(float(r["loss"])),
        )
    trained = _max_over_workers(_peak_gb(ctx.device, counter), ctx)
    return {
        "knobs": dict(result.knobs),
        "step_time_s": result.step_time_s,
        "profiled_gb": result.peak_mem_gb,
        "trained_gb": trained,
        "losses": losses,
        "trials": trials,
    }


def _worker(rank: int, world: int, port: int, args, strategies: list[str], root: str) -> None:
    import torch.distributed as dist

    from ray_saturn.strategies import WorkerContext
    from ray_saturn.strategies.device import use_rank_device

    os.environ["LOCAL_RANK"] = str(rank)
    rd = use_rank_device(rank)
    torch.backends.cuda.matmul.allow_tf32 = False  # the exactness check compares fp32 maths
    torch.backends.cudnn.allow_tf32 = False
    if rd.device.type == "cpu":
        torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group(rd.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        ctx = WorkerContext.current()
        results = {}
        for s in strategies:
            try:
                results[s] = _check(s, args, ctx, root)
            except Exception as exc:  # one broken strategy must not hide the others
                results[s] = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"}
        if rank == 0:
            with open(os.path.join(root, f"results-{world}.json"), "w") as f:
                json.dump(results, f)
        if world > 1:
            # Every rank is done with its collectives before any tears its process group down: a
            # rank that closed its connections while a peer was still in one aborted that peer
            # ("terminate called without an active exception", once in a full suite run).
            dist.barrier()
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _spawn(world: int, args, strategies: list[str], root: str) -> dict[str, Any]:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(world, _free_port(), args, strategies, root), nprocs=world, join=True)
    return json.loads(Path(root, f"results-{world}.json").read_text())


# ------------------------------------------------------------------ driver side
def _weights(task, root: str, strategy: str) -> dict[str, torch.Tensor]:
    """A run's final weights, read back on the CPU into a one-process model."""
    from ray_saturn.strategies import WorkerContext, get_strategy
    from ray_saturn.strategies.checkpoint import latest_checkpoint, load_checkpoint
    from ray_saturn.strategies.introspect import build_model

    runner = get_strategy("single").prepare(build_model(task), task, {}, WorkerContext(0, 1, torch.device("cpu")))
    path = os.path.join(root, strategy)
    load_checkpoint(latest_checkpoint(path), runner.module, runner.optimizer, path)
    return {k: v.detach().clone() for k, v in runner.module.state_dict().items()}


def relative_difference(got: list[float] | dict[str, torch.Tensor], ref) -> float:
    """Largest relative difference: per loss ``|a - b| / |b|``; per weight tensor ``max|a - b| / max|b|``.

    Example:
        >>> relative_difference([1.0, 2.0], [1.0, 2.002])
        0.000999...
    """
    if isinstance(ref, dict):
        return max(
            float((got[k] - ref[k]).abs().max() / ref[k].abs().max().clamp_min(1e-12)) for k in ref
        )
    if len(got) != len(ref):
        return math.inf
    return max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, ref, strict=True)), default=0.0)


def _rows(strategy: str, gpus: int, res: dict[str, Any], ref: dict[str, Any], args, root: str) -> list[Row]:
    rows = [
        Row(strategy, gpus, json.dumps(t["knobs"], separators=(",", ":")), verdict="infeasible", note=t["reason"])
        for t in res.get("trials", [])
        if t["reason"]
    ]
    if "error" in res:
        return [*rows, Row(strategy, gpus, verdict="FAIL error", note=res["error"])]
    if "losses" not in res:
        return [*rows, Row(strategy, gpus, verdict="infeasible", note=res.get("reason", ""))]
    row = Row(
        strategy,
        gpus,
        json.dumps(res["knobs"], separators=(",", ":")),
        res["step_time_s"] * 1e3,
        res["profiled_gb"],
        res["trained_gb"],
    )
    task = _task(args)
    if strategy != "single" and "losses" in ref:
        row.loss_rel = relative_difference(res["losses"], ref["losses"])
        row.weight_rel = relative_difference(_weights(task, root, strategy), _weights(task, root, "single"))
    problems = []
    if strategy in APPROXIMATE:
        losses, ref_losses = res["losses"], ref.get("losses") or []
        mean, ref_mean = sum(losses) / max(len(losses), 1), sum(ref_losses) / max(len(ref_losses), 1)
        if not (losses and all(math.isfinite(x) for x in losses)):
            problems.append("loss is not finite")
        elif ref_losses and abs(mean - ref_mean) > args.approx_margin * ref_mean:
            problems.append(f"mean loss {mean:.4g} not within {args.approx_margin:.0%} of single's {ref_mean:.4g}")
        row.note = f"approximate by design: mean loss within {args.approx_margin:.0%} of single's"
    elif row.loss_rel is not None and max(row.loss_rel, row.weight_rel or 0.0) > args.rtol:
        problems.append(f"differs from single by more than {args.rtol:g}")
    if (
        row.profiled_gb is not None
        and row.trained_gb is not None
        and row.trained_gb > args.mem_slack * row.profiled_gb + args.mem_slack_gb
    ):
        problems.append(f"training peak {row.trained_gb:.3g} GB above the profiled {row.profiled_gb:.3g} GB")
    row.verdict = "FAIL " + "; ".join(problems) if problems else "ok"
    return [*rows, row]


def demo_argv(args, gpus: int, out: str) -> list[str]:
    """The ``ray-saturn`` arguments of the demo run (the CLI's own parser must take them)."""
    return ["demo", "--gpus", str(gpus), "--scale", str(args.demo_scale), "--out", out, "--no-progress", "--json"]


def _demo(args, gpus: int, root: str) -> Row:
    """``ray-saturn demo`` end to end in a subprocess (its own Ray)."""
    out = os.path.join(root, "demo")
    cmd = [sys.executable, "-c", "import sys; from ray_saturn.cli import main; sys.exit(main())",
           *demo_argv(args, gpus, out)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.demo_timeout_s)
    wall = time.monotonic() - t0
    report = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                report = json.loads(line)
                break
            except ValueError:
                continue
    if proc.returncode != 0 or report is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return Row("demo", gpus, verdict=f"FAIL exit {proc.returncode}", note=tail[0][:200])
    realised, planned = report.get("realised_makespan_s"), report.get("planned_makespan_s")
    ratio = f"realised/planned makespan {realised / planned:.2f}" if realised and planned else ""
    note = f"{wall:.0f} s wall, {len(report['tasks'])} tasks; {ratio}"
    return Row("demo", gpus, verdict="ok", note=note)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def render(rows: list[Row]) -> str:
    head = ["strategy", "GPUs", "knobs", "step ms", "profiled GB/GPU", "trained GB/GPU", "loss rel", "weight rel",
            "verdict", "note"]
    body = [
        [r.strategy, str(r.gpus), r.knobs, _fmt(r.step_ms, ".2f"), _fmt(r.profiled_gb, ".4f"),
         _fmt(r.trained_gb, ".4f"), _fmt(r.loss_rel, ".1e"), _fmt(r.weight_rel, ".1e"), r.verdict, r.note]
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [head, *body]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=2, help="workers of the multi-GPU strategies (2)")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="timed steps per knob setting (5)")
    p.add_argument("--train-steps", type=int, default=8, help="steps of the exactness check (8)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                   help="sgd (with momentum, the default) or adam (ill-conditioned for the weight check: see above)")
    p.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance against single (1e-4)")
    p.add_argument("--mem-slack", type=float, default=1.2, help="training peak may be this x the profiled one ...")
    p.add_argument("--mem-slack-gb", type=float, default=0.05, help="... plus this (checkpoint staging; 0.05)")
    p.add_argument("--approx-margin", type=float, default=0.25,
                   help="ddp-compressed's mean loss within this of single's (0.25, the suite's stated margin)")
    p.add_argument("--strategies", help="comma-separated subset (default: every registered strategy)")
    p.add_argument("--skip-demo", action="store_true", help="do not run `ray-saturn demo`")
    p.add_argument("--demo-scale", type=float, default=1.0, help="the demo's --scale (a factor of its steps; 1)")
    p.add_argument("--demo-timeout-s", type=float, default=1800)
    p.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    p.add_argument("--out", metavar="DIR", help="keep checkpoints and results here (default: a temporary folder)")
    p.add_argument("--cpu", action="store_true", help="rehearse on CPU processes with gloo (no GPU figures)")
    args = p.parse_args(argv)
    if not args.demo_scale > 0:
        print(f"gpu_check: --demo-scale is {args.demo_scale}; it must be > 0", file=sys.stderr)
        return 2
    for name in ("gpus", "width", "depth", "batch", "steps", "train_steps"):
        if getattr(args, name) < 1:
            print(f"gpu_check: --{name.replace('_', '-')} is {getattr(args, name)}; it must be >= 1", file=sys.stderr)
            return 2
    if args.depth < 2 or args.batch % args.gpus:
        print(f"gpu_check: need --depth >= 2 and --batch ({args.batch}) divisible by --gpus ({args.gpus})",
              file=sys.stderr)
        return 2
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the workers (spawned) see no GPU
        count = args.gpus
        device = f"CPU rehearsal ({args.gpus} gloo processes)"
    elif not torch.cuda.is_available():
        print(
            "gpu_check: CUDA is not available on this machine (torch.cuda.is_available() is False); "
            "run it on a node with NVIDIA GPUs and a CUDA build of torch (or --cpu to rehearse it here).",
            file=sys.stderr,
        )
        return 2
    else:
        count = torch.cuda.device_count()
        device = f"{count} x {torch.cuda.get_device_name(0)}"
    from ray_saturn.strategies import get_strategy, strategy_names

    names = strategy_names()
    if args.strategies:
        wanted = [s.strip() for s in args.strategies.split(",") if s.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            print(f"gpu_check: unknown strategy {', '.join(unknown)} (registered: {', '.join(names)})",
                  file=sys.stderr)
            return 2
        names = [n for n in names if n in wanted or n == "single"]
    one = [s for s in names if get_strategy(s).max_gpus == 1]
    if "single" in one:  # the reference runs first
        one.remove("single")
        one.insert(0, "single")
    many = [s for s in names if s not in one]
    print(f"gpu_check on {device}, torch {torch.__version__}; model: MLP width {args.width}, depth {args.depth}, "
          f"batch {args.batch}, {'Adam' if args.optimizer == 'adam' else 'SGD + momentum'}; {args.train_steps} steps "
          "against single", flush=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        root = args.out or tmp
        Path(root).mkdir(parents=True, exist_ok=True)
        results = dict(_spawn(1, args, one, root))
        ref = results.get("single", {})
        rows: list[Row] = []
        for s in one:
            rows += _rows(s, 1, results[s], ref, args, root)
        if many and args.gpus > count:
            rows += [Row(s, args.gpus, verdict="not run", note=f"needs {args.gpus} GPUs, this node has {count}")
                     for s in many]
            many = []
        narrow = [s for s in many if get_strategy(s).min_gpus > args.gpus]  # e.g. --gpus 1 on a 1-GPU node
        rows += [Row(s, args.gpus, verdict="not run",
                     note=f"needs {get_strategy(s).min_gpus} GPUs; --gpus is {args.gpus}") for s in narrow]
        many = [s for s in many if s not in narrow]
        if many:
            multi = _spawn(args.gpus, args, many, root)
            for s in many:
                rows += _rows(s, args.gpus, multi[s], ref, args, root)
        if not args.skip_demo:
            rows.append(_demo(args, count, root))
    took = time.monotonic() - t0
    print(render(rows))
    failed = [r for r in rows if r.failed]
    print(f"gpu_check took {took:.0f} s; {len(failed)} check(s) failed", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "took_s": round(took, 1),
                                               "rows": [asdict(r) for r in rows]}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
