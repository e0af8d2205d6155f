"""The example scripts refuse a bad number flag as it is parsed: one argparse line, exit 2, before Ray.

They read ``--gpus``/``--steps`` as plain ints (``--memory-limit-gb``, ``--time-limit`` as plain floats),
so ``--gpus 0`` or ``--steps -3`` ended in a traceback after Ray had started. Each script runs here with
``ray.init`` replaced by an exit (code 99), so a flag let through never starts Ray.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NO_RAY = (
    "import runpy, sys, ray\n"
    "def init(*a, **k):\n"
    "    sys.exit(99)  # a bad flag got through to ray.init\n"
    "ray.init = init\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


@pytest.mark.parametrize(("script", "args", "message"), [
    ("vision_grid.py", ["--gpus", "0"], "argument --gpus: '0' is not a whole number from 1 to"),
    ("vision_grid.py", ["--steps", "-3"], "argument --steps: '-3' is not a whole number from 1 to"),
    ("llm_finetune_grid.py", ["--steps", "0"], "argument --steps: '0' is not a whole number from 1 to"),
    ("llm_finetune_grid.py", ["--gpus", "two"], "argument --gpus: 'two' is not a whole number"),
    ("llm_finetune_grid.py", ["--memory-limit-gb", "-1"], "argument --memory-limit-gb: '-1' is not a finite number"),
    ("tune_search.py", ["--gpus", "0"], "argument --gpus: '0' is not a whole number from 1 to"),
    ("job_submit.py", ["--time-limit", "0"], "argument --time-limit: '0' is not a finite number > 0"),
])
def test_an_example_refuses_a_bad_number_flag_in_one_line_before_ray(script, args, message):
    proc = subprocess.run([sys.executable, "-c", NO_RAY, str(EXAMPLES / script), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"{script}: error: {message}"), proc.stderr
