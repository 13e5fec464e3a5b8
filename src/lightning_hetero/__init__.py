"""lightning-hetero: PyTorch Lightning plugins for training on heterogeneous clusters.

The public names load on first use, so that the ``lightning-hetero`` command starts without importing Lightning.
``"async_ps"`` is registered in Lightning's ``StrategyRegistry`` as soon as both this package and Lightning are
imported, in either order (see ``_registration``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_hetero.__about__ import __version__
from lightning_hetero._lazy import lazy_attributes
from lightning_hetero._registration import register_now_or_after_lightning

if TYPE_CHECKING:
    from lightning_hetero.elastic import ElasticLocalSGDStrategy
    from lightning_hetero.emulation import ProgressReporter, SlowdownEmulator
    from lightning_hetero.hetero_batch import BatchSizeController, HeteroBatchCallback
    from lightning_hetero.measurement import ComputeTimer, ThroughputMeter
    from lightning_hetero.ps import AsyncPSStrategy
    from lightning_hetero.switching import (
        FixedFractionPolicy,
        GreedyPolicy,
        PhaseHyperparams,
        SchedulePolicy,
        StragglerDetector,
        SwitchPolicy,
        SyncSwitchCallback,
        search_bsp_fraction,
    )

_MODULES = {
    "AsyncPSStrategy": "lightning_hetero.ps",
    "BatchSizeController": "lightning_hetero.hetero_batch",
    "ComputeTimer": "lightning_hetero.measurement",
    "ElasticLocalSGDStrategy": "lightning_hetero.elastic",
    "FixedFractionPolicy": "lightning_hetero.switching",
    "GreedyPolicy": "lightning_hetero.switching",
    "HeteroBatchCallback": "lightning_hetero.hetero_batch",
    "PhaseHyperparams": "lightning_hetero.switching",
    "ProgressReporter": "lightning_hetero.emulation",
    "SchedulePolicy": "lightning_hetero.switching",
    "SlowdownEmulator": "lightning_hetero.emulation",
    "StragglerDetector": "lightning_hetero.switching",
    "SwitchPolicy": "lightning_hetero.switching",
    "SyncSwitchCallback": "lightning_hetero.switching",
    "ThroughputMeter": "lightning_hetero.measurement",
    "search_bsp_fraction": "lightning_hetero.switching",
}
__all__ = [
    "AsyncPSStrategy",
    "BatchSizeController",
    "ComputeTimer",
    "ElasticLocalSGDStrategy",
    "FixedFractionPolicy",
    "GreedyPolicy",
    "HeteroBatchCallback",
    "PhaseHyperparams",
    "ProgressReporter",
    "SchedulePolicy",
    "SlowdownEmulator",
    "StragglerDetector",
    "SwitchPolicy",
    "SyncSwitchCallback",
    "ThroughputMeter",
    "__version__",
    "search_bsp_fraction",
]

__getattr__ = lazy_attributes(__name__, _MODULES)


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULES})


register_now_or_after_lightning()
