"""The one device/backend helper, with CUDA availability and device count patched."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from ray_saturn.strategies import device as devmod
from ray_saturn.strategies.device import (
    DeviceError,
    RankDevice,
    distributed_backend,
    local_device_index,
    rank_device,
    use_rank_device,
)


def _cuda(count: int):
    """Patch torch so that this process sees ``count`` CUDA devices (0: no CUDA)."""
    return mock.patch.multiple(
        torch.cuda,
        is_available=mock.Mock(return_value=count > 0),
        device_count=mock.Mock(return_value=count),
        set_device=mock.Mock(),
    )


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_every_rank_gets_its_own_gpu_and_nccl(world):
    with _cuda(world):
        got = [rank_device(r) for r in range(world)]
        assert distributed_backend() == "nccl"
    assert got == [RankDevice(torch.device("cuda", r), "nccl") for r in range(world)]
    assert len({g.device for g in got}) == world, "two ranks share a GPU"


@pytest.mark.parametrize("world", [1, 2, 4])
def test_without_cuda_every_rank_is_cpu_and_gloo(world):
    with _cuda(0):
        got = [rank_device(r) for r in range(world)]
        assert distributed_backend() == "gloo"
    assert got == [RankDevice(torch.device("cpu"), "gloo")] * world


def test_more_ranks_than_visible_gpus_is_a_clear_error():
    with _cuda(2), pytest.raises(DeviceError, match=r"local rank 2 asks for cuda:2, but this process sees 2"):
        rank_device(2)
    with pytest.raises(DeviceError, match="whole number >= 0"):
        rank_device(-1)


def test_local_index_from_local_rank_or_ray_train(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    with _cuda(0):
        assert local_device_index() == 3
    # inside a Ray Train worker on CUDA, Ray Train's mapping of its GPU wins over LOCAL_RANK
    with _cuda(4), mock.patch.object(devmod, "_ray_train_cuda_index", return_value=1):
        assert local_device_index() == 1
    with _cuda(4), mock.patch.object(devmod, "_ray_train_cuda_index", return_value=None):
        assert local_device_index() == 3
    monkeypatch.delenv("LOCAL_RANK")
    with _cuda(0):
        assert local_device_index() == 0
    monkeypatch.setenv("LOCAL_RANK", "x")
    with _cuda(0), pytest.raises(DeviceError, match="LOCAL_RANK is 'x'"):
        local_device_index()


def test_use_rank_device_makes_the_gpu_current(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    with _cuda(2):
        rd = use_rank_device()
        torch.cuda.set_device.assert_called_once_with(torch.device("cuda", 1))
    assert rd == RankDevice(torch.device("cuda", 1), "nccl")
    with _cuda(0):
        assert use_rank_device(5).device == torch.device("cpu")
        torch.cuda.set_device.assert_not_called()


def test_worker_context_takes_the_helpers_device(monkeypatch):
    from ray_saturn.strategies import WorkerContext

    monkeypatch.setenv("LOCAL_RANK", "1")
    with _cuda(2):
        assert WorkerContext.current().device == torch.device("cuda", 1)
    with _cuda(0):
        assert WorkerContext.current().device == torch.device("cpu")


class _Rendezvous(Exception):
    pass


@pytest.mark.parametrize(("count", "backend"), [(1, "nccl"), (0, "gloo")])
def test_profiler_trial_worker_joins_with_the_helpers_backend(monkeypatch, count, backend):
    """A trial actor (one GPU visible) joins its group with nccl on CUDA, gloo otherwise."""
    from ray_saturn.profiler.trials import _TrialWorker
    from ray_saturn.toy import mlp_task

    seen = {}

    def fake_init(b, **kw):
        seen["backend"] = b
        raise _Rendezvous

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with _cuda(count), mock.patch("torch.distributed.init_process_group", fake_init):
        with pytest.raises(_Rendezvous):
            _TrialWorker().search(mlp_task(), "ddp", 1, 2, "127.0.0.1", 1, {}, 5.0)
        if count:
            torch.cuda.set_device.assert_called_once_with(torch.device("cuda", 0))
    assert seen["backend"] == backend
