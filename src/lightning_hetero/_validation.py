"""Checks shared by the public constructors: bad settings fail at construction with a message naming them."""

from __future__ import annotations

import math
from numbers import Integral, Real


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


def check_range(
    name: str,
    value: float | None,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    optional: bool = False,
) -> None:
    """Reject a setting outside ``[low, high]`` (or an open end where ``low_open`` / ``high_open``), naming it.

    The value must also be a finite real number (as :func:`check_finite` asks), an integer where ``integer`` is set
    (bools excluded), and may be ``None`` only where ``optional`` is set. The message states the accepted range in
    the notation of the docs: ``>= 1``, ``> 0``, ``in [0, 1)``, with ``or None`` for an optional setting.

    Args:
        name: the setting's name as the user wrote it (``"max_staleness"``, ``"PSAdvanced(server_shards=...)"``).
        value: the value given.
        low: the smallest accepted value, or ``None`` for no lower bound.
        high: the largest accepted value, or ``None`` for no upper bound.
        low_open: ``low`` itself is rejected.
        high_open: ``high`` itself is rejected.
        integer: only integers are accepted.
        optional: ``None`` is accepted.

    Raises:
        ValueError: the value is out of range, not finite, not an integer where one is needed, or ``None`` where
            the setting is not optional.

    Example::

        >>> check_range("max_staleness", 3, low=0, integer=True, optional=True)
        >>> check_range("max_staleness", None, low=0, integer=True, optional=True)
        >>> check_range("max_staleness", -1, low=0, integer=True, optional=True)
        Traceback (most recent call last):
        ...
        ValueError: max_staleness must be an integer >= 0 or None, got -1
        >>> check_range("momentum", 1.0, low=0, high=1, high_open=True)
        Traceback (most recent call last):
        ...
        ValueError: momentum must be in [0, 1), got 1.0
        >>> check_range("fault_timeout_s", float("nan"), low=0, low_open=True)
        Traceback (most recent call last):
        ...
        ValueError: fault_timeout_s must be > 0, got nan
    """
    if value is None and optional:
        return
    kind = "an integer " if integer else ""
    if low is not None and high is not None:
        accepted = f"{kind}in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    elif low is not None:
        accepted = f"{kind}{'>' if low_open else '>='} {low}"
    elif high is not None:
        accepted = f"{kind}{'<' if high_open else '<='} {high}"
    else:
        accepted = "an integer" if integer else "a finite number"
    accepted += " or None" if optional else ""
    fails = (
        value is None
        or isinstance(value, bool)
        or not isinstance(value, Real)
        or not math.isfinite(value)
        or (integer and not isinstance(value, Integral))
        or (low is not None and (value <= low if low_open else value < low))
        or (high is not None and (value >= high if high_open else value > high))
    )
    if fails:
        raise ValueError(f"{name} must be {accepted}, got {value!r}")
