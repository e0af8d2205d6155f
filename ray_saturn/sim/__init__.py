"""Discrete-event simulation: the control plane's policies on a simulated clock, no Ray.

Example:
    >>> from ray_saturn import ClusterSpec, ProfileTable
    >>> prof = ProfileTable.from_rows([
    ...     {"task": "a", "strategy": "ddp", "gpus": 1, "step_time_s": 1.0, "steps": 10},
    ... ])
    >>> results = compare(prof, ClusterSpec.uniform(1, 1), ["saturn-static", "fifo-min-gpus"])
    >>> sorted(results), results["saturn-static"].makespan_s
    (['fifo-min-gpus', 'saturn-static'], 10.0)
"""

from ray_saturn.sim.simulator import (
    SimConfig,
    SimResult,
    SimulationError,
    TaskRecord,
    compare,
    oracle_completion_bound,
    oracle_lower_bound,
    realised_plan,
    simulate,
)
from ray_saturn.sim.workload import (
    NodeFailure,
    parse_arrivals,
    parse_failures,
    random_failures,
    true_step_times,
)

__all__ = [
    "NodeFailure",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "TaskRecord",
    "compare",
    "oracle_completion_bound",
    "oracle_lower_bound",
    "parse_arrivals",
    "parse_failures",
    "random_failures",
    "realised_plan",
    "simulate",
    "true_step_times",
]
