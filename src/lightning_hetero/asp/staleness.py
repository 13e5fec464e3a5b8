"""Staleness bookkeeping for asynchronous updates: statistics, the stale-synchronous gate, learning-rate scaling.

An update's *staleness* is how many versions the server's parameters moved between the worker's pull and the
moment its gradient is applied (``version_now - version_pulled``). Pure logic: no threads, no torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightning_hetero._validation import check_range

LR_SCALING_RULES = ("none", "inverse")


@dataclass
class StalenessTracker:
    """Counts applied updates per worker and summarises their staleness and the stale-synchronous clock leads.

    Example::

        >>> tracker = StalenessTracker()
        >>> for worker, staleness in [(0, 0), (1, 1), (0, 2)]:
        ...     tracker.record(worker, staleness)
        >>> tracker.record_lead(1)
        >>> tracker.summary()
        {'updates': 3, 'staleness_mean': 1.0, 'staleness_max': 2, 'lead_max': 1, 'updates_per_worker': {0: 2, 1: 1}}
    """

    updates: int = 0
    staleness_sum: int = 0
    staleness_max: int = 0
    lead_max: int = 0
    updates_per_worker: dict[int, int] = field(default_factory=dict)

    def record(self, worker: int, staleness: int) -> None:
        """Account one applied update.

        Args:
            worker: the global rank that pushed it.
            staleness: versions between its pull and its application (>= 0).
        """
        self.updates += 1
        self.staleness_sum += staleness
        self.staleness_max = max(self.staleness_max, staleness)
        self.updates_per_worker[worker] = self.updates_per_worker.get(worker, 0) + 1

    def record_lead(self, lead: int) -> None:
        """Account the clock lead a worker was released with (see :meth:`StalenessGate.lead`).

        Args:
            lead: its updates ahead of the slowest active worker when it went on to its next step.
        """
        self.lead_max = max(self.lead_max, lead)

    def summary(self) -> dict[str, Any]:
        mean = self.staleness_sum / self.updates if self.updates else 0.0
        return {
            "updates": self.updates,
            "staleness_mean": mean,
            "staleness_max": self.staleness_max,
            "lead_max": self.lead_max,
            "updates_per_worker": dict(sorted(self.updates_per_worker.items())),
        }


class StalenessGate:
    """Stale-synchronous parallel (SSP) clocks: a worker more than ``max_staleness`` updates ahead of the slowest
    *active* worker must wait.

    A worker is active from the start of its epoch (``join``, or its first push) until its last push of the epoch
    (``finish``); a worker between epochs or done does not hold others back. A worker that (re)joins starts level
    with the slowest active worker, so a lead or lag does not carry over from one epoch to the next. The slowest active worker never waits, so the gate cannot
    deadlock. With ``N`` workers each update's version staleness is at most ``(max_staleness + 1) * (N - 1)``.

    Args:
        max_staleness: the allowed clock lead; ``None`` disables the gate (pure ASP).

    Example::

        >>> gate = StalenessGate(max_staleness=1)
        >>> gate.tick(0)
        >>> gate.tick(1)  # joins level with worker 0, then counts its update
        >>> gate.clocks
        {0: 1, 1: 2}
        >>> gate.tick(1)
        >>> gate.lead(1), gate.may_proceed(1), gate.may_proceed(0)  # worker 1 is 2 ahead; the slowest never waits
        (2, False, True)
        >>> gate.finish(0)  # worker 0 ended its epoch: nobody to wait for
        >>> gate.may_proceed(1)
        True
    """

    def __init__(self, max_staleness: int | None = None) -> None:
        check_range("max_staleness", max_staleness, low=0, integer=True, optional=True)
        self.max_staleness = max_staleness
        self._clocks: dict[int, int] = {}

    @property
    def clocks(self) -> dict[int, int]:
        """Active workers' clocks (copies)."""
        return dict(self._clocks)

    def join(self, worker: int) -> None:
        """Activate ``worker`` (it starts computing on fresh parameters) level with the slowest active worker.

        Args:
            worker: the worker's global rank.
        """
        if worker not in self._clocks:
            self._clocks[worker] = min(self._clocks.values(), default=0)

    def tick(self, worker: int) -> None:
        """Count one update of ``worker``, activating it first if it was idle.

        Args:
            worker: the pushing worker's global rank.
        """
        self.join(worker)
        self._clocks[worker] += 1

    def finish(self, worker: int) -> None:
        """Mark ``worker`` idle (its epoch's data is done, or it stopped).

        Args:
            worker: the worker's global rank.
        """
        self._clocks.pop(worker, None)

    def lead(self, worker: int) -> int:
        """How many updates ``worker`` is ahead of the slowest active worker (0 when it is idle).

        Args:
            worker: the worker's global rank.
        """
        if worker not in self._clocks:
            return 0
        return self._clocks[worker] - min(self._clocks.values())

    def may_proceed(self, worker: int) -> bool:
        """Whether ``worker`` may start its next step now.

        Args:
            worker: the worker's global rank.
        """
        return self.max_staleness is None or self.lead(worker) <= self.max_staleness


def staleness_lr_factor(staleness: int, rule: str = "none") -> float:
    """The learning-rate multiplier for an update of the given staleness.

    ``"inverse"`` divides the learning rate by the staleness (at least 1), as in staleness-aware asynchronous SGD
    (Zhang et al., IJCAI 2016); ``"none"`` keeps it.

    Args:
        staleness: versions between the worker's pull and the update's application.
        rule: one of ``"none"``, ``"inverse"``.

    Example::

        >>> staleness_lr_factor(0, "inverse"), staleness_lr_factor(4, "inverse"), staleness_lr_factor(4)
        (1.0, 0.25, 1.0)
    """
    if rule == "none":
        return 1.0
    if rule == "inverse":
        return 1.0 / max(1, staleness)
    raise ValueError(f"lr_scaling must be one of {LR_SCALING_RULES}, got {rule!r}")
