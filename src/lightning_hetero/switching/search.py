"""Sync-Switch's offline search: the smallest BSP share whose final accuracy matches full BSP.

For recurring jobs Sync-Switch profiles a few short runs and keeps the smallest share of BSP (then ASP) whose final
accuracy is as good as all-BSP training; it found 5% for ResNet-32/CIFAR-10 and 12.5% for ResNet-50/CIFAR-100 on 8
workers. :func:`search_bsp_fraction` runs that search over a user-supplied ``run(bsp_fraction) -> accuracy``, which
typically trains a shortened job with ``SyncSwitchCallback(FixedFractionPolicy(bsp_fraction))``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lightning_hetero._validation import check_range


@dataclass(frozen=True)
class SearchResult:
    """The outcome of :func:`search_bsp_fraction`.

    Args:
        bsp_fraction: the smallest BSP share found to match full BSP (1.0 when no smaller share did).
        reference_accuracy: the accuracy of the all-BSP run.
        trials: every ``(bsp_fraction, accuracy)`` evaluated, in order, the reference run first.
    """

    bsp_fraction: float
    reference_accuracy: float
    trials: tuple[tuple[float, float], ...]


def search_bsp_fraction(
    run: Callable[[float], float],
    tolerance: float = 0.005,
    min_fraction: float = 1 / 32,
    refine_steps: int = 0,
) -> SearchResult:
    """Halve the BSP share from 1.0 while the final accuracy stays within ``tolerance`` of full BSP, then optionally
    bisect between the last share that matched and the first that did not.

    Args:
        run: trains one profiling run with the given BSP share (BSP first, then ASP) and returns its final
            accuracy (any score where higher is better).
        tolerance: how far below the all-BSP accuracy a run may end and still count as matching, >= 0 (0.005 is
            half a point of accuracy).
        min_fraction: the smallest share tried by halving, in (0, 1]. With few epochs per profiling run, shares
            below one epoch round up to one epoch (see :class:`~lightning_hetero.switching.FixedFractionPolicy`).
        refine_steps: bisection steps after halving, >= 0; each costs one more run.

    Returns:
        A :class:`SearchResult`; ``run`` is called ``1 + halvings + refine_steps`` times at most.

    Notes:
        Like Sync-Switch's search this assumes accuracy does not fall as the BSP share grows; with noisy runs, make
        ``run`` average a few seeds.

    Example::

        >>> accuracy = lambda f: 0.90 if f >= 0.1 else 0.85  # matches full BSP from a 10% share up
        >>> result = search_bsp_fraction(accuracy, tolerance=0.005, refine_steps=2)
        >>> result.bsp_fraction
        0.109375
        >>> [f for f, _ in result.trials]
        [1.0, 0.5, 0.25, 0.125, 0.0625, 0.09375, 0.109375]
    """
    check_range("tolerance", tolerance, low=0)
    check_range("min_fraction", min_fraction, low=0, high=1, low_open=True)
    check_range("refine_steps", refine_steps, low=0, integer=True)
    trials: list[tuple[float, float]] = []

    def matches(fraction: float) -> bool:
        accuracy = float(run(fraction))
        trials.append((fraction, accuracy))
        return accuracy >= reference - tolerance

    reference = float(run(1.0))
    trials.append((1.0, reference))
    best, failed = 1.0, None
    fraction = 0.5
    while fraction >= min_fraction:
        if not matches(fraction):
            failed = fraction
            break
        best = fraction
        fraction /= 2
    if failed is not None:
        for _ in range(refine_steps):
            middle = (best + failed) / 2
            if matches(middle):
                best = middle
            else:
                failed = middle
    return SearchResult(bsp_fraction=best, reference_accuracy=reference, trials=tuple(trials))
