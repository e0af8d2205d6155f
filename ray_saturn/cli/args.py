"""Flag types for the subcommands: every number and path is checked as it is parsed.

A bad value ends the command before anything runs (no profile read, no
cluster started) with one line, ``ray-saturn CMD: error: argument FLAG:
...``, and exit code 2 (see :class:`OneLineParser`).

Example:
    >>> seconds("--time-limit")("30")
    30.0
    >>> seconds("--time-limit")("nan")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: 'nan' is not a finite number > 0 (seconds)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from ray_saturn.errors import SaturnError, SpecError
from ray_saturn.limits import MAX_SEED, number, whole

__all__ = [
    "OneLineParser",
    "count",
    "fraction",
    "json_only_on_stdout",
    "json_stream",
    "output_file",
    "output_folder",
    "positive",
    "seconds",
    "seed",
    "write_text",
]


_JSON_STREAM: TextIO | None = None


@contextlib.contextmanager
def json_only_on_stdout(enabled: bool) -> Iterator[None]:
    """With ``--json``, keep stdout for the one JSON document: everything else printed meanwhile
    (Ray forwards its workers' and raylet's lines to ``sys.stdout``) goes to stderr, and
    :func:`json_stream` is the real stdout."""
    global _JSON_STREAM
    if not enabled:
        yield
        return
    _JSON_STREAM = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_STREAM = None


def json_stream() -> TextIO:
    """Where a command prints its ``--json`` document (see :func:`json_only_on_stdout`)."""
    return _JSON_STREAM if _JSON_STREAM is not None else sys.stdout


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit code 2 (no usage block)."""

    def error(self, message: str):  # type: ignore[override]
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _type(name: str, check: Callable[[str], object]) -> Callable[[str], object]:
    def parse(text: str) -> object:
        try:
            return check(text)
        except SaturnError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name  # argparse names the type in some messages
    return parse


def seconds(flag: str, *, zero: bool = False) -> Callable[[str], object]:
    """A finite number of seconds, > 0 (or >= 0 with ``zero``)."""
    return positive(flag, "seconds", zero=zero)


def positive(flag: str, unit: str, *, zero: bool = False) -> Callable[[str], object]:
    """A finite number > 0 (or >= 0 with ``zero``) of ``unit``, which the error names."""
    bound = ">= 0" if zero else "> 0"

    def check(text: str) -> float:
        try:
            return number(text, flag, low=0, low_open=not zero)
        except SaturnError:
            raise SaturnError(f"{text!r} is not a finite number {bound} ({unit})") from None

    return _type(unit, check)


def fraction(flag: str, *, high: float | None = None) -> Callable[[str], object]:
    """A finite number >= 0 (at most ``high``)."""

    def check(text: str) -> float:
        try:
            return number(text, flag, low=0, high=high)
        except SaturnError:
            most = f" and <= {high:g}" if high is not None else ""
            raise SaturnError(f"{text!r} is not a finite number >= 0{most}") from None

    return _type("number", check)


def count(flag: str, *, low: int = 1, high: int | None = None) -> Callable[[str], object]:
    """A whole number in ``[low, high]``."""

    def check(text: str) -> int:
        try:
            return whole(text, flag, low=low, high=high)
        except SaturnError:
            rng = f"from {low} to {high}" if high is not None else f">= {low}"
            raise SaturnError(f"{text!r} is not a whole number {rng}") from None

    return _type("count", check)


def seed(flag: str = "--seed") -> Callable[[str], object]:
    """A random seed: a whole number from 0 to 2**31 - 1."""
    return count(flag, low=0, high=MAX_SEED)


def output_file(flag: str) -> Callable[[str], object]:
    """A file to write: its folder must exist and it must not be a folder."""

    def check(text: str) -> str:
        p = Path(text)
        if not text.strip():
            raise SaturnError("is empty; give a file name")
        if p.is_dir():
            raise SaturnError(f"{text!r} is a folder; give a file name in it")
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            raise SaturnError(f"{text!r}: folder {str(parent)!r} does not exist; create it first")
        return text

    return _type("path", check)


def output_folder(flag: str) -> Callable[[str], object]:
    """A folder to write into: a folder, or a path nothing is at yet (it is created)."""

    def check(text: str) -> str:
        if not text.strip():
            raise SaturnError("is empty; give a folder")
        if Path(text).exists() and not Path(text).is_dir():
            raise SaturnError(f"{text!r} is a file; give a folder")
        return text

    return _type("folder", check)


