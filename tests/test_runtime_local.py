"""Local mode's Ray: its worker processes train at the niceness of the process that started it, and it is
the process's own (loopback only, a fresh token, no address file for others)."""

from __future__ import annotations

import os

import pytest

from ray_saturn.runtime.local import WORKER_NICENESS, local_gpus, local_ray


@pytest.mark.ray
def test_local_ray_workers_are_not_niced_and_it_listens_on_loopback_only():
    import ray

    assert WORKER_NICENESS not in os.environ
    before = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_TMPDIR")}

    @ray.remote(num_gpus=1)
    def niceness() -> int:
        return os.nice(0)

    with local_ray(local_gpus(1, cores=1, cuda_devices=0)):
        # Ray's default is 15: next to background work niced to 19, training would lose a third of its core.
        assert ray.get(niceness.remote()) == os.nice(0)
        # `run --num-gpus`, `profile` and the demo listened on the machine's address, as a plain ray.init() does.
        assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1"]
        assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
        assert os.environ["RAY_AUTH_MODE"] == "token" and len(os.environ["RAY_AUTH_TOKEN"]) >= 32
        assert os.environ["RAY_TMPDIR"] != before["RAY_TMPDIR"]
    assert WORKER_NICENESS not in os.environ
    assert {k: os.environ.get(k) for k in before} == before


def test_segments_poll_their_workers_quickly_unless_the_user_chose(monkeypatch):
    from ray_saturn import defaults

    monkeypatch.delenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", raising=False)
    defaults.quick_train_polls()
    assert float(os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"]) == defaults.TRAIN_POLL_S < 2.0
    # Ray Train V2 propagates the variable to the controller it starts, and so to its poll loop.
    from ray.train.v2._internal.constants import get_env_vars_to_propagate

    assert get_env_vars_to_propagate()["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == str(defaults.TRAIN_POLL_S)
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "3")
    defaults.quick_train_polls()
    assert os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "3"


@pytest.mark.parametrize(
    "address, env_address, recorded, joins",
    [
        (None, None, None, False),  # nothing to join: a private local Ray, not a plain unauthenticated one
        (None, None, "10.0.0.5:6379", True),  # the cluster `ray start` recorded on this machine
        (None, "10.0.0.5:6379", None, True),  # RAY_ADDRESS
        ("10.0.0.6:6379", None, None, True),  # --address
    ],
)
def test_run_and_profile_join_a_cluster_or_start_a_private_one(monkeypatch, address, env_address, recorded,
                                                                joins):
    """`run`, `resume` and `profile` without --num-gpus: ray.init() joins a running cluster as before; where
    none runs, the Ray they start has token auth on 127.0.0.1 (the test of local_ray above shows what those
    settings give), and the process's environment is put back after."""
    import ray
    import ray._private.services as services

    from ray_saturn.runtime import local
    from ray_saturn.runtime.actor import connected

    if env_address is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env_address)
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: recorded)
    calls = []

    def init(address=None, **kwargs):
        calls.append((address, kwargs, os.environ.get("RAY_AUTH_MODE"), os.environ.get("RAY_AUTH_TOKEN")))

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    shut = []
    monkeypatch.setattr(ray, "shutdown", lambda: shut.append(1))
    before = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_TMPDIR")}
    context = connected() if address is None else local.joined_or_private_ray(address, include_dashboard=False)
    with context:
        pass
    (got_address, kwargs, mode, token), = calls
    if joins:
        assert got_address == address and "_node_ip_address" not in kwargs
        assert (mode, token) == (before["RAY_AUTH_MODE"], before["RAY_AUTH_TOKEN"])
    else:
        assert got_address == "local" and kwargs["_node_ip_address"] == local.LOCALHOST
        assert mode == "token" and len(token) >= 32
    assert shut == [1]
    assert {k: os.environ.get(k) for k in before} == before


@pytest.mark.parametrize("recorded, fresh, joins", [(None, False, False), ("10.0.0.5:6379", False, True),
                                                    ("10.0.0.5:6379", True, False)])
def test_init_ray_joins_a_cluster_or_starts_a_private_local_one(monkeypatch, recorded, fresh, joins):
    """ray_saturn.init_ray, what the examples call instead of ray.init(): a running cluster is joined (unless
    fresh); else a local Ray with token auth on 127.0.0.1 and N logical GPUs capped at the cores (a plain
    ray.init() started one without authentication, with no GPU on a CPU machine). The environment is put back
    at exit."""
    import atexit

    import ray
    import ray._private.services as services

    import ray_saturn

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: recorded)
    calls, at_exit = [], []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda address=None, **kw: calls.append((address, kw,
                                                                                os.environ.get("RAY_AUTH_MODE"))))
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(atexit, "register", lambda fn, *args: at_exit.append((fn, args)))
    before = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_TMPDIR")}
    ray_saturn.init_ray(4, fresh=fresh)
    if joins:
        assert calls == [(None, {}, before["RAY_AUTH_MODE"])] and not at_exit
        return
    (fn, args), = [(fn, args) for fn, args in at_exit if getattr(fn, "__name__", "") == "__exit__"]
    try:
        (address, kwargs, mode), = calls
        assert address == "local" and kwargs["_node_ip_address"] == "127.0.0.1" and mode == "token"
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        assert kwargs["num_gpus"] == min(4, cores) and kwargs["include_dashboard"] is False
    finally:
        fn(*args)  # what happens at the process's exit
    assert calls[-1] == "shutdown"
    assert {k: os.environ.get(k) for k in before} == before
