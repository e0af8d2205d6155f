"""Global batches: the data stream every strategy reads, and how batches split.

Every strategy trains on the same sequence of *global* batches: batch ``p``
of the stream is the ``p % n``-th batch of the task's data (the data factory
is called again at every epoch boundary, so it must be deterministic given the
task's ``hparams``). A data-parallel worker takes its contiguous slice of the
batch's rows; a pipeline splits it into micro-batches. So the data position
saved in a checkpoint is one integer and a restart neither repeats nor skips a
sample, whatever the strategy or worker count.

The model's input is ``batch[0]`` for a tuple or list, ``batch["input"]`` for
a mapping, and the batch itself for a tensor; ``task.loss(output, batch)``
sees the (sliced) batch.

Example:
    >>> import torch
    >>> rows = (torch.arange(4.0).reshape(4, 1), torch.zeros(4))
    >>> shard_batch(rows, rank=1, ways=2)[0].flatten().tolist()
    [2.0, 3.0]
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ray_saturn.errors import SpecError

__all__ = ["DataStream", "batch_rows", "model_input", "shard_batch", "slice_batch", "to_device"]


def _map(batch: Any, fn) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: _map(v, fn) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_map(v, fn) for v in batch)
    if isinstance(batch, list):
        return [_map(v, fn) for v in batch]
    return batch


def _leaves(batch: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    _map(batch, lambda t: out.append(t) or t)
    return out


def batch_rows(batch: Any) -> int:
    """Rows (dim 0) of a batch; every tensor in it must have the same number."""
    sizes = {t.shape[0] for t in _leaves(batch) if t.dim() > 0}
    if len(sizes) != 1:
        raise SpecError(
            f"a batch's tensors must share their first dimension (rows); got sizes {sorted(sizes)}"
        )
    return sizes.pop()


def slice_batch(batch: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of every tensor in the batch."""
    return _map(batch, lambda t: t[start:stop] if t.dim() > 0 else t)


def shard_batch(batch: Any, rank: int, ways: int) -> Any:
    """This rank's contiguous, equal slice of a global batch."""
    if ways == 1:
        return batch
    rows = batch_rows(batch)
    if rows % ways:
        raise SpecError(
            f"a batch of {rows} rows does not split evenly over {ways} workers; "
            f"make the batch size a multiple of {ways}"
        )
    per = rows // ways
    return slice_batch(batch, rank * per, (rank + 1) * per)


def to_device(batch: Any, device: torch.device) -> Any:
    return _map(batch, lambda t: t.to(device, non_blocking=True))


def model_input(batch: Any) -> Any:
    """What the model is called on: ``batch[0]``, ``batch["input"]`` or the batch tensor."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (tuple, list)) and batch:
        return batch[0]
    if isinstance(batch, Mapping) and "input" in batch:
        return batch["input"]
    raise SpecError(
        "cannot find the model input in a batch: yield (input, target, ...) tuples, "
        "a dict with an 'input' key, or a tensor"
    )


class DataStream:
    """Global batches of a task from a data position on, cycling over epochs.

    ``position`` counts global batches consumed since the start of training.

    Example:
        >>> stream = DataStream(lambda hp: [1, 2, 3], {}, position=2)
        >>> [next(stream) for _ in range(3)], stream.position
        ([3, 1, 2], 5)
    """

    def __init__(self, data_factory, hparams: Mapping[str, Any], position: int = 0) -> None:
        self._factory = data_factory
        self._hparams = hparams
        self.position = 0
        self._it: Iterator[Any] = iter(())
        self._epoch_len: int | None = None
        self._data: Any = None
        self._new_epoch()
        self.skip(position)

    def _new_epoch(self) -> None:
        self._data = self._factory(self._hparams)
        self._it = iter(self._data)

    def skip(self, n: int) -> None:
        """Advance ``n`` batches (indexing directly when the data is a sequence)."""
        if n <= 0:
            return
        if (
            hasattr(self._data, "__getitem__")
            and hasattr(self._data, "__len__")
            and len(self._data)
        ):
            length = len(self._data)
            target = self.position + n
            offset = target % length
            self._new_epoch()
            self._it = iter(self._data)
            for _ in range(offset):
                next(self._it)
            self.position = target
            return
        for _ in range(n):
            next(self)

    def __iter__(self) -> DataStream:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:
            self._new_epoch()
            try:
                batch = next(self._it)
            except StopIteration:
                raise SpecError("the task's data factory returned no batches") from None
        self.position += 1
        return batch
