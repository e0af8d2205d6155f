"""Tensor memory per device, counted like a GPU allocator would, also for CPU tensors.

On a CPU worker a process's resident-set size does not shrink when a
strategy shards parameters, gradients or optimizer state (the allocator
keeps freed pages, and everything else the process holds is in it too), so it
cannot show that fsdp or zero fits where ddp does not. :class:`TensorMemory`
counts instead the bytes of the tensor storages that torch operators create
(or touch) inside its context, per device, while they are alive, and keeps
the peak: the figure ``torch.cuda.max_memory_allocated`` gives on a GPU,
measured for CPU tensors. It is a :class:`~torch.utils._python_dispatch.TorchDispatchMode`
with no module hooks (so it works under pipelining, FSDP2, fairscale and
custom autograd functions): views share their storage and count once, a
storage freed is subtracted when it is finalised, and
``UntypedStorage.resize_`` (FSDP2 frees and re-allocates parameters that
way) is followed. Like ``torch.distributed._tools.mem_tracker.MemTracker``,
whose counting rules it follows, it sees only tensors made by operators on
its own thread in its context: tensors made before it (pass them to
:meth:`track`) or by a communication library's own threads are not counted.

Example:
    >>> import torch
    >>> with TensorMemory() as mem:
    ...     a = torch.ones(1000)           # 4000 bytes
    ...     b = a * 2                      # 4000 more
    ...     del a, b
    ...     c = torch.ones(10)
    >>> mem.peak_bytes(torch.device("cpu")), mem.live_bytes(torch.device("cpu"))
    (8000, 40)
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from functools import wraps
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["TensorMemory"]


def _storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    from torch.distributed._tools.common_utils import get_untyped_storages

    try:
        return list(get_untyped_storages(t))
    except Exception:  # an opaque subclass: nothing to count
        return []


class TensorMemory(TorchDispatchMode):
    """Live and peak tensor bytes per device inside its context (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._info: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> [device, bytes, ref]
        self._live: dict[torch.device, int] = defaultdict(int)
        self._peak: dict[torch.device, int] = defaultdict(int)
        self._orig_resize = None

    # ---------------------------------------------------------------- queries
    def live_bytes(self, device: torch.device | str) -> int:
        """Bytes of tracked storages on ``device`` alive now."""
        return self._live.get(torch.device(device), 0)

    def peak_bytes(self, device: torch.device | str) -> int:
        """The most bytes tracked storages on ``device`` held at once."""
        return self._peak.get(torch.device(device), 0)

    @property
    def devices(self) -> list[torch.device]:
        return sorted(self._peak, key=str)

    def reset_peak(self) -> None:
        """Start a new peak from what is alive now."""
        for dev in list(self._peak):
            self._peak[dev] = self._live.get(dev, 0)

    # --------------------------------------------------------------- counting
    def track(self, *tensors: Any) -> None:
        """Count tensors made outside the context (nested containers are walked)."""
        leaves, _ = tree_flatten(tensors)
        for t in leaves:
            if isinstance(t, torch.Tensor):
                self._track(t)

    def _bump(self, device: torch.device, delta: int) -> None:
        self._live[device] += delta
        if self._live[device] > self._peak[device]:
            self._peak[device] = self._live[device]

    def _track(self, t: torch.Tensor) -> None:
        device = t.device
        for st in _storages(t):
            info = self._info.get(st)
            if info is not None:
                size = st.nbytes()
                if size != info[1]:  # resized outside our patched resize_
                    self._bump(info[0], size - info[1])
                    info[1] = size
                continue
            size = st.nbytes()
            info = [device, size, None]
            info[2] = weakref.ref(st, self._finaliser(info))
            self._info[st] = info
            self._bump(device, size)

    def _finaliser(self, info: list):
        def gone(_ref: Any) -> None:
            self._live[info[0]] -= info[1]
            info[1] = 0

        return gone

    def _patch_resize(self) -> None:
        orig = torch.UntypedStorage.resize_
        self._orig_resize = orig
        counter = self

        @wraps(orig)
        def resize_(st: torch.UntypedStorage, size: int):
            out = orig(st, size)
            info = counter._info.get(st)
            if info is not None and st.nbytes() != info[1]:
                new = st.nbytes()
                counter._bump(info[0], new - info[1])
                info[1] = new
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]

    def __enter__(self) -> TensorMemory:
        self._patch_resize()
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        if self._orig_resize is not None:
            torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]
            self._orig_resize = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):
            return NotImplemented  # let DTensor run its local ops, which are counted
        out = func(*args, **(kwargs or {}))
        leaves, _ = tree_flatten(out)
        for t in leaves:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out
