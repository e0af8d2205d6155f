"""Local mode: a Ray on this machine whose (logical) GPUs the CPU can actually run.

On a machine without a GPU, Ray's logical GPUs are CPU processes training
with gloo. More of them than the machine has cores (or more torch threads
per process than a core each) makes every measured step time a measure of
contention, not of the workload: the profile and the run disagree, and the
plan with them. :func:`local_gpus` therefore caps the logical GPUs at the
CPU cores and gives each training process ``cores // gpus`` torch threads;
:func:`local_ray` starts Ray with them, the same for profiling and for the
run (``OMP_NUM_THREADS`` for every worker), so profiling measures under the
concurrency the run has. With CUDA, the GPUs are the devices.

Ray starts its worker processes (every trial, trainer and driver actor) at
niceness 15 (``RAY_worker_niceness``); next to any background work niced
to 19, a training process then gets about 70% of its core (scheduler
weights 36 against 15) and measured step and start-up times swing with
whatever else runs. :func:`local_ray` starts them at niceness 0, as the
process that asked for them (unless ``RAY_worker_niceness`` is set).

Example:
    >>> lg = local_gpus(4, cores=2, cuda_devices=0)
    >>> lg.gpus, lg.threads_per_worker
    (2, 1)
    >>> print(lg.describe()[:77])
    No GPU found: 2 logical GPUs on the CPU (asked for 4; the machine has 2 cores
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

from ray_saturn.errors import SaturnError

__all__ = [
    "LOCALHOST",
    "LocalGpus",
    "init_ray",
    "joined_or_private_ray",
    "local_gpus",
    "local_ray",
    "private_ray_environment",
]

logger = logging.getLogger(__name__)

#: Logical GPUs when none are asked for (capped at the cores).
DEFAULT_LOGICAL_GPUS = 4
#: The environment variable the raylet takes its worker processes' niceness from (Ray's default: 15).
WORKER_NICENESS = "RAY_worker_niceness"


@dataclass(frozen=True)
class LocalGpus:
    """What a local Ray gets: ``gpus`` (CUDA devices or logical ones) and torch threads per worker."""

    gpus: int
    cuda: bool
    cores: int
    threads_per_worker: int
    requested: int | None = None

    def describe(self) -> str:
        """The one line a user is told about the GPUs."""
        if self.cuda:
            asked = f" (asked for {self.requested})" if self.requested and self.requested != self.gpus else ""
            return f"Using {self.gpus} CUDA GPU(s){asked}."
        asked = f"asked for {self.requested}; " if self.requested and self.requested != self.gpus else ""
        return (
            f"No GPU found: {self.gpus} logical GPUs on the CPU ({asked}the machine has {self.cores} cores: "
            f"one training process per core, {self.threads_per_worker} torch thread"
            f"{'s' if self.threads_per_worker > 1 else ''} each); every GPU is a CPU process training with gloo."
        )


def local_gpus(requested: int | None = None, *, cores: int | None = None, cuda_devices: int | None = None) -> LocalGpus:
    """The GPUs a local Ray should have (see the module docstring).

    ``cores`` and ``cuda_devices`` default to this machine's.
    """
    if requested is not None and requested < 1:
        raise SaturnError(f"--gpus is {requested}; give at least 1 (logical) GPU")
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cores = max(1, int(cores))
    if cuda_devices is None:
        import torch

        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cuda_devices > 0:
        gpus = min(requested or cuda_devices, cuda_devices)
        return LocalGpus(gpus, True, cores, max(1, cores // gpus), requested)
    gpus = min(requested or DEFAULT_LOGICAL_GPUS, cores)
    return LocalGpus(gpus, False, cores, max(1, cores // gpus), requested)


#: Local and emulated clusters listen on this address only.
LOCALHOST = "127.0.0.1"

#: Ray's switch between a cluster on the machine's address and one on the loopback address only.
_LOOPBACK_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_PRIVATE_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_TMPDIR", _LOOPBACK_VAR)


def _reload_ray_auth() -> None:
    """Make this process read the authentication settings again (Ray caches them)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # a Ray without token authentication
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextlib.contextmanager
def private_ray_environment() -> Iterator[str]:
    """Token auth with a fresh token, the loopback address and a private temp dir, for this
    process and the Ray it starts.

    - Ray writes the address of a cluster it starts to ``<temp dir>/ray_current_cluster``, where
      a plain ``ray.init()`` elsewhere on the machine would find it (and hang on it once the
      cluster is dead). With ``RAY_TMPDIR`` set to a folder of our own, that file, the sessions
      and the sockets live there, and the folder is removed on exit.
    - The token exists only in the environment of this process and its children.
    - Ray resolves "127.0.0.1" to the machine's address when it connects, unless its
      single-machine switch (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read by the processes it
      starts, and ``ray_constants.ENABLE_RAY_CLUSTER`` in this one) says the cluster is on the
      loopback address only.

    Everything is restored on exit.
    """
    import secrets
    import shutil
    import tempfile

    import ray._private.ray_constants as ray_constants

    base = "/tmp" if os.path.isdir("/tmp") else None  # short: Ray's socket paths must stay < 108 bytes
    temp = tempfile.mkdtemp(prefix="rse-", dir=base)
    saved = {k: os.environ.get(k) for k in _PRIVATE_VARS}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    os.environ["RAY_TMPDIR"] = temp
    os.environ[_LOOPBACK_VAR] = "0"
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    ray_constants.ENABLE_RAY_CLUSTER = False
    _reload_ray_auth()
    try:
        yield temp
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        _reload_ray_auth()
        shutil.rmtree(temp, ignore_errors=True)


