"""The explicit registry of strategies, by name.

Built-ins are listed here. Third parties add theirs through the Python
entry-point group ``ray_saturn.strategies`` (the entry point names a
:class:`~ray_saturn.strategies.base.Strategy` subclass) or by calling
:func:`register`. Nothing is ever unpickled from disk.

Example:
    >>> from ray_saturn.strategies import get_strategy, strategy_names
    >>> strategy_names()[:3]
    ['ddp', 'ddp-compressed', 'fsdp']
    >>> get_strategy("fsdp").name
    'fsdp'
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points

from ray_saturn.spec import canonical_strategy
from ray_saturn.strategies.base import Strategy, StrategyError

__all__ = ["ENTRY_POINT_GROUP", "get_strategy", "register", "strategy_names"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "ray_saturn.strategies"

#: name -> "module:Class" of the built-in strategies.
_BUILTINS = {
    "single": "ray_saturn.strategies.single:Single",
    "ddp": "ray_saturn.strategies.ddp:DDP",
    "ddp-compressed": "ray_saturn.strategies.ddp_compressed:DDPCompressed",
    "fsdp": "ray_saturn.strategies.fsdp:FSDP",
    "pipeline": "ray_saturn.strategies.pipeline:Pipeline",
    "spill": "ray_saturn.strategies.spill:Spill",
    "zero": "ray_saturn.strategies.zero:Zero",
}

_registry: dict[str, Strategy] = {}
_entry_points_loaded = False


def register(strategy: type[Strategy] | Strategy, *, replace: bool = False) -> Strategy:
    """Add a strategy (class or instance) under its ``name``; returns the instance."""
    inst = strategy() if isinstance(strategy, type) else strategy
    if not isinstance(inst, Strategy):
        raise StrategyError(f"{strategy!r} is not a ray_saturn Strategy subclass")
    name = getattr(inst, "name", None)
    if not isinstance(name, str) or not name:
        raise StrategyError(
            f"strategy {type(inst).__name__} has no name; set the class attribute name = '...'"
        )
    if name != canonical_strategy(name):
        raise StrategyError(
            f"strategy {type(inst).__name__} is named {name!r}; strategy names are matched case-insensitively, "
            f"so name it in lower case: name = {canonical_strategy(name)!r}"
        )
    if name in _registry and not replace and type(_registry[name]) is not type(inst):
        raise StrategyError(
            f"strategy name {name!r} is already registered by {type(_registry[name]).__name__}"
        )
    _registry[name] = inst
    return inst


def _load_builtins() -> None:
    for name, target in _BUILTINS.items():
        if name not in _registry:
            mod, cls = target.split(":")
            register(getattr(importlib.import_module(mod), cls))


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            inst = register(obj)
        except Exception as exc:
            log.warning(
                "strategy entry point %s = %s could not be loaded: %s", ep.name, ep.value, exc
            )
            continue
        if inst.name != ep.name:
            log.warning("strategy entry point %s registers a strategy named %r", ep.name, inst.name)


def strategy_names() -> list[str]:
    """Registered strategy names, sorted."""
    _load_builtins()
    _load_entry_points()
    return sorted(_registry)


def get_strategy(name: str) -> Strategy:
    """The registered strategy called ``name`` (any case); an unknown name lists the registered ones."""
    name = canonical_strategy(name)  # type: ignore[assignment]
    _load_builtins()
    if name not in _registry:
        _load_entry_points()
    try:
        return _registry[name]
    except KeyError:
        raise StrategyError(
            f"strategy {name!r} is not registered (registered: {', '.join(strategy_names())}); "
            f"install its package or add it to the entry-point group {ENTRY_POINT_GROUP!r}"
        ) from None
