"""Small real workloads shipped with ray_saturn (no downloads): the demo's, the examples' and the tests'.

- :mod:`~ray_saturn.workloads.text`: tiny GPT-style character models on a
  public-domain corpus shipped in the package.
- :mod:`~ray_saturn.workloads.vision`: small CNNs on generated images.
- :mod:`~ray_saturn.workloads.regression`: MLPs on a generated regression
  problem (for Tune trials built from a config).

Every factory is a module-level function bound with ``functools.partial``, so
tasks pickle by reference into Ray workers and spawned processes.
"""
