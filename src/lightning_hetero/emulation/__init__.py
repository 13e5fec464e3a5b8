"""Heterogeneity emulation: a Docker host companion (``lightning-hetero emulate``) and an in-process emulator.

The host companion's modules (``config``, ``presets``, ``schedule``, ``plan``, ``runner``, ``progress``) need
neither Lightning nor torch; the two callbacks below load on first use. The Docker SDK is imported only by
:mod:`lightning_hetero.emulation.docker_backend`, never from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_hetero._lazy import lazy_attributes

if TYPE_CHECKING:
    from lightning_hetero.emulation.reporter import ProgressReporter
    from lightning_hetero.emulation.slowdown import SlowdownEmulator

_MODULES = {
    "ProgressReporter": "lightning_hetero.emulation.reporter",
    "SlowdownEmulator": "lightning_hetero.emulation.slowdown",
}
__all__ = ["ProgressReporter", "SlowdownEmulator"]

__getattr__ = lazy_attributes(__name__, _MODULES)
