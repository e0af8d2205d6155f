"""Share rows: a job measured on 1/k of one device, with k copies of it running there at once.

With ``Profiler(shares=(2, 4))`` the profiler also measures, for every task
signature and each k asked for (k in 2, 4, 8), the task's ``single``
configuration (a share is a one-process job) on ``gpus`` = 1/k:

- **Fit first.** The budget of one device is the smaller of
  ``memory_limit_gb`` (when given) and the device's memory
  (:func:`device_memory_gb`: a CUDA device's total memory; on the CPU, a
  logical GPU's part of its node's memory, the node's RAM over its logical
  GPUs). k copies of the whole-GPU row's peak memory must fit in it; a k that
  does not is reported infeasible and not run (nothing is started that would
  run the device out of memory).
- **k copies at once.** One placement group of one ``{"GPU": 1}`` bundle, and
  in it k actors of ``num_gpus=1/k``: Ray gives them all the same device (on
  the CPU, the same logical GPU). Each copy builds the model with the knobs of
  the whole-GPU ``single`` row, runs the warm-up steps and reports ready
  (the processes' start-up has its own budget, ``STARTUP_TIMEOUT_S``; the
  hang timeout counts from there);
  once every copy is ready they all start timing at the same wall-clock
  moment and step for the same window (long enough for about ``steps`` steps
  each at k times the whole-GPU step time, at least ``min_measure_s``). A
  copy's step time is the wall time of its steps over their number (batch
  draws included, as in a run; not the median of single steps: a device or
  a core shared by time slices serves a copy's step whole and then makes it
  wait, so only the throughput shows the sharing); the
  share's is the **slowest copy's** (the max): the copies are the same job,
  so they differ only by how the device happened to serve them, and a plan
  that puts k jobs on one device waits for the slowest. The mean is logged
  and kept in the store beside it.
- **Memory per copy.** Each copy's peak memory is measured as a trial's
  (``torch.cuda.max_memory_allocated`` per process on CUDA, the tensor bytes
  it holds on the CPU: :mod:`ray_saturn.strategies.measure`); the share's is
  the largest copy's, and the row is written only if k of it fit the budget.

A share that cannot be measured (no feasible whole-GPU ``single`` row, a copy
that failed, died, hung, or did not fit) is reported with its reason
(:attr:`ProfileResult.infeasible <ray_saturn.profiler.ProfileResult>`), never
written as a row. Results are kept in the profile store per (signature, k).

Example:
    >>> check_shares([4, 2, 4])
    (2, 4)
    >>> fit_reason(2, 0.6, 1.0)
    '2 copies x 0.6 GB peak memory > 1 GB per device'
    >>> fit_reason(2, 0.4, 1.0) is None
    True
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray_saturn.errors import SpecError
from ray_saturn.profile_table import SHARES
from ray_saturn.spec import Task

__all__ = [
    "SHARE_STRATEGY",
    "CopyResult",
    "ShareOutcome",
    "ShareSpec",
    "check_shares",
    "device_memory_gb",
    "fit_reason",
    "query_device_memory_gb",
    "run_shares",
    "whole_gpu_budget",
    "window_s",
]

log = logging.getLogger(__name__)

#: The strategy a share is measured with: a share is one process on part of one device.
SHARE_STRATEGY = "single"
#: Seconds between every copy reporting ready and the common start of their timed window.
START_MARGIN_S = 0.5
#: The timed window is this many times k x steps x the whole-GPU step time (room for slowdowns).
WINDOW_SLACK = 1.5
#: Seconds a copy's process may take to start (a Ray worker and torch's import) before it is
#: given up on; not counted against the hang timeout, which is for the job's own steps.
STARTUP_TIMEOUT_S = 300.0


def check_shares(shares: Iterable[int] | None) -> tuple[int, ...]:
    """The k's of the shares 1/k to profile, sorted, each once; SpecError naming a bad one.

    Example:
        >>> check_shares(None), check_shares("2,8")
        ((), (2, 8))
    """
    if shares is None:
        return ()
    if isinstance(shares, str):
        shares = [s for s in shares.split(",") if s.strip()]
    out = set()
    for k in shares:
        try:
            whole_k = int(str(k).strip()) if not isinstance(k, bool) else None
        except ValueError:
            whole_k = None
        if whole_k not in SHARES:
            raise SpecError(
                f"share {k!r} is not one of {', '.join(map(str, SHARES))}; give k of the share 1/k "
                "of one device (e.g. shares=(2, 4) or --shares 2,4)"
            )
        out.add(whole_k)
    return tuple(sorted(out))


def fit_reason(copies: int, peak_gb: float | None, budget_gb: float | None) -> str | None:
    """Why ``copies`` copies of ``peak_gb`` do not fit a device of ``budget_gb`` (None: they fit,
    or there is nothing to check)."""
    if peak_gb is None or budget_gb is None or copies * peak_gb <= budget_gb * (1 + 1e-9):
        return None
    return f"{copies} copies x {peak_gb:.3g} GB peak memory > {budget_gb:.3g} GB per device"


def window_s(copies: int, whole_step_s: float, steps: int, min_time_s: float, timeout_s: float) -> float:
    """The copies' common timed window: about ``steps`` steps at ``copies`` x the whole-GPU step time
    (with :data:`WINDOW_SLACK`), at least ``min_time_s``, at most a quarter of the trial timeout.

    Example:
        >>> window_s(2, 0.1, 5, 0.5, 600.0)
        1.5
    """
    want = max(min_time_s, WINDOW_SLACK * copies * steps * max(whole_step_s, 0.0))
    return min(want, timeout_s / 4)


def device_memory_gb() -> float | None:
    """The memory of the device this process was given: a CUDA device's total memory; on the CPU its
    node's RAM over the node's logical GPUs (None when neither is known)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 1e9
    try:
        import psutil
        import ray

        node = ray.get_runtime_context().get_node_id()
        gpus = next((n["Resources"].get("GPU", 0) for n in ray.nodes() if n["NodeID"] == node), 0)
        return psutil.virtual_memory().total / 1e9 / max(1.0, float(gpus))
    except Exception:  # no Ray context or no psutil: nothing known
        return None


