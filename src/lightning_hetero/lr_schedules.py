"""Step-interval learning-rate schedulers stepped by a count other than the rank's own optimizer steps.

Lightning steps a scheduler with ``interval="step"`` after each of a rank's own optimizer steps. In ASP the ranks make
different numbers of steps, so that count drifts from the model's: ``AsyncPSStrategy`` counts parameter-server updates
instead, and ``SyncSwitchCallback`` a fixed number of reference steps per epoch. :class:`CountedLRSchedulers` takes such
schedulers away from Lightning's loop and steps them by the owner's count (every ``frequency``-th). Pure bookkeeping
over Lightning's scheduler configs: no threads, no torch.distributed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lightning_hetero._lightning_internals import (
    lr_scheduler_paused,
    pause_lr_scheduler,
    resume_lr_scheduler,
)


class CountedLRSchedulers:
    """Holds the step-interval schedulers taken over from Lightning's loop and steps them by an external count.

    ``ReduceLROnPlateau`` (it needs a metric) and epoch-interval schedulers stay with Lightning. A config that
    Lightning's loop already no longer steps belongs to another owner and is left alone (``SyncSwitchCallback``
    takes its schedulers before ``AsyncPSStrategy`` looks).

    Example::

        >>> from types import SimpleNamespace
        >>> import torch
        >>> optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        >>> scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        >>> config = SimpleNamespace(scheduler=scheduler, interval="step", frequency=1, reduce_on_plateau=False)
        >>> schedulers = CountedLRSchedulers()
        >>> schedulers.take_over([config])
        >>> lr_scheduler_paused(config)  # Lightning's loop no longer steps it
        True
        >>> optimizer.step()
        >>> for count in range(1, 5):  # four counted steps (e.g. server updates): two StepLR periods
        ...     schedulers.step_at(count)
        >>> optimizer.param_groups[0]["lr"]
        0.25
        >>> schedulers.release()
        >>> config.frequency
        1
    """

    def __init__(self) -> None:
        self._taken: list[tuple[Any, int]] = []

    @property
    def active(self) -> bool:
        """Whether any scheduler is taken now."""
        return bool(self._taken)

    def take_over(self, configs: Iterable[Any]) -> None:
        """Take the step-interval schedulers of ``configs`` (Lightning's ``LRSchedulerConfig``) from Lightning's loop.

        Idempotent: a config already taken (by this or another owner) is skipped.

        Args:
            configs: the trainer's ``lr_scheduler_configs``.
        """
        for config in configs:
            if config.interval == "step" and not config.reduce_on_plateau and not lr_scheduler_paused(config):
                self._taken.append((config, pause_lr_scheduler(config)))

    def release(self) -> None:
        """Give the schedulers back to Lightning's loop with their own frequencies."""
        for config, frequency in self._taken:
            resume_lr_scheduler(config, frequency)
        self._taken = []

    def step_at(self, count: int) -> None:
        """Count one step: step every scheduler whose frequency divides ``count``.

        Args:
            count: the steps counted so far, this one included (for example the server's new version).
        """
        for config, frequency in self._taken:
            if count % frequency == 0:
                config.scheduler.step()
