"""The performance signature of a task: what decides its step time and memory.

Two tasks with the same signature run at the same speed, so the profiler
measures one of them: model structure (module tree, parameter and buffer
names, shapes and dtypes), optimizer class, batch rows and the shapes and
dtypes of a batch (sequence length included), the hardware and torch
version, and the measurement settings. Learning rate, seed and other
hyper-parameters that do not change shapes are not part of it.

Example:
    >>> from ray_saturn.toy import mlp_task
    >>> a = performance_signature(mlp_task("a", lr=0.1, seed=1), hardware="cpu")
    >>> a == performance_signature(mlp_task("b", lr=0.001, seed=2), hardware="cpu")
    True
    >>> a == performance_signature(mlp_task("c", width=64), hardware="cpu")
    False
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch

from ray_saturn.spec import Task
from ray_saturn.strategies.introspect import first_batch, meta_model

__all__ = ["describe_task", "performance_signature"]


def _batch_shapes(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return [list(batch.shape), str(batch.dtype)]
    if isinstance(batch, Mapping):
        return {str(k): _batch_shapes(v) for k, v in sorted(batch.items(), key=lambda kv: str(kv[0]))}
    if isinstance(batch, (list, tuple)):
        return [_batch_shapes(v) for v in batch]
    return type(batch).__name__


def describe_task(task: Task) -> dict[str, Any]:
    """The fields the signature hashes, as plain JSON-able data."""
    model = meta_model(task)
    tensors = [(n, list(p.shape), str(p.dtype)) for n, p in model.named_parameters()]
    tensors += [(n, list(b.shape), str(b.dtype)) for n, b in model.named_buffers()]
    probe = torch.nn.Parameter(torch.zeros(1))
    try:
        optimizer = type(task.optimizer([probe], task.hparams)).__qualname__
    except Exception:
        optimizer = "unknown"
    return {
        "model": type(model).__qualname__,
        "repr": repr(model),
        "modules": [f"{n}:{type(m).__qualname__}" for n, m in model.named_modules()],
        "tensors": tensors,
        "optimizer": optimizer,
        "batch_size": task.batch_size,
        "batch": _batch_shapes(first_batch(task)),
    }


def performance_signature(task: Task, *, hardware: str, settings: Mapping[str, Any] | None = None) -> str:
    """A 16-hex-digit hash of :func:`describe_task`, the hardware and measurement settings."""
    blob = json.dumps(
        {
            "task": describe_task(task),
            "hardware": hardware,
            "torch": torch.__version__,
            "settings": dict(settings or {}),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
