"""The example scripts refuse a bad number flag as it is parsed: one argparse line, exit 2, before Ray.

They read ``--gpus``/``--steps`` as plain ints (``--memory-limit-gb``, ``--time-limit`` as plain floats),
so ``--gpus 0`` or ``--steps -3`` ended in a traceback after Ray had started. Each script runs here with
``ray.init`` replaced by an exception, so a flag let through never starts Ray.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import ray

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class _RayStarted(Exception):
    """A bad flag got through to ``ray.init``."""


def _no_ray(*args, **kwargs):
    raise _RayStarted


@pytest.mark.parametrize(("script", "args", "message"), [
    ("vision_grid.py", ["--gpus", "0"], "argument --gpus: '0' is not a whole number from 1 to"),
    ("vision_grid.py", ["--steps", "-3"], "argument --steps: '-3' is not a whole number from 1 to"),
    ("llm_finetune_grid.py", ["--steps", "0"], "argument --steps: '0' is not a whole number from 1 to"),
    ("llm_finetune_grid.py", ["--gpus", "two"], "argument --gpus: 'two' is not a whole number"),
    ("llm_finetune_grid.py", ["--memory-limit-gb", "-1"], "argument --memory-limit-gb: '-1' is not a finite number"),
    ("tune_search.py", ["--gpus", "0"], "argument --gpus: '0' is not a whole number from 1 to"),
    ("job_submit.py", ["--time-limit", "0"], "argument --time-limit: '0' is not a finite number > 0"),
])
def test_an_example_refuses_a_bad_number_flag_in_one_line_before_ray(script, args, message, monkeypatch, capsys):
    # In this process (an interpreter per case cost 2 s of imports each); ray.init raising means the flag got through.
    monkeypatch.setattr(ray, "init", _no_ray)
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / script), *args])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    stderr = capsys.readouterr().err
    assert exited.value.code == 2, (exited.value.code, stderr[-2000:])
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith(f"{script}: error: {message}"), stderr
