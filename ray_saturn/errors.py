"""Errors raised by ray_saturn.

Every error message is one line that says what is wrong and how to fix it.
All of them derive from :class:`SaturnError`, so callers (and the CLI) can
catch one type; they are also ``ValueError`` subclasses where the cause is
bad input.
"""

from __future__ import annotations


class SaturnError(Exception):
    """Base class of every error ray_saturn raises on purpose."""


class SpecError(SaturnError, ValueError):
    """A task or cluster description is invalid."""


class ProfileError(SaturnError, ValueError):
    """A profile table is malformed (missing column, bad value, duplicate row)."""


class PlanError(SaturnError, ValueError):
    """A plan is invalid for the profile and cluster it is checked against."""


class InfeasibleError(SaturnError, ValueError):
    """No plan exists: a task has no configuration that fits the cluster."""
