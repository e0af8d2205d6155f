"""The runtime on Ray: driver state machine, placement-group manager, launchers, run folder.

Public entry points are re-exported from :mod:`ray_saturn` (``run``,
``resume``, ``emulate``); this package holds the parts.
"""
