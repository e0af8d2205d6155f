"""Parallelism strategies: plug-ins registered by name, and the worker-side entry point.

Built-ins: ``single``, ``ddp``, ``ddp-compressed``, ``fsdp``, ``pipeline``,
``spill``, ``zero`` (one module each). Third parties register a
:class:`~ray_saturn.strategies.base.Strategy` subclass through the entry-point
group ``ray_saturn.strategies``.

What the runtime calls inside a Ray Train worker (the torch.distributed
process group already initialised by Ray Train, or a plain single process).
These signatures are stable::

    train_worker(task: Task, strategy: str, knobs: Mapping[str, Any], *,
                 target_step: int, checkpoint_dir: str, checkpoint_every: int,
                 report: Callable[[dict], None]) -> TrainOutcome

        Resumes from the newest complete checkpoint in ``checkpoint_dir`` if
        there is one (whatever strategy or worker count wrote it), trains
        until ``target_step`` optimizer steps have been done in total,
        checkpoints every ``checkpoint_every`` steps and at the end (a
        collective; every worker calls it), and on rank 0 calls
        ``report({"step": int, "loss": float, "step_time_s": float})`` after
        each step. ``step`` counts steps done in total. Returns a
        :class:`TrainOutcome` (``final_step``, ``start_step``, ``last_loss``,
        ``data_position``, ``checkpoint``, ``mean_step_time_s``, ``strategy``,
        ``world_size``). ``knobs`` are the strategy's knob settings (the
        profile table's ``knobs`` column, see
        :func:`ray_saturn.profiler.knobs_for`); ``{}`` means the defaults.

    latest_step(checkpoint_dir: str) -> int | None

        The step of the newest complete checkpoint, or ``None``.

Every worker builds the model after ``torch.manual_seed(hparams.get("seed", 0))``,
reads the same global batches (see :mod:`ray_saturn.strategies.batching`)
and picks its device and backend with :func:`rank_device` (``cuda:<local
index>`` and NCCL when CUDA is available, else the CPU and gloo; see
:mod:`ray_saturn.strategies.device`).

Example:
    >>> from ray_saturn.strategies import strategy_names
    >>> strategy_names()
    ['ddp', 'ddp-compressed', 'fsdp', 'pipeline', 'single', 'spill', 'zero']
"""

# Names resolve on first use (PEP 562), so ``import ray_saturn`` does not import torch.
_EXPORTS = {
    "latest_step": "ray_saturn.strategies.checkpoint",
    "Infeasible": "ray_saturn.strategies.base",
    "KnobError": "ray_saturn.strategies.base",
    "Runner": "ray_saturn.strategies.base",
    "SearchResult": "ray_saturn.strategies.base",
    "Strategy": "ray_saturn.strategies.base",
    "StrategyError": "ray_saturn.strategies.base",
    "Trial": "ray_saturn.strategies.base",
    "WorkerContext": "ray_saturn.strategies.base",
    "DeviceError": "ray_saturn.strategies.device",
    "RankDevice": "ray_saturn.strategies.device",
    "rank_device": "ray_saturn.strategies.device",
    "use_rank_device": "ray_saturn.strategies.device",
    "ENTRY_POINT_GROUP": "ray_saturn.strategies.registry",
    "get_strategy": "ray_saturn.strategies.registry",
    "register": "ray_saturn.strategies.registry",
    "strategy_names": "ray_saturn.strategies.registry",
    "TrainOutcome": "ray_saturn.strategies.worker",
    "train_worker": "ray_saturn.strategies.worker",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ray_saturn.strategies' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
