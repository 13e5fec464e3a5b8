"""The checks behind ``HeteroBatchCallback(...)``: a bad setting fails at construction, naming it; what the callback
cannot run with fails at setup, before the first batch (:func:`check_trainer`)."""

from __future__ import annotations

from collections.abc import Sequence

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy

from lightning_hetero._validation import check_range
from lightning_hetero.contracts import HeteroBatchStrategy
from lightning_hetero.hetero_batch.lr_scaling import LR_SCALING_RULES


def check_settings(
    *,
    global_batch_size: int | None,
    initial_batch_sizes: Sequence[int] | None,
    min_batch_size: int | Sequence[int],
    max_batch_size: int | Sequence[int] | None,
    deadband: float,
    smoothing: float,
    adjust_every_n_steps: int | None,
    batch_lr_scaling: str | None,
    rollback_tolerance: float,
    change_tolerance: float,
) -> None:
    """Raise ``ValueError`` naming the first bad setting.

    Example::

        >>> good = dict(global_batch_size=64, initial_batch_sizes=None, min_batch_size=1, max_batch_size=None,
        ...             deadband=0.05, smoothing=0.5, adjust_every_n_steps=None, batch_lr_scaling=None,
        ...             rollback_tolerance=0.15, change_tolerance=0.4)
        >>> check_settings(**good)
        >>> check_settings(**good | {"min_batch_size": 8, "max_batch_size": 4})
        Traceback (most recent call last):
        ...
        ValueError: min_batch_size (8) must not exceed max_batch_size (4)
    """
    for name, value in (("min_batch_size", min_batch_size), ("max_batch_size", max_batch_size)):
        for v in [value] if isinstance(value, int) else list(value or []):
            check_range(name, v, low=1, integer=True)
    if isinstance(min_batch_size, int) and isinstance(max_batch_size, int) and min_batch_size > max_batch_size:
        raise ValueError(f"min_batch_size ({min_batch_size}) must not exceed max_batch_size ({max_batch_size})")
    check_range("global_batch_size", global_batch_size, low=1, integer=True, optional=True)
    for size in initial_batch_sizes or []:
        check_range("initial_batch_sizes", size, low=1, integer=True)
    check_range("adjust_every_n_steps", adjust_every_n_steps, low=1, integer=True, optional=True)
    check_range("deadband", deadband, low=0)
    check_range("smoothing", smoothing, low=0, high=1, low_open=True)
    if batch_lr_scaling is not None and batch_lr_scaling not in LR_SCALING_RULES:
        raise ValueError(f"batch_lr_scaling must be one of {LR_SCALING_RULES} or None, got {batch_lr_scaling!r}")
    check_range("rollback_tolerance", rollback_tolerance, low=0)
    check_range("change_tolerance", change_tolerance, low=0, low_open=True)


def check_trainer(trainer: pl.Trainer, module: pl.LightningModule) -> None:
    """Fail at setup, naming the setting, the reason and the alternative, for manual optimization and for a strategy
    that neither is DDP nor offers :class:`~lightning_hetero.contracts.HeteroBatchStrategy`.

    Args:
        trainer: the Trainer.
        module: the LightningModule.
    """
    if not module.automatic_optimization:
        raise ValueError(
            "HeteroBatchCallback needs automatic optimization (`self.automatic_optimization = False` found): it "
            "weights each rank's loss in Lightning's automatic backward, whose steps it also times; use automatic "
            "optimization, or train without the callback."
        )
    strategy = trainer.strategy
    if trainer.world_size > 1 and not isinstance(strategy, (DDPStrategy, HeteroBatchStrategy)):
        raise ValueError(
            f"HeteroBatchCallback supports strategy='ddp' (and strategies offering HeteroBatchStrategy), "
            f"not {type(strategy).__name__}"
        )
