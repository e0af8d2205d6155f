"""The one place that picks a worker's torch device and torch.distributed backend.

Every training process (Ray Train workers, profiler trial actors, Tune trial
processes, the GPU check) asks :func:`rank_device` with its *local* index,
the position of its GPU among the GPUs this process sees:

* CUDA available and ``cuda:<index>`` exists: that device and ``nccl``;
* CUDA not available (a CPU machine, logical Ray GPUs): ``cpu`` and ``gloo``;
* CUDA available but no device ``<index>``: a :class:`DeviceError` saying how
  many devices the process sees (never a silent fall-back to the CPU, and
  never two ranks on one GPU).

:func:`local_device_index` says which index a process has: inside a Ray
Train worker the one Ray Train maps its assigned GPU to (the order of
``CUDA_VISIBLE_DEVICES`` need not follow local ranks), else ``LOCAL_RANK``
(set by torchrun and by our own spawners), else 0 (one GPU per process, as in
a profiler trial actor whose ``CUDA_VISIBLE_DEVICES`` is its one GPU).
:func:`use_rank_device` combines both and makes the device current.

Example:
    >>> from unittest import mock
    >>> import torch
    >>> with mock.patch("torch.cuda.is_available", return_value=False):
    ...     rank_device(1)
    RankDevice(device=device(type='cpu'), backend='gloo')
    >>> with mock.patch("torch.cuda.is_available", return_value=True), \\
    ...      mock.patch("torch.cuda.device_count", return_value=2):
    ...     rank_device(1)
    RankDevice(device=device(type='cuda', index=1), backend='nccl')
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from ray_saturn.errors import SaturnError

__all__ = [
    "DeviceError",
    "RankDevice",
    "backend_task",
    "cuda_available",
    "distributed_backend",
    "local_device_index",
    "rank_device",
    "synchronize",
    "use_rank_device",
]

log = logging.getLogger(__name__)

#: The backend for each device type.
BACKENDS = {"cuda": "nccl", "cpu": "gloo"}


class DeviceError(SaturnError, RuntimeError):
    """A process cannot be given the device its rank asks for."""


@dataclass(frozen=True)
class RankDevice:
    """A training process's torch device and the torch.distributed backend that goes with it."""

    device: torch.device
    backend: str  # "nccl" | "gloo"

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def cuda_available() -> bool:
    """``torch.cuda.is_available()``: the only test of CUDA (never the Ray GPU assignment)."""
    return bool(torch.cuda.is_available())


def distributed_backend() -> str:
    """``nccl`` when this process has CUDA, else ``gloo``."""
    return BACKENDS["cuda" if cuda_available() else "cpu"]


def backend_task() -> Any:
    """A Ray remote function on one GPU (no CPU) that returns its worker's :func:`distributed_backend`
    (``.options(num_gpus=...)`` for a share of one): how a driver learns the cluster's backend."""
    import ray

    @ray.remote(num_gpus=1, num_cpus=0)
    def _backend() -> str:
        from ray_saturn.strategies.device import distributed_backend

        return distributed_backend()

    return _backend


def rank_device(local_index: int) -> RankDevice:
    """The device and backend of the process whose GPU is ``local_index`` among those it sees.

    Raises :class:`DeviceError` when CUDA is available but there is no device
    ``local_index`` (a negative index, or more ranks on a node than visible GPUs).

    Example:
        >>> from unittest import mock
        >>> with mock.patch("torch.cuda.is_available", return_value=False):
        ...     rank_device(0).backend
        'gloo'
    """
    if isinstance(local_index, bool) or int(local_index) < 0:
        raise DeviceError(f"local device index is {local_index!r}; it must be a whole number >= 0")
    local_index = int(local_index)
    if not cuda_available():
        return RankDevice(torch.device("cpu"), BACKENDS["cpu"])
    count = torch.cuda.device_count()
    if local_index >= count:
        raise DeviceError(
            f"local rank {local_index} asks for cuda:{local_index}, but this process sees "
            f"{count} CUDA device(s) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
            "start at most one worker per visible GPU on each node"
        )
    return RankDevice(torch.device("cuda", local_index), BACKENDS["cuda"])


def _ray_train_cuda_index() -> int | None:
    """The CUDA index Ray Train gives this worker, or None outside a Ray Train worker."""
    try:
        import ray.train
        from ray.train.torch import get_device

        ray.train.get_context().get_local_rank()  # raises outside a Ray Train worker
        dev = get_device()
    except Exception:
        return None
    if isinstance(dev, list):  # several GPUs per worker: the first is this worker's
        dev = dev[0] if dev else None
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return 0 if dev.index is None else int(dev.index)
    return None


def local_device_index() -> int:
    """This process's local device index (see the module docstring for where it comes from)."""
    if cuda_available():
        index = _ray_train_cuda_index()
        if index is not None:
            return index
    raw = os.environ.get("LOCAL_RANK", "0")
    try:
        return int(raw)
    except ValueError:
        raise DeviceError(f"LOCAL_RANK is {raw!r}; it must be a whole number >= 0") from None


def use_rank_device(local_index: int | None = None) -> RankDevice:
    """:func:`rank_device` for this process (``local_index`` defaults to
    :func:`local_device_index`), made the current CUDA device when it is one."""
    rd = rank_device(local_device_index() if local_index is None else local_index)
    if rd.is_cuda:
        torch.cuda.set_device(rd.device)
    return rd


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU); used around timed steps."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
