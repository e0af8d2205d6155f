"""Measuring a strategy's knob settings on the workers of one trial.

For each knob setting: build the model afresh, run ``warmup`` steps (not
timed: allocation, autotuning, first communication), then time ``steps``
steps; the step time is the median over steps of the slowest worker's time.
Peak memory per GPU is ``torch.cuda.max_memory_allocated`` on CUDA. On a CPU
worker it is the peak resident set size of the worker process above its size
before the model was built, sampled every 5 ms (an approximation: it includes
the allocator's slack and everything else the process allocates). A setting
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

import gc
import logging
import os
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ray_saturn.strategies.base import Infeasible, SearchResult, Trial, WorkerContext
from ray_saturn.strategies.batching import DataStream
from ray_saturn.strategies.device import synchronize
from ray_saturn.strategies.introspect import build_model

if TYPE_CHECKING:
    from ray_saturn.spec import Task
    from ray_saturn.strategies.base import Strategy

__all__ = ["MEMORY_MEASURE", "measure_knobs", "search_knobs"]

log = logging.getLogger(__name__)

MEMORY_MEASURE = {
    "cuda": "torch.cuda.max_memory_allocated per GPU",
    "cpu": "peak process RSS above its pre-model size, sampled every 5 ms",
}


def _rss() -> int:
    """Resident set size of this process in bytes (Linux /proc; else the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _RssSampler:
    def __init__(self, period_s: float = 0.005) -> None:
        self._period = period_s
        self.base = _rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            self._stop.wait(self._period)

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def peak_gb(self) -> float:
        return max(0, self.peak - self.base) / 1e9


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
) -> tuple[float, float]:
    """(median step time in seconds, peak memory in GB) of one knob setting on this worker group."""
    gc.collect()
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)
    sampler = _RssSampler() if ctx.device.type != "cuda" else None
    times: list[float] = []
    runner = None
    try:
        if sampler:
            sampler.__enter__()
        runner = strategy.prepare(build_model(task), task, knobs, ctx)
        stream = DataStream(task.data, task.hparams)
        for i in range(warmup + steps):
            batch = next(stream)
            synchronize(ctx.device)
            t0 = time.perf_counter()
            runner.step(batch)
            synchronize(ctx.device)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    finally:
        if sampler:
            sampler.__exit__(None, None, None)
        if runner is not None:
            runner.close()
        del runner
        gc.collect()
    times = [_reduce_max(t, ctx) for t in times]
    if ctx.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(ctx.device) / 1e9
    else:
        assert sampler is not None
        peak = sampler.peak_gb
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
        if why:
            trials.append(Trial(knobs, None, None, why))
            continue
        err: str | None = None
        result = (0.0, 0.0)
        try:
            result = measure_knobs(strategy, task, knobs, ctx, warmup=warmup, steps=steps)
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
