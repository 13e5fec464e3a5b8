"""lightning-hetero: PyTorch Lightning plugins for training on heterogeneous clusters.

The public names load on first use, so that the ``lightning-hetero`` command starts without importing Lightning.
``"async_ps"`` is registered in Lightning's ``StrategyRegistry`` as soon as both this package and Lightning are
imported, in either order (see ``_registration``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_hetero.__about__ import __version__ as __version__
from lightning_hetero._deprecation import warn_renamed
from lightning_hetero._lazy import lazy_attributes
from lightning_hetero._registration import register_now_or_after_lightning

if TYPE_CHECKING:
    from lightning_hetero.async_ps import AsyncPSStrategy
    from lightning_hetero.elastic import ElasticLocalSGDStrategy
    from lightning_hetero.emulation import ProgressReporter, SlowdownEmulator
    from lightning_hetero.hetero_batch import HeteroBatchCallback
    from lightning_hetero.switching import (
        FixedFractionPolicy,
        GreedyPolicy,
        PhaseHyperparams,
        SchedulePolicy,
        SwitchPolicy,
        SyncSwitchCallback,
        search_bsp_fraction,
    )

#: the user-facing classes and policies
_MODULES = {
    "AsyncPSStrategy": "lightning_hetero.async_ps",
    "ElasticLocalSGDStrategy": "lightning_hetero.elastic",
    "FixedFractionPolicy": "lightning_hetero.switching",
    "GreedyPolicy": "lightning_hetero.switching",
    "HeteroBatchCallback": "lightning_hetero.hetero_batch",
    "PhaseHyperparams": "lightning_hetero.switching",
    "ProgressReporter": "lightning_hetero.emulation",
    "SchedulePolicy": "lightning_hetero.switching",
    "SlowdownEmulator": "lightning_hetero.emulation",
    "SwitchPolicy": "lightning_hetero.switching",
    "SyncSwitchCallback": "lightning_hetero.switching",
    "search_bsp_fraction": "lightning_hetero.switching",
}
#: internals once exported here, served from their modules with a DeprecationWarning for one release
_MOVED = {
    "BatchSizeController": "lightning_hetero.hetero_batch",
    "ComputeTimer": "lightning_hetero.measurement",
    "StragglerDetector": "lightning_hetero.switching",
    "ThroughputMeter": "lightning_hetero.measurement",
}
__all__ = [
    "AsyncPSStrategy",
    "ElasticLocalSGDStrategy",
    "FixedFractionPolicy",
    "GreedyPolicy",
    "HeteroBatchCallback",
    "PhaseHyperparams",
    "ProgressReporter",
    "SchedulePolicy",
    "SlowdownEmulator",
    "SwitchPolicy",
    "SyncSwitchCallback",
    "search_bsp_fraction",
]

_public = lazy_attributes(__name__, _MODULES)


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        value = getattr(importlib.import_module(_MOVED[name]), name)
        warn_renamed(f"lightning_hetero.{name}", f"{_MOVED[name]}.{name}")
        return value
    return _public(name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULES})


register_now_or_after_lightning()
