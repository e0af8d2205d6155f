"""``ray-saturn status STORAGE``: each task's state, strategy, GPUs, progress and ETA.

The first line says whether the run's driver lives (the run folder's lock
and its heartbeat): a run that is not over and whose driver has not been
seen says for how long, and that ``ray-saturn resume STORAGE`` continues it.
A damaged ``state.json`` falls back to its backup, and a missing one to what
the events show; the status says which it shows. With nothing readable (the
state files damaged and nothing rebuilt from the events) and no live driver,
it ends with one line naming the damaged files, and exit code 2. So does a
damaged run.json (the run's settings, which resume needs), after what the
state files show.
"""

from __future__ import annotations

import argparse
import json
import unicodedata

from ray_saturn.cli.args import json_stream
from ray_saturn.runtime.api import run_status
from ray_saturn.runtime.records import RunOutcome
from ray_saturn.runtime.storage import StorageError


def add_parser(sub) -> None:
    p = sub.add_parser("status", help="show the state of a run", description=__doc__)
    p.add_argument("storage", metavar="STORAGE", help="the run's storage, as given to run: a local path or a URI")
    p.add_argument("--json", action="store_true", help="print the persisted state as JSON")
    p.set_defaults(func=run)


def _eta(s: float | None) -> str:
    if s is None:
        return "?"
    h, rem = divmod(int(s), 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}"


def run(args: argparse.Namespace) -> int:
    state = run_status(args.storage)
    if args.json:
        print(json.dumps(state), file=json_stream())
    else:
        _print(state)
    if state.get("settings_problem"):
        raise StorageError(state["settings_problem"])
    return 0


def _printable(text: str) -> str:
    """``text`` with control and format characters shown escaped: the run folder's files (task names,
    reasons, the lock's owner) must not move the cursor, clear the screen or forge lines in a terminal."""
    return "".join(
        c if not unicodedata.category(c).startswith("C") else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def _say(line: str) -> None:
    print(_printable(line))


def _print(state: dict) -> None:
    tasks = state.get("tasks", {})
    w = max([4] + [len(t) for t in tasks])
    _say(state["driver"]["note"])
    source = state.get("state_source")
    if source != "state.json":
        problems = "; ".join(state.get("state_problems") or [])
        shown = f"showing {source}" if source else "no state to show yet"
        _say(f"state: {problems + '; ' if problems else ''}{shown}")
    _say(
        f"run: {RunOutcome.of(state.get('driver_state'), {t: r.get('state') for t, r in tasks.items()}).headline}"
        f"  t={state.get('time_s', 0):.0f} s  "
        f"re-plans {state.get('replans', 0)}  moves {state.get('moves', 0)}"
        + (f"  ({state['reason']})" if state.get("reason") else "")
    )
    _say(
        f"{'task':<{w}}  {'state':<10} {'strategy':<14} {'gpus':>4}  "
        f"{'progress':>17}  {'eta':>9}  nodes"
    )
    # With no driver (killed, or the run stopped), nothing runs: a task the last state shows running
    # has stopped at its last checkpoint, with no ETA until the run is resumed.
    halted = state.get("driver_state") == "stopped"
    for name, t in tasks.items():
        pct = 100.0 * t["steps_done"] / max(1, t["total_steps"])
        prog = f"{t['steps_done']}/{t['total_steps']} {pct:3.0f}%"
        shown, eta = t["state"], t.get("eta_s")
        if halted and shown == "running":
            shown, eta = "stopped", None
        line = (
            f"{name:<{w}}  {shown:<10} {t.get('strategy') or '-':<14} "
            f"{t.get('gpus') or '-':>4}  "
            f"{prog:>17}  {_eta(eta):>9}  {','.join(t.get('nodes') or [])}"
        )
        if t["state"] == "failed" and t.get("reason"):
            line += f"  reason: {t['reason']}"
        _say(line)
