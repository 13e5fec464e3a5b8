"""One module per study, named as its scenario: ``add_arguments``, ``main`` and, with a headline figure, ``grid_axes``
and ``figures``.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

#: modules here that are helpers of a study, not studies
HELPERS = {"local_sgd_breakdown"}


def names() -> list[str]:
    """Every scenario's name."""
    found = (m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]))
    return sorted(name for name in found if name not in HELPERS and not name.startswith("_"))


def load(name: str) -> ModuleType:
    """The scenario module ``name``; ``KeyError`` naming the known ones if there is none."""
    if name not in names():
        raise KeyError(f"no scenario {name!r}; known: {', '.join(names())}")
    return importlib.import_module(f"benchmarks.scenarios.{name}")
