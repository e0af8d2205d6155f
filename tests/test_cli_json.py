"""With --json, stdout holds the JSON document alone: lines Ray forwards to sys.stdout go to stderr."""

from __future__ import annotations

import json

import ray_saturn.cli.plan as plan_cli
from ray_saturn.cli import main


def test_json_stdout_is_the_document_alone(monkeypatch, capsys):
    real = plan_cli.solve

    def noisy_solve(*args, **kwargs):
        # What Ray's log thread does with a worker's or the raylet's line: print it to sys.stdout.
        print("(raylet) WARNING: 8 PYTHON worker processes have been started")
        return real(*args, **kwargs)

    monkeypatch.setattr(plan_cli, "solve", noisy_solve)
    assert main(["plan", "--example", "--json", "--nodes", "1", "--gpus-per-node", "4", "--time-limit", "1"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["makespan_s"] > 0  # one JSON document, nothing else
    assert "(raylet) WARNING" in err
    # Without --json the line stays where it was printed.
    assert main(["plan", "--example", "--nodes", "1", "--gpus-per-node", "4", "--time-limit", "1"]) == 0
    out, err = capsys.readouterr()
    assert "(raylet) WARNING" in out and "(raylet)" not in err
