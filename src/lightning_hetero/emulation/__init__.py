"""Heterogeneity emulation: a Docker host companion (``lightning-hetero emulate``) and an in-process emulator.

The Docker SDK is imported only by :mod:`lightning_hetero.emulation.docker_backend`, never from here.
"""

from lightning_hetero.emulation.progress import ProgressReporter
from lightning_hetero.emulation.slowdown import SlowdownEmulator

__all__ = ["ProgressReporter", "SlowdownEmulator"]