@dataclass(frozen=True)
class ShareSpec:
    """One share to measure: the task, k copies, the whole-GPU row's knobs and step time."""

    task: Task
    signature: str
    copies: int
    knobs: dict[str, Any]
    whole_step_s: float


@dataclass(frozen=True)
class CopyResult:
    """What one copy measured: its step time over the window, steps timed, peak GB, its GPU ids."""

    step_time_s: float
    steps: int
    peak_mem_gb: float
    gpu_ids: tuple[Any, ...]


@dataclass
class ShareOutcome:
    """A measured share: the slowest copy's step time (and the mean), the largest peak, or why not."""

    spec: ShareSpec
    step_time_s: float | None = None
    mean_step_s: float | None = None
    peak_mem_gb: float | None = None
    #: The device's memory as the copies saw it (the smallest they reported).
    device_mem_gb: float | None = None
    reason: str | None = None
    cost_gpu_s: float = 0.0
    copies: list[CopyResult] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return self.reason is None and self.step_time_s is not None


class _CopyWorker:
    """A Ray actor: one copy of the job on its share of a device."""

    def __init__(self) -> None:
        self._runner = None
        self._stream = None
        self._peak_gb = 0.0
        self._device = None

    def ready(self) -> bool:
        """The process is up with torch and the strategies imported (start-up, not the job's time)."""
        import torch  # noqa: F401

        import ray_saturn.strategies  # noqa: F401

        return True

    def warm(self, task: Task, knobs: Mapping[str, Any], warmup: int) -> float | None:
        """Build the model, run the untimed warm-up steps; returns the device's memory (GB)."""
        import torch

        from ray_saturn.strategies import WorkerContext, get_strategy
        from ray_saturn.strategies.batching import DataStream
        from ray_saturn.strategies.device import use_rank_device
        from ray_saturn.strategies.introspect import build_model
        from ray_saturn.strategies.memory import TensorMemory

        os.environ.setdefault("LOCAL_RANK", "0")
        self._device = use_rank_device(0).device
        ctx = WorkerContext(0, 1, self._device)
        cuda = self._device.type == "cuda"
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self._device)
        counted = None if cuda else TensorMemory()
        with counted if counted is not None else contextlib.nullcontext():
            self._runner = get_strategy(SHARE_STRATEGY).prepare(build_model(task), task, knobs, ctx)
            self._stream = DataStream(task.data, task.hparams)
            for _ in range(max(warmup, 0 if cuda else 1)):
                self._runner.step(next(self._stream))
        if counted is not None:
            self._peak_gb = counted.peak_bytes(self._device) / 1e9
        return device_memory_gb()

    def timed(self, start_at: float, window: float) -> CopyResult:
        """Step from wall-clock ``start_at`` until ``window`` s have passed: the wall time of the steps
        (batch draws included) over their number."""
        import ray
        import torch

        from ray_saturn.strategies.device import synchronize

        assert self._runner is not None and self._stream is not None
        time.sleep(max(0.0, start_at - time.time()))
        end = start_at + window
        steps = 0
        try:
            synchronize(self._device)
            t0 = time.perf_counter()
            while not steps or time.time() < end:
                self._runner.step(next(self._stream))
                synchronize(self._device)
                steps += 1
            elapsed = time.perf_counter() - t0
            if self._device.type == "cuda":
                self._peak_gb = torch.cuda.max_memory_allocated(self._device) / 1e9
        finally:
            self._runner.close()
            self._runner = self._stream = None
            gc.collect()
        return CopyResult(elapsed / steps, steps, self._peak_gb, tuple(ray.get_gpu_ids()))


