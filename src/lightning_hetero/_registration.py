"""Registers ``"async_ps"`` in Lightning's ``StrategyRegistry`` whatever the order of the user's imports.

``import lightning_hetero`` does not import Lightning (so that the ``lightning-hetero`` command starts fast). Where
Lightning is already imported, the strategy is registered at once; otherwise a one-shot import hook registers it
as soon as ``lightning`` has finished importing, so ``import lightning_hetero`` before ``import lightning`` works
too. Nothing is registered, and Lightning is not imported, if the program never imports Lightning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

_TRIGGER = "lightning"
NAME, DESCRIPTION = "async_ps", "Asynchronous parameter-server training (lightning-hetero)"


def new_async_ps(**kwargs: Any) -> Any:
    """``"async_ps"`` in the registry until the strategy's module is imported, which puts its class there. Importing
    that module when Lightning finishes importing would cycle whenever one of the strategy's own modules is the one
    importing Lightning: it is half-initialised then."""
    return importlib.import_module("lightning_hetero.async_ps.strategy").AsyncPSStrategy(**kwargs)


def register_async_ps() -> None:
    """Puts :func:`new_async_ps` in Lightning's ``StrategyRegistry`` as ``"async_ps"``, unless it is there."""
    from lightning.pytorch.strategies import StrategyRegistry

    if NAME not in StrategyRegistry:
        StrategyRegistry.register(NAME, new_async_ps, description=DESCRIPTION)


class _RegisterAfterLightning(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader that imports ``lightning`` so that registration follows it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != _TRIGGER:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _ThenRegister(spec.loader)
                return spec
        return None


class _ThenRegister(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        register_async_ps()


def register_now_or_after_lightning() -> None:
    """Registers at once if Lightning is imported, else installs the one-shot hook (at most once)."""
    if _TRIGGER in sys.modules:
        register_async_ps()
    elif not any(isinstance(finder, _RegisterAfterLightning) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterLightning())
