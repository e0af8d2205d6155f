"""What does not train does not import torch (about 2 s of CPU a process on these machines): the package, the
planner, the simulator, emulation, the run's driver, the CLI's start-up and the Tune scheduler (a trial
that trains imports torch itself); the profiler loads it on first use."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_planning_simulating_emulating_and_the_driver_start_without_torch():
    code = textwrap.dedent(
        """
        import sys
        import ray_saturn
        from ray_saturn import ClusterSpec, ProfileTable, emulate, plan, run, validate_plan  # noqa: F401
        import ray_saturn.cli, ray_saturn.cli.plan, ray_saturn.cli.simulate, ray_saturn.cli.emulate  # noqa: F401
        import ray_saturn.runtime.actor, ray_saturn.runtime.driver, ray_saturn.runtime.emulated  # noqa: F401
        import ray_saturn.runtime.emulation, ray_saturn.sim, ray_saturn.control.controller  # noqa: F401
        from ray_saturn.tune import SaturnScheduler, trial_decision  # noqa: F401  (a Tune trial's process)
        profile = ProfileTable.from_rows([{"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 3}])
        validate_plan(plan(profile, ClusterSpec.uniform(1, 1)), profile, ClusterSpec.uniform(1, 1))
        assert "torch" not in sys.modules, "torch was imported"
        from ray_saturn import profile as profile_fn
        assert callable(profile_fn) and "torch" in sys.modules  # the profiler brings it
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
