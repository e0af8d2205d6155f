"""Workload files: a Python file that defines the tasks of a run.

A workload file defines a module-level ``tasks`` list of
:class:`ray_saturn.Task` (or a ``tasks()`` function returning one). Its own
model classes, data functions and losses travel with the tasks to the Ray
workers: the file is loaded as a module that cloudpickle serialises *by value*
(Ray's workers cannot import a file that only exists on the machine that
loaded it). Modules the file imports from its own folder (helpers beside it)
are serialised by value as well; installed packages are imported by name on
the workers as usual, so they must be installed there.

Example:
    >>> # tasks = load_workload("sweep.py")
    >>> # ray_saturn.run(tasks, storage="/tmp/runs/sweep")
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from ray_saturn.errors import SpecError
from ray_saturn.spec import Task, check_unique_names

__all__ = ["load_workload", "workload_digest"]

logger = logging.getLogger(__name__)


def workload_digest(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a workload file's bytes (``sha256:<hex>``), to recognise it later."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the workload file ({exc.strerror or exc})") from None
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _under(path: str | None, folder: Path) -> bool:
    if not path:
        return False
    try:
        return Path(path).resolve().is_relative_to(folder)
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _folder_on_path(folder: Path) -> Iterator[None]:
    """Let the file import helpers that sit beside it, as `python FILE` would."""
    entry = str(folder)
    added = entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(entry)


def _by_value(module: ModuleType) -> None:
    import ray.cloudpickle as cloudpickle

    with contextlib.suppress(ValueError):  # already registered
        cloudpickle.register_pickle_by_value(module)


def _exited(path: str | os.PathLike[str], exc: SystemExit, when: str) -> SpecError:
    return SpecError(
        f"{path}: the workload called sys.exit({exc.code!r}) {when}; a workload file defines `tasks` and runs "
        "nothing: put script code under `if __name__ == '__main__':`".splitlines()[0]
    )


def _ray_initialized() -> bool:
    ray = sys.modules.get("ray")  # not imported: not initialised either
    return bool(ray is not None and ray.is_initialized())


def load_workload(path: str | os.PathLike[str]) -> list[Task]:
    """The tasks a workload file defines, ready to be shipped to Ray workers.

    Raises:
        SpecError: one line naming the file: missing, not Python, failing on
            import (with the error), or defining no ``tasks``.
    """
    file = Path(path)
    if not file.is_file():
        raise SpecError(f"{path}: no such workload file; give the path of a Python file that defines `tasks`")
    folder = file.resolve().parent
    name = f"_ray_saturn_workload_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise SpecError(f"{path}: not a Python file; a workload file ends in .py and defines `tasks`")
    module = importlib.util.module_from_spec(spec)
    ray_before = _ray_initialized()
    before = set(sys.modules)
    sys.modules[name] = module
    try:
        with _folder_on_path(folder):
            spec.loader.exec_module(module)
    except SystemExit as exc:
        sys.modules.pop(name, None)
        raise _exited(path, exc, "while it loaded") from None
    except Exception as exc:
        sys.modules.pop(name, None)
        raise SpecError(f"{path}: the workload failed to load ({type(exc).__name__}: {exc})".splitlines()[0]) from None
    _by_value(module)
    for mod_name in sorted(set(sys.modules) - before - {name}):
        mod = sys.modules.get(mod_name)
        # A helper module imported from the workload's own folder: the workers cannot import it either.
        if mod is not None and "." not in mod_name and _under(getattr(mod, "__file__", None), folder):
            logger.debug("workload helper %s travels by value", mod_name)
            _by_value(mod)
    tasks = getattr(module, "tasks", None)
    if callable(tasks):
        try:
            tasks = tasks()
        except SystemExit as exc:
            raise _exited(path, exc, "in tasks()") from None
        except Exception as exc:
            raise SpecError(f"{path}: tasks() raised {type(exc).__name__}: {exc}".splitlines()[0]) from None
    if not ray_before and _ray_initialized():
        import ray

        ray.shutdown()  # the Ray it started (a local one with no GPUs, or a connection) would be the run's
        raise SpecError(
            f"{path}: the workload called ray.init(); a workload file defines `tasks` only (ray-saturn joins "
            "or starts Ray itself: --num-gpus N, RAY_ADDRESS): drop it or put it under `if __name__ == '__main__':`"
        )
    if tasks is None:
        raise SpecError(f"{path}: define a module-level `tasks` list of ray_saturn.Task (or a tasks() function)")
    if isinstance(tasks, (str, bytes)) or not hasattr(tasks, "__iter__"):
        raise SpecError(f"{path}: `tasks` is a {type(tasks).__name__}; make it a list of ray_saturn.Task")
    try:
        tasks = check_unique_names(tasks)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None
    from ray_saturn.strategies.base import StrategyError
    from ray_saturn.strategies.registry import get_strategy

    for t in tasks:  # a task's own strategies, registered by now (the file may register its own): before Ray
        for s in t.strategies or ():
            try:
                get_strategy(s)
            except StrategyError as exc:
                raise SpecError(f"{path}: task {t.name!r}: {exc}") from None
    return tasks
