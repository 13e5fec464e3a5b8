"""The statistics the studies report: medians that tolerate empty input, paired ratios, interleaving orders."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not ``None``; ``None`` if there are none.

    Example::

        >>> median([3.0, None, 1.0, 2.0]), median([])
        (2.0, None)
    """
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def paired_ratios(ours: Sequence[float], reference: Sequence[float]) -> list[float]:
    """Per-repeat ratios of two arms' figures (both in repeat order)."""
    return [o / r for o, r in zip(ours, reference, strict=True)]


def rotating_order(arms: Sequence[T], repeats: int) -> list[T]:
    """Each repeat runs every arm back to back; which arm goes first rotates from one repeat to the next.

    Example::

        >>> rotating_order(["a", "b"], 2)
        ['a', 'b', 'b', 'a']
    """
    return [arms[(i + j) % len(arms)] for i in range(repeats) for j in range(len(arms))]


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, worst (lowest) and best of ``values``."""
    return {"median": median(values), "worst": min(values, default=None), "best": max(values, default=None)}