def write_text(path: str, text: str, flag: str) -> None:
    """Write ``text`` to ``path``; an OS error (no permission, disk full) is a one-line error naming ``flag``."""
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise SaturnError(f"{flag} {path}: cannot write ({exc.strerror or exc})") from None


def add_arrival_options(p: argparse.ArgumentParser) -> None:
    """``--arrivals SPEC`` and ``--objective`` (``auto``: see :func:`chosen_objective`)."""
    from ray_saturn.solver.objective import OBJECTIVES

    p.add_argument(
        "--arrivals",
        default="0",
        metavar="SPEC",
        help="when each task arrives, in profile seconds from the start: batch or 0 (all at once, "
        "default), poisson:R (R tasks/hour), profile (its arrival_s column) or a trace: a CSV file "
        "task,arrival_s",
    )
    p.add_argument(
        "--objective",
        default="auto",
        choices=("auto", *OBJECTIVES),
        help="what the saturn policies optimise: makespan, completion (mean completion time) or online "
        "(completion time, makespan within 3%% of the best, idle GPUs backfilled); auto (default): "
        "makespan when every task arrives at 0, online otherwise",
    )


def example_profile_path() -> str:
    """The shipped example profile: 24 jobs from the Pollux traces (``--example``)."""
    from importlib.resources import files

    return str(files("ray_saturn") / "examples_data" / "model_selection_profile.csv")


def add_profile_argument(p: argparse.ArgumentParser, *, verb: str) -> None:
    """PROFILE, or ``--example`` for the shipped example profile (one of them)."""
    p.add_argument("profile", nargs="?", help="profile table (.csv or .parquet), see the README for its columns")
    p.add_argument("--example", action="store_true",
                   help=f"{verb} the shipped example profile (24 jobs, Pollux traces) instead of a PROFILE file")


def profile_path(args: argparse.Namespace) -> str:
    """The profile file ``add_profile_argument``'s options name; a one-line error unless exactly one is given."""
    if args.example == bool(args.profile):
        raise SpecError("give a PROFILE file or --example (one of them)")
    return args.profile or example_profile_path()


def chosen_objective(objective: str, arrivals: dict[str, float], profile=None) -> str:
    """``--objective``'s value, ``auto`` resolved: makespan when every task arrives at 0, else online.

    With ``profile``: an objective other than makespan on a profile with shares of one GPU or GPU
    types, which only makespan plans yet, is refused here, before any policy or cluster runs, saying
    which flag to give.
    """
    chosen = objective
    if objective == "auto":
        chosen = "makespan" if all(a <= 0 for a in arrivals.values()) else "online"
    if chosen != "makespan" and profile is not None and (profile.has_shares or profile.gpu_types):
        why = "--objective auto picks online as tasks arrive over time, but " if objective == "auto" else ""
        raise SpecError(f"{why}objective {chosen!r} does not yet plan shares of one GPU (gpus < 1) or GPU "
                        "types (gpu_type), which this profile has; give --objective makespan")
    return chosen


def add_local_gpus_option(p: argparse.ArgumentParser, *, what: str) -> None:
    """``--num-gpus N``: start a local Ray for this command instead of joining a running cluster."""
    from ray_saturn.limits import MAX_GPUS_PER_NODE

    p.add_argument(
        "--num-gpus", type=count("--num-gpus", high=MAX_GPUS_PER_NODE), metavar="N",
        help=f"{what} on a local Ray of N GPUs started for it (the CUDA devices; without CUDA, N logical "
        "GPUs capped at the CPU cores, one training process per core) instead of the running cluster",
    )


@contextlib.contextmanager
def local_cluster(num_gpus: int | None) -> Iterator[None]:
    """A local Ray of ``num_gpus`` (see :func:`add_local_gpus_option`) for the command, said in one
    line on stderr; nothing when ``num_gpus`` is None (the command joins RAY_ADDRESS or starts Ray itself)."""
    if num_gpus is None:
        yield
        return
    if os.environ.get("RAY_ADDRESS"):
        raise SaturnError(
            f"--num-gpus starts a local Ray, but RAY_ADDRESS is set ({os.environ['RAY_ADDRESS']}); "
            "drop --num-gpus to use that cluster, or unset RAY_ADDRESS"
        )
    from ray_saturn.runtime.local import local_gpus, local_ray

    lg = local_gpus(num_gpus)
    print(lg.describe(), file=sys.stderr)
    with local_ray(lg):
        yield
