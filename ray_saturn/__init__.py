"""ray_saturn: train many large PyTorch models at once on Ray.

It picks a parallelism and a GPU count for every task and schedules them all
jointly to minimise the makespan, with a lower bound that says how far from
optimal the plan can be.

Example:
    >>> import ray_saturn
    >>> profile = ray_saturn.ProfileTable.from_rows([
    ...     {"task": "a", "strategy": "ddp", "gpus": 2, "step_time_s": 1.0, "steps": 5},
    ... ])
    >>> ray_saturn.plan(profile, ray_saturn.ClusterSpec.uniform(1, 2)).makespan_s
    5.0
"""

from ray_saturn.context import Incumbent, PlanningContext, RunningTask
from ray_saturn.errors import InfeasibleError, PlanError, ProfileError, SaturnError, SpecError
from ray_saturn.plan import Assignment, Plan, validate_plan
from ray_saturn.profile_table import Config, ProfileTable
from ray_saturn.runtime.api import emulate, resume, run, run_status
from ray_saturn.runtime.config import DriverConfig
from ray_saturn.runtime.local import init_ray
from ray_saturn.runtime.records import DriverResult
from ray_saturn.solver import policy_names
from ray_saturn.solver import solve as plan
from ray_saturn.spec import ClusterSpec, NodeSpec, Task

__version__ = "0.1.0"


def __getattr__(name: str):
    # `profile` imports torch (the profiler builds models); loaded on first use, so that planning,
    # simulating, emulating and the driver (none of which train) start without torch's ~2 s import.
    if name == "profile":
        from ray_saturn.profiler import profile

        return profile
    raise AttributeError(f"module 'ray_saturn' has no attribute {name!r}")

__all__ = [
    "Assignment",
    "ClusterSpec",
    "Config",
    "DriverConfig",
    "DriverResult",
    "Incumbent",
    "InfeasibleError",
    "NodeSpec",
    "Plan",
    "PlanError",
    "PlanningContext",
    "ProfileError",
    "ProfileTable",
    "RunningTask",
    "SaturnError",
    "SpecError",
    "Task",
    "emulate",
    "init_ray",
    "plan",
    "policy_names",
    "profile",
    "resume",
    "run",
    "run_status",
    "validate_plan",
]
