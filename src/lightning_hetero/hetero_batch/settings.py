"""The checks behind ``HeteroBatchCallback(...)``: a bad setting fails at construction, naming it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from lightning_hetero._validation import check_finite
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
        values = [value] if isinstance(value, int) else list(value or [])
        if any(v < 1 for v in values):
            raise ValueError(f"{name} must be positive, got {value}")
    if isinstance(min_batch_size, int) and isinstance(max_batch_size, int) and min_batch_size > max_batch_size:
        raise ValueError(f"min_batch_size ({min_batch_size}) must not exceed max_batch_size ({max_batch_size})")
    if global_batch_size is not None and global_batch_size < 1:
        raise ValueError(f"global_batch_size must be positive, got {global_batch_size}")
    if initial_batch_sizes is not None and any(b < 1 for b in initial_batch_sizes):
        raise ValueError(f"initial_batch_sizes must all be positive, got {list(initial_batch_sizes)}")
    if adjust_every_n_steps is not None and adjust_every_n_steps < 1:
        raise ValueError(f"adjust_every_n_steps must be a positive int or None, got {adjust_every_n_steps}")
    check_finite(deadband=deadband, smoothing=smoothing)
    if deadband < 0:
        raise ValueError(f"deadband must be >= 0, got {deadband}")
    if batch_lr_scaling is not None and batch_lr_scaling not in LR_SCALING_RULES:
        raise ValueError(f"batch_lr_scaling must be one of {LR_SCALING_RULES} or None, got {batch_lr_scaling!r}")
    for name, value in (("rollback_tolerance", rollback_tolerance), ("change_tolerance", change_tolerance)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if change_tolerance == 0:
        raise ValueError("change_tolerance must be > 0 (0 would forget every measurement each period)")
