"""Splitting a total into integer shares, and the step-time arithmetic behind every split in the package.

Pure arithmetic, no torch. A rank's step is modelled as a *cost line* ``t_k(b) = a_k + c_k·b``: a fixed overhead
``a_k`` plus ``b`` samples at ``c_k`` seconds each (equivalently at throughput ``X_k = 1 / c_k``). A synchronous step
lasts as long as its slowest rank. :func:`apportion` equalises the predicted step times of integer shares that sum
to a total; HeteroBatch's controller splits the global batch with it, local SGD its rounds' steps, and the sampler an
epoch's last, shorter batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def apportion(
    weights: Sequence[float],
    total: int,
    lower: Sequence[int],
    upper: Sequence[int],
    offsets: Sequence[float] | None = None,
) -> list[int]:
    """Split ``total`` into integers ``≈ clip(w_k·(T - offset_k), lower_k, upper_k)`` that sum to ``total``.

    Without offsets the split is proportional to ``weights``. Ranks with equal weights, offsets and bounds get
    sizes that differ by at most one, and a larger weight never gets a smaller size under the same bounds and
    offsets.

    Example::

        >>> apportion([1.0, 1.0, 2.0], total=10, lower=[1, 1, 1], upper=[10, 10, 10])
        [3, 2, 5]
        >>> apportion([1.0, 9.0], total=20, lower=[1, 1], upper=[20, 12])  # rank 1 capped, excess to rank 0
        [8, 12]
        >>> apportion([1.0, 1.0], total=20, lower=[1, 1], upper=[20, 20], offsets=[0.0, 4.0])  # rank 1 pays 4 more
        [12, 8]
    """
    n = len(weights)
    if not n or len(lower) != n or len(upper) != n:
        raise ValueError("weights, lower and upper must be non-empty and of equal length")
    if any(lo > hi for lo, hi in zip(lower, upper, strict=True)):
        raise ValueError(f"every lower bound must be <= its upper bound, got lower={list(lower)} upper={list(upper)}")
    if not sum(lower) <= total <= sum(upper):
        raise ValueError(f"cannot split {total} within bounds summing to [{sum(lower)}, {sum(upper)}]")
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"weights must be finite and non-negative, got {list(weights)}")
    if max(weights) <= 1e-12:
        weights = [1.0] * n
    # A zero-weight rank grows only once every other rank is at its upper bound.
    floor_weight = max(weights) * 1e-9
    weights = [max(w, floor_weight) for w in weights]

    offsets = [0.0] * n if offsets is None else [float(a) for a in offsets]
    if len(offsets) != n or any(not math.isfinite(a) or a < 0 for a in offsets):
        raise ValueError(f"offsets must be one finite, non-negative value per rank, got {offsets}")

    def filled(level: float) -> list[float]:
        return [min(max(w * (level - a), lo), hi) for w, a, lo, hi in zip(weights, offsets, lower, upper, strict=True)]

    # sum(filled(level)) is non-decreasing in level: bisect for the level that fills exactly `total`.
    low, high = 0.0, max(offsets) + 1.0
    while sum(filled(high)) < total:
        high *= 2.0
    for _ in range(200):
        if high - low <= 1e-12 * high:
            break
        mid = (low + high) / 2.0
        if sum(filled(mid)) < total:
            low = mid
        else:
            high = mid
    targets = filled(high)

    # Round down, then hand out the remaining samples one at a time to the rank whose predicted step time after
    # taking it is smallest (greedy is optimal for this min-max problem: every rank's time grows with its batch).
    sizes = [min(max(math.floor(x), lo), hi) for x, lo, hi in zip(targets, lower, upper, strict=True)]

    def time_with(k: int, size: int) -> float:
        return offsets[k] + size / weights[k]

    deficit = total - sum(sizes)
    while deficit > 0:
        k = min((k for k in range(n) if sizes[k] < upper[k]), key=lambda k: (time_with(k, sizes[k] + 1), k))
        sizes[k] += 1
        deficit -= 1
    while deficit < 0:
        k = max((k for k in range(n) if sizes[k] > lower[k]), key=lambda k: (time_with(k, sizes[k]), -k))
        sizes[k] -= 1
        deficit += 1
    return sizes


def step_time_s(
    sizes: Sequence[int], throughputs: Sequence[float], overheads_s: Sequence[float] | None = None
) -> float:
    """A synchronous step lasts as long as its slowest rank: ``max_k a_k + b_k / X_k``.

    Example::

        >>> step_time_s([16, 16], [100.0, 25.0])
        0.64
        >>> step_time_s([16, 16], [100.0, 25.0], overheads_s=[0.5, 0.0])
        0.66
    """
    return max(rate_times_s(sizes, throughputs, overheads_s))


def order_by_speed(
    sizes: Sequence[int], step_times_s: Sequence[float], lower: Sequence[int], upper: Sequence[int]
) -> tuple[int, ...]:
    """Swap sizes until no rank that is faster (a shorter predicted step at a common batch size) has fewer samples.

    A min-max split of crossing cost lines can hand a slower rank more samples than a faster one; a noisy fit can do
    it too. Swapping keeps the multiset of sizes (so the sum) and is skipped only when a rank's bounds forbid it.

    Example::

        >>> order_by_speed([40, 24], step_times_s=[0.02, 0.01], lower=[1, 1], upper=[64, 64])
        (24, 40)
        >>> order_by_speed([40, 24], step_times_s=[0.02, 0.01], lower=[1, 1], upper=[64, 30])  # rank 1 capped at 30
        (40, 24)
    """
    sizes = list(sizes)
    n = len(sizes)
    swapped = True
    while swapped:
        swapped = False
        for i in range(n):
            for j in range(n):
                faster = step_times_s[i] < step_times_s[j] * (1 - 1e-9)
                if (
                    faster
                    and sizes[i] < sizes[j]
                    and lower[i] <= sizes[j] <= upper[i]
                    and lower[j] <= sizes[i] <= upper[j]
                ):
                    sizes[i], sizes[j] = sizes[j], sizes[i]
                    swapped = True
    return tuple(sizes)


def line_times_s(sizes: Sequence[float], costs: Sequence[tuple[float, float]]) -> tuple[float, ...]:
    """Each rank's predicted seconds per step on its cost line, ``overhead_s + per_sample_s x size``.

    Args:
        sizes: one batch size per rank.
        costs: one ``(overhead_s, per_sample_s)`` per rank.

    Example::

        >>> line_times_s([16, 32], [(0.004, 0.001), (0.0, 0.0005)])
        (0.02, 0.016)
    """
    return tuple(a + c * b for b, (a, c) in zip(sizes, costs, strict=True))


def rate_times_s(
    sizes: Sequence[float], throughputs: Sequence[float], overheads_s: Sequence[float] | None = None
) -> tuple[float, ...]:
    """Each rank's predicted seconds per step from its throughput, ``a_k + b_k / X_k`` (the same cost line).

    Args:
        sizes: one batch size per rank.
        throughputs: samples per second per rank.
        overheads_s: fixed seconds per step per rank (default: none).

    Example::

        >>> rate_times_s([16, 16], [100.0, 25.0], overheads_s=[0.5, 0.0])
        (0.66, 0.64)
    """
    overheads_s = overheads_s or [0.0] * len(sizes)
    return tuple(a + b / x for b, x, a in zip(sizes, throughputs, overheads_s, strict=True))


def rate_share(rates: Sequence[float | None], rank: int) -> float | None:
    """Rank ``rank``'s share of the ranks' summed throughput; ``None`` while any rate is unknown (or not positive).

    Args:
        rates: samples per second per rank (``None``: not measured yet).
        rank: the rank whose share is asked.

    Example::

        >>> rate_share([300.0, 100.0], 1), rate_share([300.0, None], 0)
        (0.25, None)
    """
    if not all(rate is not None and rate > 0 for rate in rates):
        return None
    return float(rates[rank]) / sum(rates)  # type: ignore[arg-type]
