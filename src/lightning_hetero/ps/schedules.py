"""Step-interval learning-rate schedulers counted in parameter-server updates while training asynchronously.

Lightning steps a scheduler with ``interval="step"`` after each of a rank's own optimizer steps. In ASP the ranks make
different numbers of steps and the model's updates happen on the parameter server, so each rank's count would drift
from the model's. :class:`ServerStepSchedules` takes such schedulers away from Lightning's loop and steps them once per
server update instead (every ``frequency`` updates). Pure bookkeeping over Lightning's scheduler configs: no threads,
no torch.distributed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

# A frequency Lightning's batch counter never reaches: a config with it is never stepped by the loop.
NEVER = sys.maxsize


class ServerStepSchedules:
    """Holds the step-interval schedulers taken over from Lightning and steps them by server version.

    ``ReduceLROnPlateau`` (it needs a metric) and epoch-interval schedulers stay with Lightning. A config whose
    frequency is already :data:`NEVER` is stepped by someone else (``SyncSwitchCallback`` steps schedules by a fixed
    count per epoch) and is left alone.

    Example::

        >>> from types import SimpleNamespace
        >>> import torch
        >>> optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        >>> scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        >>> config = SimpleNamespace(scheduler=scheduler, interval="step", frequency=1, reduce_on_plateau=False)
        >>> schedules = ServerStepSchedules()
        >>> schedules.take_over([config])
        >>> config.frequency == NEVER  # Lightning's loop no longer steps it
        True
        >>> optimizer.step()
        >>> for version in range(1, 5):  # four server updates: two StepLR periods
        ...     schedules.after_update(version)
        >>> optimizer.param_groups[0]["lr"]
        0.25
        >>> schedules.release()
        >>> config.frequency
        1
    """

    def __init__(self) -> None:
        self._taken: list[tuple[Any, int]] = []

    @property
    def active(self) -> bool:
        """Whether any scheduler is stepped by server updates now."""
        return bool(self._taken)

    def take_over(self, configs: Iterable[Any]) -> None:
        """Take the step-interval schedulers of ``configs`` (Lightning's ``LRSchedulerConfig``) from Lightning's loop.

        Idempotent: a config already taken (by this or another owner) is skipped.

        Args:
            configs: the trainer's ``lr_scheduler_configs``.
        """
        for config in configs:
            if config.interval == "step" and not config.reduce_on_plateau and config.frequency < NEVER:
                self._taken.append((config, config.frequency))
                config.frequency = NEVER

    def release(self) -> None:
        """Give the schedulers back to Lightning's loop with their own frequencies."""
        for config, frequency in self._taken:
            config.frequency = frequency
        self._taken = []

    def after_update(self, version: int) -> None:
        """Step every scheduler whose frequency divides the server's new ``version``.

        Args:
            version: the number of updates applied so far, this one included.
        """
        for config, frequency in self._taken:
            if version % frequency == 0:
                config.scheduler.step()
