"""lightning-hetero: PyTorch Lightning plugins for training on heterogeneous clusters."""

from lightning_hetero.__about__ import __version__
from lightning_hetero.emulation import ProgressReporter, SlowdownEmulator
from lightning_hetero.hetero_batch import BatchSizeController, HeteroBatchCallback
from lightning_hetero.measurement import ComputeTimer, ThroughputMeter

__all__ = [
    "BatchSizeController",
    "ComputeTimer",
    "HeteroBatchCallback",
    "ProgressReporter",
    "SlowdownEmulator",
    "ThroughputMeter",
    "__version__",
]
