"""The ``ray-saturn`` command line.

Each subcommand lives in its own module here, exposing ``add_parser(sub)``
(which registers the subcommand and sets ``func``) and a ``run(args) -> int``.
Logging is configured here and nowhere else. Every ray_saturn error becomes a
one-line message on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import logging
import os
import sys

from ray_saturn import __version__
from ray_saturn.cli.args import OneLineParser, json_only_on_stdout
from ray_saturn.errors import SaturnError

#: Subcommand modules, in help order.
SUBCOMMANDS = ("demo", "plan", "profile", "simulate", "run", "emulate", "resume", "status")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="ray-saturn",
        description="Train many PyTorch models at once on Ray: pick each task's parallelism, "
        "GPU count and start time jointly.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    parser.add_argument("--version", action="version", version=f"ray-saturn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        importlib.import_module(f"ray_saturn.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the subcommand's parser, which names its own --help (the top one named its)
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help (0) or a bad flag (2, one line already on stderr)
        return exc.code if isinstance(exc.code, int) else 2
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        with json_only_on_stdout(bool(getattr(args, "json", False))):
            code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a reader that went away is caught, not at interpreter exit
        return code
    except BrokenPipeError:
        # The reader of stdout went away (`ray-saturn status DIR --json | head`): end quietly, as a
        # command killed by SIGPIPE does, and keep Python from failing again when it flushes at exit.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except SaturnError as exc:
        print(f"ray-saturn {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # a run's says where its folder is and how to go on
        print(f"ray-saturn {args.command}: {str(exc) or 'interrupted'}", file=sys.stderr)
        return 130
    finally:
        # Free Arrow readers left in reference cycles while Arrow is still alive: torn down at
        # interpreter exit instead, their threads sometimes abort the process after its output
        # ("terminate called without an active exception", exit 134: `status --json` on a run
        # folder, 4 runs in 30; apache/arrow#34314).
        gc.collect()


if __name__ == "__main__":
    sys.exit(main())