def _first_line(exc: BaseException) -> str:
    from ray_saturn.strategies.measure import _describe

    cause = getattr(exc, "cause", None)  # a RayTaskError carries the copy's own exception
    return _describe(cause if isinstance(cause, BaseException) else exc)


class _ShareTrial:
    """k copies on one device: placement group, actors, the two phases (warm, timed)."""

    def __init__(self, spec: ShareSpec) -> None:
        from ray.util.placement_group import placement_group

        self.spec = spec
        self.pg = placement_group([{"GPU": 1}], strategy="STRICT_PACK")
        self.actors: list[Any] = []
        self.ready_s: float | None = None

    def create(self, timeout_s: float) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not self.pg.wait(timeout_s):
            raise TimeoutError(f"no placement for one GPU within {timeout_s:g} s")
        self.ready_s = time.monotonic()
        k = self.spec.copies
        cls = ray.remote(num_cpus=0, num_gpus=1 / k, max_restarts=0)(_CopyWorker)
        strat = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=0)
        self.actors = [cls.options(scheduling_strategy=strat).remote() for _ in range(k)]

    def release(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for a in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        self.actors = []
        with contextlib.suppress(Exception):
            remove_placement_group(self.pg)

    def gpu_seconds(self) -> float:
        """One device held from its bundle being ready to now (k copies of 1/k each)."""
        return 0.0 if self.ready_s is None else time.monotonic() - self.ready_s


def run_shares(
    specs: list[ShareSpec],
    measure_kw: Mapping[str, Any],
    *,
    timeout_s: float,
    placement_timeout_s: float,
    concurrent: int = 1,
) -> list[ShareOutcome]:
    """Measure ``specs`` (see the module docstring), up to ``concurrent`` shares (devices) at once.

    Every copy of a batch warms up first; then all of them time the same window together.
    """
    out: list[ShareOutcome] = []
    for i in range(0, len(specs), max(1, concurrent)):
        out.extend(_run_batch(specs[i : i + max(1, concurrent)], measure_kw, timeout_s, placement_timeout_s))
    return out


def _run_batch(
    specs: list[ShareSpec], measure_kw: Mapping[str, Any], timeout_s: float, placement_timeout_s: float
) -> list[ShareOutcome]:
    import ray

    trials = [_ShareTrial(s) for s in specs]
    outcomes = [ShareOutcome(s) for s in specs]
    try:
        started: list[int] = []
        for i, (trial, o) in enumerate(zip(trials, outcomes, strict=True)):
            try:
                trial.create(placement_timeout_s)
                started.append(i)
            except Exception as exc:
                o.reason = str(exc) if isinstance(exc, TimeoutError) else f"copies failed to start: {_first_line(exc)}"
        # Process start-up (a worker, torch's import) has its own budget: on a loaded node it can take
        # longer than a hang timeout meant for the job's own steps.
        startup_s = STARTUP_TIMEOUT_S
        ready_refs = {i: [a.ready.remote() for a in trials[i].actors] for i in started}
        warm_refs: dict[int, list[Any]] = {}
        for i, refs in ready_refs.items():
            trial = trials[i]
            try:
                ray.get(refs, timeout=startup_s)
            except ray.exceptions.GetTimeoutError:
                outcomes[i].reason = f"the copies' processes did not start within {startup_s:g} s"
                continue
            except Exception as exc:
                outcomes[i].reason = f"copies failed to start: {_first_line(exc)}"
                continue
            warm_refs[i] = [
                a.warm.remote(trial.spec.task, trial.spec.knobs, int(measure_kw.get("warmup", 2)))
                for a in trial.actors
            ]
        device_mem: dict[int, list[float | None]] = {}
        for i, refs in warm_refs.items():
            try:
                device_mem[i] = ray.get(refs, timeout=timeout_s)
            except ray.exceptions.GetTimeoutError:
                outcomes[i].reason = f"hung: the copies were not warm within {timeout_s:g} s; killed"
            except Exception as exc:
                outcomes[i].reason = f"a copy failed: {_first_line(exc)}"
        start_at = time.time() + START_MARGIN_S
        timed_refs: dict[int, tuple[float, list[Any]]] = {}
        for i in device_mem:
            s = specs[i]
            w = window_s(s.copies, s.whole_step_s, int(measure_kw.get("steps", 5)),
                         float(measure_kw.get("min_time_s", 0.0)), timeout_s)
            timed_refs[i] = (w, [a.timed.remote(start_at, w) for a in trials[i].actors])
        for i, (w, refs) in timed_refs.items():
            o = outcomes[i]
            try:
                results: list[CopyResult] = ray.get(refs, timeout=START_MARGIN_S + w + timeout_s)
            except ray.exceptions.GetTimeoutError:
                o.reason = f"hung: no result within {timeout_s:g} s after the timed window; killed"
                continue
            except Exception as exc:
                o.reason = f"a copy failed: {_first_line(exc)}"
                continue
            o.copies = list(results)
            o.step_time_s = max(r.step_time_s for r in results)
            o.mean_step_s = statistics.fmean(r.step_time_s for r in results)
            o.peak_mem_gb = max(r.peak_mem_gb for r in results)
            mems = [m for m in device_mem[i] if m is not None]
            o.device_mem_gb = min(mems) if mems else None
            devices = {r.gpu_ids for r in results}
            if len(devices) != 1:
                o.reason = f"the {o.spec.copies} copies were given different devices {sorted(devices)}"
            log.info(
                "%s on 1/%d of a device: step %.4g s (slowest copy; mean %.4g s, copies %s), peak %.3g GB per copy",
                o.spec.task.name, o.spec.copies, o.step_time_s, o.mean_step_s,
                ", ".join(f"{r.step_time_s:.4g} s x {r.steps}" for r in results), o.peak_mem_gb,
            )
    finally:
        for trial, o in zip(trials, outcomes, strict=True):
            o.cost_gpu_s = trial.gpu_seconds()
            trial.release()
    return outcomes


def query_device_memory_gb(timeout_s: float) -> float | None:
    """The memory of one of the cluster's devices (:func:`device_memory_gb`), asked of a one-GPU
    Ray task (None when it cannot be told within ``timeout_s``)."""
    import ray

    probe = ray.remote(num_cpus=0, num_gpus=1, max_retries=0)(device_memory_gb)
    try:
        return ray.get(probe.remote(), timeout=timeout_s)
    except Exception as exc:
        log.warning("the device's memory is unknown (%s); shares are checked against memory_limit_gb only",
                    _first_line(exc))
        return None


def whole_gpu_budget(memory_limit_gb: float | None, device_mem_gb: float | None) -> float | None:
    """The memory budget of one device: the smaller of ``memory_limit_gb`` and the device's memory.

    Example:
        >>> whole_gpu_budget(None, 80.0), whole_gpu_budget(10.0, 80.0), whole_gpu_budget(None, None)
        (80.0, 10.0, None)
    """
    known = [m for m in (memory_limit_gb, device_mem_gb) if m is not None and math.isfinite(m)]
    return min(known) if known else None
