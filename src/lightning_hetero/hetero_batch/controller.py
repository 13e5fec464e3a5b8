"""The batch-size controller: per-rank batch sizes proportional to measured throughput.

Pure arithmetic with no torch.distributed in it. Every rank feeds it the same all-gathered throughputs and so
reaches the same decision.

The split keeps the global batch exactly constant: real-valued targets ``x_k = clip(λ·X_k, lo_k, hi_k)`` with ``λ``
chosen so that they sum to the global batch (bounded proportional allocation: a rank clipped at its bound hands
its excess to the others in proportion to their throughput), then largest-remainder rounding to integers that sum
to the global batch exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def apportion(weights: Sequence[float], total: int, lower: Sequence[int], upper: Sequence[int]) -> list[int]:
    """Split ``total`` into integers proportional to ``weights`` within ``[lower, upper]``, summing to ``total``.

    Ranks with equal weights and equal bounds get sizes that differ by at most one, and a larger weight never gets
    a smaller size than a smaller weight under the same bounds.

    Example::

        >>> apportion([1.0, 1.0, 2.0], total=10, lower=[1, 1, 1], upper=[10, 10, 10])
        [3, 2, 5]
        >>> apportion([1.0, 9.0], total=20, lower=[1, 1], upper=[20, 12])  # rank 1 capped, excess to rank 0
        [8, 12]
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
    if sum(weights) <= 0:
        weights = [1.0] * n
    # A zero-weight rank grows only once every other rank is at its upper bound.
    floor_weight = max(weights) * 1e-9
    weights = [max(w, floor_weight) for w in weights]

    def filled(scale: float) -> list[float]:
        return [min(max(scale * w, lo), hi) for w, lo, hi in zip(weights, lower, upper, strict=True)]

    # sum(filled(scale)) is non-decreasing in scale: bisect for the scale that fills exactly `total`.
    low, high = 0.0, 1.0
    while sum(filled(high)) < total:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if sum(filled(mid)) < total:
            low = mid
        else:
            high = mid
    targets = filled(high)

    sizes = [min(max(math.floor(x), lo), hi) for x, lo, hi in zip(targets, lower, upper, strict=True)]
    remainders = [x - s for x, s in zip(targets, sizes, strict=True)]
    by_remainder = sorted(range(n), key=lambda k: (-remainders[k], k))
    deficit = total - sum(sizes)
    while deficit > 0:
        k = next(k for k in by_remainder if sizes[k] < upper[k])
        sizes[k] += 1
        remainders[k] -= 1.0
        by_remainder = sorted(range(n), key=lambda k: (-remainders[k], k))
        deficit -= 1
    while deficit < 0:
        k = next(k for k in reversed(by_remainder) if sizes[k] > lower[k])
        sizes[k] -= 1
        remainders[k] += 1.0
        by_remainder = sorted(range(n), key=lambda k: (-remainders[k], k))
        deficit += 1
    return sizes


def step_time_s(sizes: Sequence[int], throughputs: Sequence[float]) -> float:
    """A synchronous step lasts as long as its slowest rank: ``max_k b_k / X_k``.

    Example::

        >>> step_time_s([16, 16], [100.0, 25.0])
        0.64
    """
    return max(b / x for b, x in zip(sizes, throughputs, strict=True))


@dataclass(frozen=True)
class Decision:
    """The controller's answer: the proposed split, and whether it differs enough from the current one to apply."""

    sizes: tuple[int, ...]
    relative_change: float
    apply: bool


