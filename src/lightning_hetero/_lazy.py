"""Public names loaded on first use, so that importing a package (and the ``lightning-hetero`` command) does not
import Lightning or torch until a name that needs them is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(module: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` importing each name of ``modules`` (``name: module path``) when first asked for.

    Example::

        >>> __getattr__ = lazy_attributes("pkg", {"OrderedDict": "collections"})
        >>> __getattr__("OrderedDict").__name__
        'OrderedDict'
        >>> __getattr__("Missing")
        Traceback (most recent call last):
        ...
        AttributeError: module 'pkg' has no attribute 'Missing'
    """

    def __getattr__(name: str) -> Any:
        if name not in modules:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return getattr(importlib.import_module(modules[name]), name)

    return __getattr__
