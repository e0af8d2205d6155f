"""Local mode's Ray: its worker processes train at the niceness of the process that started it."""

from __future__ import annotations

import os

import pytest

from ray_saturn.runtime.local import WORKER_NICENESS, local_gpus, local_ray


@pytest.mark.ray
def test_local_ray_workers_are_not_niced():
    import ray

    assert WORKER_NICENESS not in os.environ

    @ray.remote(num_gpus=1)
    def niceness() -> int:
        return os.nice(0)

    with local_ray(local_gpus(1, cores=1, cuda_devices=0)):
        # Ray's default is 15: next to background work niced to 19, training would lose a third of its core.
        assert ray.get(niceness.remote()) == os.nice(0)
    assert WORKER_NICENESS not in os.environ