class BatchSizeController:
    """Proportional per-rank batch sizes with bounds, a constant global batch and a cluster-wide deadband.

    Args:
        global_batch_size: the sum of all ranks' batch sizes, kept exactly constant.
        world_size: number of ranks.
        min_batch_size: smallest batch a rank may get (an int for all ranks, or one per rank).
        max_batch_size: largest batch a rank may get (an int, one per rank, or ``None`` for no bound).
        memory_caps: optional per-rank largest batch that fits in memory; combined with ``max_batch_size``.
        deadband: a new split is applied only when some rank's size changes by more than this fraction of its
            current size, so sizes do not flap on measurement noise.

    Example::

        >>> controller = BatchSizeController(global_batch_size=64, world_size=2, min_batch_size=4, deadband=0.1)
        >>> controller.decide(current=[32, 32], throughputs=[300.0, 100.0])
        Decision(sizes=(48, 16), relative_change=0.5, apply=True)
        >>> controller.decide(current=[48, 16], throughputs=[310.0, 100.0]).apply
        False
    """

    def __init__(
        self,
        global_batch_size: int,
        world_size: int,
        min_batch_size: int | Sequence[int] = 1,
        max_batch_size: int | Sequence[int] | None = None,
        memory_caps: Sequence[int | None] | None = None,
        deadband: float = 0.05,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be positive, got {global_batch_size}")
        if deadband < 0:
            raise ValueError(f"deadband must be >= 0, got {deadband}")
        self.global_batch_size = global_batch_size
        self.world_size = world_size
        self.deadband = deadband
        self.lower = _per_rank("min_batch_size", min_batch_size, world_size, default=1)
        upper = _per_rank("max_batch_size", max_batch_size, world_size, default=global_batch_size)
        if memory_caps is not None:
            if len(memory_caps) != world_size:
                raise ValueError(f"memory_caps needs one entry per rank ({world_size}), got {len(memory_caps)}")
            upper = [hi if cap is None else min(hi, int(cap)) for hi, cap in zip(upper, memory_caps, strict=True)]
        self.upper = upper
        if sum(self.lower) > global_batch_size:
            raise ValueError(
                f"global_batch_size ({global_batch_size}) is smaller than world_size x min_batch_size "
                f"({sum(self.lower)}): lower min_batch_size or raise the global batch"
            )
        for rank, (lo, hi) in enumerate(zip(self.lower, self.upper, strict=True)):
            if lo < 1:
                raise ValueError(f"min_batch_size must be positive, got {lo} for rank {rank}")
            if lo > hi:
                raise ValueError(f"min_batch_size ({lo}) exceeds max_batch_size/memory cap ({hi}) for rank {rank}")
        if sum(self.upper) < global_batch_size:
            raise ValueError(
                f"global_batch_size ({global_batch_size}) exceeds the sum of the per-rank maxima "
                f"({sum(self.upper)}): raise max_batch_size / memory_caps or lower the global batch"
            )

    def equal_split(self) -> tuple[int, ...]:
        """The split a plain DDP job would use (equal shares, within the bounds)."""
        return tuple(apportion([1.0] * self.world_size, self.global_batch_size, self.lower, self.upper))

    def propose(self, throughputs: Sequence[float]) -> tuple[int, ...]:
        """The split proportional to ``throughputs`` (samples/s per rank), ignoring the deadband."""
        if len(throughputs) != self.world_size:
            raise ValueError(f"expected {self.world_size} throughputs, got {len(throughputs)}")
        return tuple(apportion(throughputs, self.global_batch_size, self.lower, self.upper))

    def decide(self, current: Sequence[int], throughputs: Sequence[float]) -> Decision:
        """Propose a split and say whether it clears the deadband relative to ``current``."""
        proposed = self.propose(throughputs)
        change = max(abs(new - old) / old for new, old in zip(proposed, current, strict=True))
        return Decision(sizes=proposed, relative_change=change, apply=change > self.deadband)


def _per_rank(name: str, value: int | Sequence[int] | None, world_size: int, default: int) -> list[int]:
    if value is None:
        return [default] * world_size
    if isinstance(value, int):
        return [value] * world_size
    values = [int(v) for v in value]
    if len(values) != world_size:
        raise ValueError(f"{name} needs one entry per rank ({world_size}), got {len(values)}")
    return values
