"""One rank's measured steps in an adjustment period, and the synchronous step's wall times since a split came in.

Pure bookkeeping between HeteroBatch's per-step hook and its adjustment: which steps count (not the warm-up, not
the first step at a new split, which pays for it in allocator and caches), what the cost model is fed, the rank's
mean busy time at its current size, and the synchronous step's wall times kept across periods while the split
stays (up to 32 steps: a change lands a step or two into a period, so one period can be too few steps to judge it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: how many of the synchronous step's wall times are kept for one split
SYNC_STEPS_KEPT = 32


class MeasuredPeriod:
    """Steps recorded by :meth:`record`, handed over and cleared by :meth:`close`.

    Example::

        >>> period = MeasuredPeriod(skip=1)
        >>> for busy in (0.9, 0.030, 0.032):
        ...     period.record((48, 16), 0, busy_s=busy, floor_s=0.0, wall_s=busy + 0.001)
        >>> steps, busy, walls = period.close((48, 16), 0)
        >>> steps, round(busy, 3), walls, period.sync_walls
        ([(48, 0.03, 0.0), (48, 0.032, 0.0)], 0.031, [0.031, 0.033], [0.031, 0.033])
    """

    def __init__(self, skip: int = 0) -> None:
        self.to_skip = skip
        self._steps: list[tuple[tuple[int, ...], int, float, float, float]] = []
        self._sync: tuple[tuple[int, ...] | None, list[float]] = (None, [])

    def record(self, split: tuple[int, ...], rank: int, busy_s: float, floor_s: float, wall_s: float) -> None:
        """One finished step taken at ``split``: its busy seconds, CPU-at-quota floor and wall seconds."""
        if self.to_skip > 0:
            self.to_skip -= 1
        else:
            self._steps.append((split, split[rank], busy_s, floor_s, wall_s))

    def skip_next(self) -> None:
        """Do not count the next step (the first at a new split)."""
        self.to_skip = max(self.to_skip, 1)

    def close(self, current: Sequence[int], rank: int) -> tuple[list[tuple[int, float, float]], float, list[float]]:
        """End the period: ``(size, busy_s, floor_s)`` of every step for the cost model, this rank's mean busy time at
        its size in ``current`` (raised to the mean floor; NaN if none), and the period's synchronous-step walls."""
        current = tuple(current)
        for_model = [(size, busy, floor) for _, size, busy, floor, _ in self._steps]
        at_current = [(size, busy, floor, wall) for split, size, busy, floor, wall in self._steps if split == current]
        self._steps = []
        mine = [(busy, floor) for size, busy, floor, _ in at_current if size == current[rank]]
        busy_s = max(sum(b for b, _ in mine), sum(f for _, f in mine)) / len(mine) if mine else math.nan
        walls = [wall for *_, wall in at_current]
        if self._sync[0] != current:
            self._sync = (current, [])
        self._sync[1][:] = (self._sync[1] + walls)[-SYNC_STEPS_KEPT:]
        return for_model, busy_s, walls

    @property
    def sync_walls(self) -> list[float]:
        """The synchronous step's wall times since the current split came into force (at most 32)."""
        return list(self._sync[1])

    def restart_sync(self, current: Sequence[int], walls: list[float]) -> None:
        """Keep only ``walls`` (the newest period's) for ``current``: some rank's speed changed."""
        self._sync = (tuple(current), list(walls))
