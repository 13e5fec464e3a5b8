"""The one place where lightning-hetero touches Lightning's private names and attributes.

Every other module reaches Lightning through its public API or through a small named function here. Each function
says which Lightning versions it was checked against, and ``tests/test_lightning_internals.py`` has a test per
function that fails loudly when Lightning changes the thing it relies on, so a Lightning upgrade breaks one test
with a clear name instead of silently turning a feature off.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

# --- trainer, loops and data (used by hetero_batch/ and lr_schedules.py) ---
#
# Checked against Lightning 2.6.6 (pyproject allows lightning>=2.2).

#: An ``LRSchedulerConfig.frequency`` that Lightning's training loop never reaches: a config with it is never stepped
#: by the loop (see :func:`pause_lr_scheduler`).
NEVER_STEPPED = sys.maxsize


def pause_lr_scheduler(config: Any) -> int:
    """Stop Lightning's training loop from stepping the scheduler of ``config`` (an ``LRSchedulerConfig``); return
    the frequency to give back to :func:`resume_lr_scheduler`.

    Lightning has no public way for a callback or strategy to take a step-interval scheduler away from its loop.
    ``frequency`` is a public field of the config, but what this relies on is private: checked against Lightning
    2.6.6, ``TrainingEpochLoop._update_learning_rates`` steps a config when ``(batch_idx + 1) % frequency == 0``, so a
    frequency of :data:`NEVER_STEPPED` is never due.

    Example::

        >>> from types import SimpleNamespace
        >>> config = SimpleNamespace(frequency=3)
        >>> pause_lr_scheduler(config), lr_scheduler_paused(config)
        (3, True)
        >>> resume_lr_scheduler(config, 3)
        >>> config.frequency, lr_scheduler_paused(config)
        (3, False)
    """
    frequency = int(config.frequency)
    config.frequency = NEVER_STEPPED
    return frequency


def resume_lr_scheduler(config: Any, frequency: int) -> None:
    """Give a scheduler paused by :func:`pause_lr_scheduler` back to Lightning's loop with its own ``frequency``."""
    config.frequency = frequency


def lr_scheduler_paused(config: Any) -> bool:
    """Whether ``config`` is paused (by this package, possibly by another owner); see :func:`pause_lr_scheduler`."""
    return config.frequency >= NEVER_STEPPED


class _RebuiltDataSource:
    """Stands in for the fit loop's train-dataloader source and passes what it returns through ``rebuild``."""

    def __init__(self, source: Any, rebuild: Callable[[Any], Any]) -> None:
        self.source = source
        self.rebuild = rebuild

    def dataloader(self) -> Any:
        return self.rebuild(self.source.dataloader())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


def rebuild_train_dataloader(trainer: Any, rebuild: Callable[[Any], Any]) -> None:
    """Make ``trainer``'s fit loop pass the user's train loader through ``rebuild`` each time it requests it, before
    Lightning processes it (injects a ``DistributedSampler``, wraps it in a ``CombinedLoader``). Idempotent: a second
    call replaces the first ``rebuild``.

    Lightning has no public hook between "the user's train loader exists" and "Lightning injects a sampler into it".
    Checked against Lightning 2.6.6: ``_FitLoop.setup_data`` requests the loader from ``fit_loop._data_source`` (a
    ``_DataLoaderSource``) through its ``dataloader()`` method, and reads nothing else from it that this stand-in
    does not forward.

    Raises:
        RuntimeError: when the fit loop has no ``_data_source`` (a Lightning version this was not checked against).
    """
    fit_loop = trainer.fit_loop
    if not hasattr(fit_loop, "_data_source"):
        raise RuntimeError(
            "lightning-hetero could not find the train data source on this Lightning version's fit loop "
            "(checked against Lightning 2.6.6); please report your Lightning version"
        )
    source = fit_loop._data_source
    if isinstance(source, _RebuiltDataSource):
        source = source.source
    fit_loop._data_source = _RebuiltDataSource(source, rebuild)


# --- strategies, launchers and module state (used by ps/) ---
