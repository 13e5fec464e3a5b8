"""Checks shared by the public constructors: bad settings fail at construction with a message naming them."""

from __future__ import annotations

import math
from numbers import Real


def check_finite(**settings: float | None) -> None:
    """Reject settings that are not finite real numbers (NaN, infinities, non-numbers), naming the first such.

    ``None`` passes (optional settings), so do bools' neighbours ``int`` and ``float``; range checks stay with each
    constructor, which can then rely on ordinary comparisons (NaN compares false with everything, so a check like
    ``value < 0`` lets it through).

    Args:
        settings: ``name=value`` for each setting to check.

    Raises:
        ValueError: a setting is NaN, infinite or not a real number.

    Example::

        >>> check_finite(deadband=0.05, smoothing=None)
        >>> check_finite(deadband=float("nan"))
        Traceback (most recent call last):
        ...
        ValueError: deadband must be a finite number, got nan
        >>> check_finite(fault_timeout_s=float("inf"))
        Traceback (most recent call last):
        ...
        ValueError: fault_timeout_s must be a finite number, got inf
    """
    for name, value in settings.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
