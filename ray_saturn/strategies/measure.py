"""Measuring a strategy's knob settings on the workers of one trial.

For each knob setting: build the model afresh, run ``warmup`` steps (not
timed: allocation, autotuning, first communication), then time ``steps``
steps; the step time is the median over steps of the slowest worker's time.
Peak memory per GPU is ``torch.cuda.max_memory_allocated`` on CUDA. On a CPU
worker it is the peak of the tensor bytes the worker holds
(:class:`~ray_saturn.strategies.memory.TensorMemory`: parameters, gradients,
optimizer state, activations and temporaries, as a GPU allocator would count
them) over building the model and the untimed warm-up steps (at least one);
unlike the process's resident set size it falls when a strategy shards
(fsdp, zero) and is not blurred by the allocator's slack. A setting
that raises (out of memory included) is infeasible with the error as reason;
so is one whose peak exceeds ``memory_limit_gb``.

Example:
    >>> from ray_saturn.strategies import get_strategy, WorkerContext
    >>> from ray_saturn.toy import mlp_task
    >>> import torch
    >>> ctx = WorkerContext(0, 1, torch.device("cpu"))
    >>> r = get_strategy("single").search(mlp_task(), ctx, steps=2)
    >>> r.feasible and r.step_time_s > 0
    True
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ray_saturn.strategies.base import Infeasible, SearchResult, Trial, WorkerContext
from ray_saturn.strategies.batching import DataStream
from ray_saturn.strategies.device import synchronize
from ray_saturn.strategies.introspect import build_model
from ray_saturn.strategies.memory import TensorMemory

if TYPE_CHECKING:
    from ray_saturn.spec import Task
    from ray_saturn.strategies.base import Strategy

__all__ = ["MEMORY_MEASURE", "measure_knobs", "search_knobs"]

log = logging.getLogger(__name__)

MEMORY_MEASURE = {
    "cuda": "torch.cuda.max_memory_allocated per GPU",
    "cpu": "peak tensor bytes per worker (TensorMemory) over model build and warm-up steps",
}


def _reduce_max(value: float, ctx: WorkerContext) -> float:
    if not ctx.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)  # NCCL needs it on the GPU
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def measure_knobs(
    strategy: Strategy,
    task: Task,
    knobs: Mapping[str, Any],
    ctx: WorkerContext,
    *,
    warmup: int = 2,
    steps: int = 5,
    min_time_s: float = 0.0,
    max_steps: int = 200,
) -> tuple[float, float]:
    """(median step time in seconds, peak memory in GB) of one knob setting on this worker group.

    Times ``steps`` steps, then more until their time reaches ``min_time_s`` (at most ``max_steps``
    in all; every worker times the same number, from the slowest worker's first ``steps``): a
    handful of steps right after the warm-up runs faster than a segment's steady state.
    """
    gc.collect()
    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)
    # CPU: tensor bytes counted over the model build and the (untimed) warm-up steps, which
    # allocate everything a step keeps (optimizer state included); at least one step is counted.
    counted = None if cuda else TensorMemory()
    times: list[float] = []
    runner = None
    try:
        with counted if counted is not None else contextlib.nullcontext():
            runner = strategy.prepare(build_model(task), task, knobs, ctx)
            stream = DataStream(task.data, task.hparams)
            for _ in range(max(warmup, 0 if cuda else 1)):
                runner.step(next(stream))
        target = steps
        while len(times) < target:
            batch = next(stream)
            synchronize(ctx.device)
            t0 = time.perf_counter()
            runner.step(batch)
            synchronize(ctx.device)
            times.append(time.perf_counter() - t0)
            if len(times) == steps and min_time_s > 0 and steps < max_steps:
                spent = _reduce_max(sum(times), ctx)  # the same on every worker: they time as many steps
                if spent < min_time_s:
                    more = math.ceil((min_time_s - spent) / max(spent / steps, 1e-9))
                    target = min(max_steps, steps + more)
    finally:
        if runner is not None:
            runner.close()
        del runner
        gc.collect()
    times = [_reduce_max(t, ctx) for t in times]
    if cuda:
        peak = torch.cuda.max_memory_allocated(ctx.device) / 1e9
    else:
        assert counted is not None
        peak = counted.peak_bytes(ctx.device) / 1e9
    return statistics.median(times), _reduce_max(peak, ctx)


def _agree(reason: str | None, ctx: WorkerContext) -> str | None:
    """The first worker's failure reason, the same on every worker (None if all succeeded)."""
    if not ctx.distributed:
        return reason
    reasons: list[str | None] = [None] * ctx.world_size
    dist.all_gather_object(reasons, reason)
    for rank, r in enumerate(reasons):
        if r is not None:
            return f"rank {rank}: {r}" if ctx.world_size > 1 else r
    return None


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    kind = "out of memory" if isinstance(exc, torch.OutOfMemoryError) else type(exc).__name__
    return f"{kind}: {text}" if text else kind


def search_knobs(
    strategy: Strategy,
    task: Task,
    ctx: WorkerContext,
    *,
    warmup: int = 2,
    steps: int = 5,
    min_time_s: float = 0.0,
    memory_limit_gb: float | None = None,
    knob_space: Sequence[Mapping[str, Any]] | None = None,
) -> SearchResult | Infeasible:
    """Measure every knob setting and return the fastest feasible one (or why none is).

    Collective: every worker of the trial calls it with the same arguments.
    """
    gpus = ctx.world_size
    reason = strategy.applies(task, gpus)
    if reason:
        return Infeasible(strategy.name, gpus, reason)
    space = [
        strategy.check_knobs(k)
        for k in (knob_space if knob_space is not None else strategy.knob_space(task, gpus))
    ]
    trials: list[Trial] = []
    for knobs in space:
        why = strategy.hardware_reason(knobs, ctx.device)
        if why:  # kept in the result's trials (never silently dropped) and logged
            log.info("%s %s on %d GPU(s) with %s is infeasible here: %s", task.name, strategy.name, gpus, knobs, why)
            trials.append(Trial(knobs, None, None, why))
            continue
        err: str | None = None
        result = (0.0, 0.0)
        try:
            result = measure_knobs(strategy, task, knobs, ctx, warmup=warmup, steps=steps, min_time_s=min_time_s)
        except Exception as exc:
            err = _describe(exc)
            log.info(
                "%s %s on %d GPU(s) with %s failed: %s", task.name, strategy.name, gpus, knobs, err
            )
        err = _agree(err, ctx)
        if err:
            trials.append(Trial(knobs, None, None, err))
            continue
        step_time, peak = result
        if memory_limit_gb is not None and peak > memory_limit_gb:
            trials.append(
                Trial(
                    knobs,
                    step_time,
                    peak,
                    f"peak memory {peak:.2f} GB exceeds the {memory_limit_gb:g} GB per GPU",
                )
            )
            continue
        trials.append(Trial(knobs, step_time, peak))
    ok = [t for t in trials if t.feasible]
    if not ok:
        reasons = "; ".join(sorted({t.reason or "" for t in trials}))
        return Infeasible(strategy.name, gpus, f"no knob setting ran: {reasons}", tuple(trials))
    best = min(ok, key=lambda t: t.step_time_s or 0.0)
    assert best.step_time_s is not None
    return SearchResult(
        strategy.name,
        gpus,
        dict(best.knobs),
        best.step_time_s,
        best.peak_mem_gb,
        tuple(trials),
        MEMORY_MEASURE["cuda" if ctx.device.type == "cuda" else "cpu"],
    )
