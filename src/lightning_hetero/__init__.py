"""lightning-hetero: PyTorch Lightning plugins for training on heterogeneous clusters."""

from lightning_hetero.__about__ import __version__
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

__all__ = [
    "AsyncPSStrategy",
    "BatchSizeController",
    "ComputeTimer",
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
