"""Looking at a task without training it: its model's structure and its batches.

Example:
    >>> import torch
    >>> from ray_saturn import Task
    >>> t = Task("t", model=lambda hp: torch.nn.Linear(3, 1),
    ...          data=lambda hp: [(torch.ones(5, 3),)], loss=lambda o, b: o.sum(),
    ...          optimizer=lambda p, hp: torch.optim.SGD(p, lr=0.1), max_steps=1)
    >>> type(meta_model(t)).__name__, first_batch_rows(t)
    ('Linear', 5)
"""

from __future__ import annotations

import torch

from ray_saturn.spec import Task
from ray_saturn.strategies.batching import batch_rows

__all__ = ["build_model", "check_trainable", "first_batch", "first_batch_rows", "meta_model"]


def build_model(task: Task) -> torch.nn.Module:
    """The task's model, built after seeding torch with ``hparams["seed"]`` (default 0).

    Every worker builds the same initial weights this way.
    """
    torch.manual_seed(int(task.hparams.get("seed", 0)))
    model = task.model(task.hparams)
    if not isinstance(model, torch.nn.Module):
        from ray_saturn.errors import SpecError

        raise SpecError(
            f"task {task.name!r}: model factory returned {type(model).__name__}, "
            "not a torch.nn.Module"
        )
    return model


def meta_model(task: Task) -> torch.nn.Module:
    """The model built on the meta device (no memory); built for real if that fails."""
    try:
        with torch.device("meta"):
            return build_model(task)
    except Exception:
        return build_model(task)


def check_trainable(task: Task) -> None:
    """Raise a one-line :class:`SpecError` if ``task``'s model has nothing to train: its factory returns no
    ``nn.Module``, or a module without parameters or with every parameter frozen (every worker's optimizer
    or backward pass would fail, each attempt after a trainer's start). The model is built on the meta
    device only; a factory that cannot build there is left for the workers to judge.

    Example:
        >>> t = Task("t", model=lambda hp: torch.nn.ReLU(), data=lambda hp: [(torch.ones(5, 3),)],
        ...          loss=lambda o, b: o.sum(), optimizer=lambda p, hp: torch.optim.SGD(p, lr=0.1), max_steps=1)
        >>> try:
        ...     check_trainable(t)
        ... except ValueError as exc:
        ...     print(str(exc)[:60])
        task 't': its model (ReLU) has no parameters, so there is no
    """
    from ray_saturn.errors import SpecError

    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):  # the caller's torch seed is left as it was
            model = build_model(task)
    except SpecError:
        raise
    except Exception:
        return
    params = list(model.parameters())
    kind = type(model).__name__
    if not params:
        raise SpecError(f"task {task.name!r}: its model ({kind}) has no parameters, so there is nothing to train; "
                        "give it trainable layers (or drop the task)")
    if not any(p.requires_grad for p in params):
        raise SpecError(f"task {task.name!r}: every parameter of its model ({kind}, {len(params)} tensors) is frozen "
                        "(requires_grad=False), so there is nothing to train; leave some layers trainable")


def first_batch(task: Task):
    for batch in task.data(task.hparams):
        return batch
    from ray_saturn.errors import SpecError

    raise SpecError(f"task {task.name!r}: the data factory returned no batches")


def first_batch_rows(task: Task) -> int:
    return batch_rows(first_batch(task))


def sequential_reason(strategy: str, task: Task, model: torch.nn.Module | None = None) -> str | None:
    """Why ``strategy`` (which splits a model by layers) cannot run ``task``, or None.

    ``model`` is the task's meta model when the caller already built it.
    """
    model = meta_model(task) if model is None else model
    if not isinstance(model, torch.nn.Sequential):
        return f"{strategy} needs an nn.Sequential model; task {task.name!r} builds a {type(model).__name__}"
    return None
