"""Transient-straggler detection on one rank's throughput measurements.

Sync-Switch injected its stragglers by hand and never published a detector; this one is deliberately simple. A rank
compares its own throughput (samples per second of compute, as measured by
:class:`~lightning_hetero.measurement.ThroughputMeter`) with its own baseline, so ranks of different speeds need no
common yardstick: a slow-but-steady machine is not a straggler, a machine that suddenly slows down is.
"""

from __future__ import annotations

import math
from typing import Any

from lightning_hetero._validation import check_range


class StragglerDetector:
    """Flags a rank as straggling after ``k`` consecutive measurements below ``threshold`` times its baseline, and as
    recovered after ``k`` consecutive measurements at or above it.

    The baseline is the mean of the first ``baseline_measurements`` measurements. It is not updated afterwards, so a
    slowdown that sets in gradually is still caught; call :meth:`reset` when a rank's hardware is known to have
    changed for good.

    Args:
        threshold: a measurement below ``threshold * baseline`` counts as slow, in (0, 1).
        k: consecutive slow (or, when straggling, healthy) measurements needed to change the verdict, >= 1.
        baseline_measurements: measurements averaged into the baseline, >= 1.

    Example::

        >>> detector = StragglerDetector(threshold=0.5, k=2, baseline_measurements=2)
        >>> [detector.update(x) for x in [100, 100, 40, 90, 40, 40, 100, 100]]
        [False, False, False, False, False, True, True, False]
        >>> detector.baseline
        100.0
    """

    def __init__(self, threshold: float = 0.7, k: int = 3, baseline_measurements: int = 5) -> None:
        check_range("threshold", threshold, low=0, high=1, low_open=True, high_open=True)
        check_range("k", k, low=1, integer=True)
        check_range("baseline_measurements", baseline_measurements, low=1, integer=True)
        self.threshold = threshold
        self.k = k
        self.baseline_measurements = baseline_measurements
        self.reset()

    def reset(self) -> None:
        """Forget the baseline and the verdict."""
        self.baseline: float | None = None
        self.straggling = False
        self._baseline_sum = 0.0
        self._baseline_count = 0
        self._streak = 0

    def update(self, throughput: float) -> bool:
        """Add one throughput measurement; return whether the rank is straggling. Non-finite or non-positive
        measurements are ignored."""
        if not math.isfinite(throughput) or throughput <= 0:
            return self.straggling
        if self.baseline is None:
            self._baseline_sum += throughput
            self._baseline_count += 1
            if self._baseline_count == self.baseline_measurements:
                self.baseline = self._baseline_sum / self._baseline_count
            return self.straggling
        slow = throughput < self.threshold * self.baseline
        # A measurement that agrees with the current verdict breaks any streak towards the other one.
        self._streak = self._streak + 1 if slow != self.straggling else 0
        if self._streak >= self.k:
            self.straggling = slow
            self._streak = 0
        return self.straggling

    def state_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "straggling": self.straggling,
            "baseline_sum": self._baseline_sum,
            "baseline_count": self._baseline_count,
            "streak": self._streak,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline = state["baseline"]
        self.straggling = state["straggling"]
        self._baseline_sum = state["baseline_sum"]
        self._baseline_count = state["baseline_count"]
        self._streak = state["streak"]
