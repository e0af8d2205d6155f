"""Every example in the package's docstrings runs and prints what it shows.

The README's test command runs ``tests/`` only, so two examples had gone stale
unseen (a state file without the fields the reader now checks; an options repr
without the fields added since). Each module's examples run here, as
``python -m doctest`` would run them.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import ray_saturn


def _modules() -> list[str]:
    names = [ray_saturn.__name__]
    for info in pkgutil.walk_packages(ray_saturn.__path__, prefix=f"{ray_saturn.__name__}."):
        if not info.name.endswith("__main__"):
            names.append(info.name)
    return sorted(names)


def _has_examples(name: str) -> bool:
    finder = doctest.DocTestFinder(exclude_empty=True)
    return any(t.examples for t in finder.find(importlib.import_module(name)))


MODULES = [m for m in _modules() if _has_examples(m)]


def test_the_package_has_docstring_examples():
    assert len(MODULES) >= 20, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (output above)"