@contextlib.contextmanager
def local_ray(lg: LocalGpus, *, env: dict[str, str] | None = None) -> Iterator[None]:
    """A fresh local Ray with ``lg``'s GPUs and threads per worker; shut down on exit.

    Like an emulated cluster it is this process's alone
    (:func:`private_ray_environment`): token auth with a fresh
    token, listening on 127.0.0.1 only (a plain ``ray.init()`` listens on the machine's
    address), no dashboard, and no address file where other Ray users on the machine look.
    """
    import ray

    if ray.is_initialized():
        raise SaturnError("Ray is already initialised in this process; local mode starts its own local Ray")
    env_vars = {"OMP_NUM_THREADS": str(lg.threads_per_worker), **(env or {})}
    with private_ray_environment():
        # the raylet reads its worker niceness from its environment, inherited from this process
        set_nice = WORKER_NICENESS not in os.environ
        if set_nice:
            os.environ[WORKER_NICENESS] = "0"
        try:
            ray.init(
                address="local",
                _node_ip_address=LOCALHOST,
                num_cpus=lg.cores,
                num_gpus=lg.gpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
                runtime_env={"env_vars": env_vars},
            )
        finally:
            if set_nice:
                os.environ.pop(WORKER_NICENESS, None)
        try:
            yield
        finally:
            ray.shutdown()


def _cluster_to_join(address: str | None) -> bool:
    """Whether ``ray.init(address)`` would join a cluster rather than start one: an address given
    or in ``RAY_ADDRESS``, or the cluster a ``ray start`` on this machine recorded."""
    if address or os.environ.get("RAY_ADDRESS"):
        return True
    from ray._private.services import find_bootstrap_address

    return find_bootstrap_address(None) is not None


@contextlib.contextmanager
def joined_or_private_ray(address: str | None = None, **init_kwargs) -> Iterator[None]:
    """Join the running Ray cluster (``address``, ``RAY_ADDRESS``, or the one ``ray start``
    recorded) as ``ray.init()`` would; where there is none, start a local one that is this
    process's alone (:func:`private_ray_environment`: token auth, 127.0.0.1 only), not the plain
    ``ray.init()`` one without authentication on the machine's address. Nothing is done when Ray
    is already initialised; a Ray started here is shut down on exit.
    """
    import ray

    if ray.is_initialized():
        yield
        return
    join = _cluster_to_join(address)
    if not join:
        logger.info("no running Ray cluster found: starting a local one for this command (token auth, "
                    "127.0.0.1 only; `ray start --head` first to share one)")
    with contextlib.nullcontext() if join else private_ray_environment():
        if join:
            ray.init(address=address or None, **init_kwargs)
        else:
            ray.init(address="local", _node_ip_address=LOCALHOST, **init_kwargs)
        try:
            yield
        finally:
            ray.shutdown()


def init_ray(gpus: int | None = None, *, fresh: bool = False) -> None:
    """Initialise Ray for a script as the CLI does, instead of a plain ``ray.init()``.

    A running cluster (``RAY_ADDRESS``, as under ``ray job submit``, or the one ``ray start``
    recorded on this machine) is joined, unless ``fresh``. Otherwise a local Ray private to
    this process starts (:func:`local_ray`: token auth with a fresh token, 127.0.0.1 only, no
    dashboard) with ``gpus`` GPUs: the CUDA devices, or without CUDA that many logical GPUs
    capped at the CPU cores (default 4), as the CLI's ``--num-gpus``. A plain ``ray.init()``
    would start one without authentication on the machine's address, with no GPU on a CPU
    machine. The local Ray is shut down, and the environment restored, when the process exits.

    Example:
        >>> import ray_saturn
        >>> ray_saturn.init_ray(4)  # doctest: +SKIP
    """
    import atexit

    import ray

    if ray.is_initialized():
        raise SaturnError("Ray is already initialised in this process; call ray_saturn.init_ray() in place of "
                          "ray.init(), not after it")
    if not fresh and _cluster_to_join(None):
        ray.init()
        return
    lg = local_gpus(gpus)
    logger.info("%s", lg.describe())
    started = local_ray(lg)
    started.__enter__()
    atexit.register(started.__exit__, None, None, None)
