"""Crafted run folders and inputs through the public interfaces (the security and data-safety audit).

Each test names the input it tries; the product's answer must keep everything inside the run folder,
run nothing it reads, and lose nothing already trained.
"""

from __future__ import annotations

import time

from ray_saturn.cli import main
from ray_saturn.runtime.config import RunSettings
from ray_saturn.runtime.journal import RUN_FILE, Journal
from ray_saturn.runtime.storage import RunStorage


def test_status_prints_what_a_crafted_state_holds_without_terminal_control_characters(tmp_path, capsys):
    # A task name, a reason or a strategy in state.json holding ESC sequences or a newline was printed raw:
    # `ray-saturn status` could clear the screen, retitle the terminal or print forged lines.
    store = RunStorage(tmp_path)
    store.write_json(RUN_FILE, RunSettings(name="r", mode="emulate").to_dict())
    evil = "a\x1b[2J\x1b]0;owned\x07\nrun: finished"
    Journal(store).write_state({
        "driver_state": "stopped", "time_s": 1.0, "updated_wall": time.time(), "reason": "x\x1b[31m\rforged",
        "tasks": {evil: {"task": evil, "state": "failed", "steps_done": 1, "total_steps": 2, "segments": [],
                         "reason": "boom\x1b[8m"}},
    })
    main(["status", str(tmp_path)])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "\\x1b[2J" in out and not any(line.startswith("run: finished") for line in out.splitlines())


def test_a_stray_file_among_emulated_checkpoints_is_not_a_step(tmp_path):
    # "step-x.json" (or one with non-ASCII digits) in a task's emulated/ folder raised ValueError from
    # int() wherever the step was read: the driver's progress and resume.
    from ray_saturn.runtime.emulated import latest_emulated_step

    folder = tmp_path / "emulated"
    folder.mkdir()
    for name in ("step-000000000007.json", "step-x.json", "step-\u0661\u0662.json", "step-.json"):
        (folder / name).write_text("{}")
    assert latest_emulated_step(str(tmp_path)) == 7
