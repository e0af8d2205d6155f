"""Shared fixtures (helpers that are not fixtures live in helpers.py)."""

from __future__ import annotations

import pytest

from ray_saturn import ProfileTable


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Under pytest-xdist (``-n 2 --dist loadgroup``, the default options), every test that starts Ray runs
    in one process, one after another (two Ray clusters at once on 2 cores would measure contention, and
    some of these tests look for "the" cluster of the machine); the others run beside them, a module's
    tests together (its module-scoped fixtures are built once)."""
    for item in items:
        group = "ray" if item.get_closest_marker("ray") else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def no_ray(monkeypatch):
    """Bad input must be refused before Ray starts: ``ray.init`` fails the test."""
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("bad input must be refused before Ray starts")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)


@pytest.fixture
def fake_tune(monkeypatch):
    """The fake Tune class (tune_fakes.py), with the scheduler's Trial class patched to its fake trials."""
    from tune_fakes import FakeTrial, FakeTune

    import ray_saturn.tune._scheduler as sched

    monkeypatch.setattr(sched, "Trial", FakeTrial)
    return FakeTune


@pytest.fixture
def no_background(monkeypatch):
    """Only the hooks' cheap plans (deterministic): nothing is solved in the background."""
    from ray_saturn.tune import _planner as planner_mod

    monkeypatch.setattr(planner_mod.BackgroundPlanner, "flush", lambda self: setattr(self, "_candidate", None))


@pytest.fixture
def small_profile():
    return ProfileTable.from_rows(
        [
            {"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 10.0, "steps": 10},
            {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 6.0, "steps": 10},
            {"task": "b", "strategy": "ddp", "gpus": 1, "step_time_s": 10.0, "steps": 10},
            {"task": "b", "strategy": "fsdp", "gpus": 4, "nodes": 2, "step_time_s": 3.0, "steps": 10},
            {"task": "c", "strategy": "ddp", "gpus": 2, "step_time_s": 5.0, "steps": 4},
        ],
        source="small.csv",
    )


# ---------------------------------------------------------------- the end of the session
# CI once saw the test process die of SIGSEGV *after* every test had passed ("735 passed", then
# exit 139): a crash in the interpreter's own teardown, where the extension modules the suite loads
# into one process (Ray's core worker, torch, gloo, pyarrow's S3 client, ortools) are finalised in
# an order none of them controls. It did not happen again in a full local run. So the session ends
# in an orderly way that does not depend on that teardown: Ray is shut down and S3 finalised
# explicitly (a crash there still fails the run, with a traceback: faulthandler stays on), and the
# process then exits with pytest's own status without finalising the interpreter.
# SATURN_TEST_FULL_TEARDOWN=1 keeps the interpreter's teardown (to look for that crash).
_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session, exitstatus) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    import contextlib
    import faulthandler
    import gc
    import os
    import sys

    if not _EXIT_STATUS or os.environ.get("SATURN_TEST_FULL_TEARDOWN") == "1":
        return
    faulthandler.enable(file=sys.__stderr__)
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    gc.collect()
    if "pyarrow._s3" in sys.modules:
        import pyarrow.fs

        pyarrow.fs.ensure_s3_finalized()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(_EXIT_STATUS[-1])
