"""The README's command lines, as written, are lines the CLI accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ray_saturn.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """Every ``ray-saturn ...`` command in README.md's code: fenced or indented blocks and inline spans.

    Comments are dropped; pipes and ``&&`` chains are split into their commands.
    """
    code: list[str] = []
    fenced = False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            code.append(re.split(r"\s#\s", line)[0].strip())
        else:  # inline: a full command line; a bare `ray-saturn simulate` only names a subcommand (checked below)
            code += [c for c in re.findall(r"`(ray-saturn [^`]+)`", line) if len(c.split()) > 2]
    out = []
    for text in code:
        for part in re.split(r"\s*(?:\|\||\||&&)\s*", text):
            if part.strip().startswith("ray-saturn "):
                out.append(part.strip())
    return out


def variants(cmd: str) -> list[str]:
    """A line with ``[--opt value]`` optional parts: without them, and with each one."""
    optional = re.findall(r"\[([^\]]+)\]", cmd)
    bare = re.sub(r"\s*\[[^\]]+\]", "", cmd)
    return [bare] + [f"{bare} {o}" for o in optional]


COMMANDS = readme_commands()


def test_the_readme_has_the_commands_we_check():
    subcommands = {shlex.split(c)[1] for c in COMMANDS}
    assert {"run", "status", "resume", "plan", "emulate", "simulate", "demo"} <= subcommands, subcommands


@pytest.mark.parametrize("cmd", [v for c in COMMANDS for v in variants(c)])
def test_readme_line_parses_as_written(cmd):
    args = build_parser().parse_args(shlex.split(cmd)[1:])  # argparse exits (code 2) on a line it refuses
    assert callable(args.func)
    if args.command in ("run", "status", "resume"):
        assert args.storage


def test_run_dir_is_a_deprecated_alias_of_storage():
    a = build_parser().parse_args(["run", "w.py", "--run-dir", "/tmp/x"])
    b = build_parser().parse_args(["run", "w.py", "--storage", "/tmp/x"])
    assert a.storage == b.storage == "/tmp/x"


def test_subcommands_named_in_the_readme_exist():
    from ray_saturn.cli import SUBCOMMANDS

    named = set(re.findall(r"`ray-saturn ([a-z-]+)`", (ROOT / "README.md").read_text()))
    assert named and named <= set(SUBCOMMANDS), named - set(SUBCOMMANDS)


def test_every_option_of_every_subcommand_says_what_it_does():
    """--seed of plan, simulate and emulate had no help at all; plan's --policy listed saturn twice."""
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    silent = [f"{name} {x.option_strings or x.dest}" for name, p in sub.choices.items() for x in p._actions
              if not x.help]
    assert not silent, silent
    policy = next(x for x in sub.choices["plan"]._actions if "--policy" in x.option_strings)
    assert policy.help.count("saturn") == 1, policy.help


def test_profile_and_run_name_their_workload_file_alike():
    """README writes `ray-saturn profile WORKLOAD.py`; the usage line said `tasks` (and run's `workload`)."""
    parser = build_parser()
    for cmd in ("profile", "run"):
        usage = parser._subparsers._group_actions[0].choices[cmd].format_usage()
        assert usage.rstrip().endswith("WORKLOAD"), usage
