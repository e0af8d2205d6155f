"""Built-in policies: ``saturn`` (the default) and the baselines beside it."""

from ray_saturn.solver.policies import fifo, optimus, random_order, saturn  # noqa: F401
